package httphost

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		hostport string
		name     string
		ip       string
		ok       bool
	}{
		{"limiterd", "limiterd", "", true},
		{"limiterd:8080", "limiterd", "", true},
		{"Limiterd.Shop.SVC:8080", "Limiterd.Shop.SVC", "", true},
		{"limiterd.shop.svc.", "limiterd.shop.svc", "", true},
		{"limiterd.shop.svc.:8080", "limiterd.shop.svc", "", true},
		{"limiterd:", "limiterd", "", true}, // RFC 3986: the port may be empty
		{"localhost", "localhost", "", true},
		{"xn--bcher-kva.example", "xn--bcher-kva.example", "", true},
		{"1e100.net", "1e100.net", "", true},
		{"127.0.0.1.nip.io", "127.0.0.1.nip.io", "", true},
		{"0x7f000001", "0x7f000001", "", true}, // a name here; a browser sends 127.0.0.1
		{"127.0.0.1", "", "127.0.0.1", true},
		{"127.0.0.1:80", "", "127.0.0.1", true},
		{"[::1]", "", "::1", true},
		{"[::1]:8080", "", "::1", true},
		{"[2001:db8::7]:", "", "2001:db8::7", true},
		{"[::ffff:127.0.0.1]", "", "::ffff:127.0.0.1", true},
		{"[fe80::1%25eth0]:8080", "", "fe80::1%25eth0", true},

		{"", "", "", false},
		{":8080", "", "", false},
		{".", "", "", false},
		{"limiterd..", "", "", false},
		{"limiterd:http", "", "", false},
		{"limiterd:80:80", "", "", false},
		{"limiterd:-1", "", "", false},
		{"::1", "", "", false},
		{"2001:db8::7", "", "", false},
		{"[::1", "", "", false},
		{"[::1]x", "", "", false},
		{"[::1]:x", "", "", false},
		{"[127.0.0.1]", "", "", false},
		{"[limiterd]", "", "", false},
		{"[]", "", "", false},
		{"lim]iterd", "", "", false},
		{"1.2.3", "", "", false},
		{"1.2.3.4.5", "", "", false},
		{"127.000.0.1", "", "", false},
		{"256.0.0.1:80", "", "", false},
		{"1234", "", "", false},
	} {
		name, ip, ok := Parse(c.hostport)
		var want netip.Addr
		if c.ip != "" {
			want = netip.MustParseAddr(c.ip)
		}
		if name != c.name || ip != want || ok != c.ok {
			t.Errorf("Parse(%q) = %q, %v, %t; want %q, %v, %t", c.hostport, name, ip, ok, c.name, want, c.ok)
		}
	}
}

// TestParseAllocatesNothing: the Host of every request an API admits is parsed without
// allocating.
func TestParseAllocatesNothing(t *testing.T) {
	for _, h := range []string{"limiterd.shop.svc.cluster.local:8080", "LocalHost", "10.0.0.7:8080", "[2001:db8::7]:8080", "evil.example."} {
		if n := testing.AllocsPerRun(100, func() { _, _, _ = Parse(h) }); n != 0 {
			t.Errorf("Parse(%q) allocates %v times", h, n)
		}
	}
}

// FuzzParse holds Parse to net.SplitHostPort and netip.ParseAddr: whatever it accepts, they
// split and parse the same way; what it returns as a name is no IP address and holds no port.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"limiterd:8080", "limiterd.", "[::1]:80", "127.0.0.1", "::1", "[127.0.0.1]", "1.2.3", "a..", "[fe80::1%25x]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, hostport string) {
		name, ip, ok := Parse(hostport)
		if !ok {
			if name != "" || ip.IsValid() {
				t.Fatalf("Parse(%q) = %q, %v, false: not zero", hostport, name, ip)
			}
			return
		}
		if (name != "") == ip.IsValid() {
			t.Fatalf("Parse(%q) = %q, %v: neither or both of a name and an IP", hostport, name, ip)
		}
		// The host as net.SplitHostPort sees it (brackets removed), for a Host with a port or
		// without.
		host, port, err := net.SplitHostPort(hostport)
		if err != nil {
			host, port, err = net.SplitHostPort(hostport + ":0")
		}
		if err != nil {
			t.Fatalf("Parse(%q) accepted what net.SplitHostPort refuses: %v", hostport, err)
		}
		if strings.Trim(port, "0123456789") != "" {
			t.Fatalf("Parse(%q) accepted the port %q", hostport, port)
		}
		if ip.IsValid() {
			if want, err := netip.ParseAddr(host); err != nil || want != ip {
				t.Fatalf("Parse(%q) = %v; netip.ParseAddr(%q) = %v, %v", hostport, ip, host, want, err)
			}
			if ip.Is6() != strings.HasPrefix(hostport, "[") {
				t.Fatalf("Parse(%q) = %v: IPv6 only in brackets", hostport, ip)
			}
			return
		}
		if name != strings.TrimSuffix(host, ".") || strings.HasPrefix(hostport, "[") {
			t.Fatalf("Parse(%q) = name %q; the host is %q", hostport, name, host)
		}
		if _, err := netip.ParseAddr(name); err == nil {
			t.Fatalf("Parse(%q) = name %q, an IP address", hostport, name)
		}
	})
}
