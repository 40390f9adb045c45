package policy_test

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/policy"
)

func gatewayPolicy(t testing.TB, g *v1alpha1.Gateway) *policy.Policy {
	t.Helper()
	p, err := policy.Compile(&v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "gw"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "all",
			Tiers:       []v1alpha1.Tier{{Name: "all", Algorithm: v1alpha1.AlgorithmUnlimited}},
			Gateway:     g,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func hops(n int32) *int32 { return &n }

func TestCompileWithoutGateway(t *testing.T) {
	if p := gatewayPolicy(t, nil); p.Gateway != nil {
		t.Errorf("a policy without spec.gateway compiled a key extractor")
	}
	p := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHost}}})
	if p.Gateway == nil || p.Gateway.MissingKey != v1alpha1.MissingKeyReject {
		t.Errorf("gateway %+v, want missingKey Reject by default", p.Gateway)
	}
}

func TestKeyExtraction(t *testing.T) {
	peer := netip.MustParseAddr("10.1.2.3")
	for _, tc := range []struct {
		name    string
		sources []v1alpha1.KeySource
		header  http.Header
		method  string
		want    string // "" for none
		err     error
	}{
		{"header", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "x-api-KEY"}},
			http.Header{"X-Api-Key": {"k1"}}, "", "header:x-api-key:k1", nil},
		{"header absent", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}},
			http.Header{}, "", "", nil},
		{"header empty", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}},
			http.Header{"X-Api-Key": {""}}, "", "", nil},
		{"header repeated", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}},
			http.Header{"X-Api-Key": {"a", "b"}}, "", "", policy.ErrHeaderRepeated},
		{"header too large", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}},
			http.Header{"X-Api-Key": {strings.Repeat("k", v1alpha1.MaxGatewayHeaderBytes+1)}}, "", "", policy.ErrHeaderTooLarge},
		{"header at its bound", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}},
			http.Header{"X-Api-Key": {strings.Repeat("k", v1alpha1.MaxGatewayHeaderBytes)}}, "",
			"header:x-api-key:" + strings.Repeat("k", v1alpha1.MaxGatewayHeaderBytes), nil},
		{"header value that looks like an address", []v1alpha1.KeySource{
			{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}, {Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Api-Key": {"ip:192.0.2.1"}}, "", "header:x-api-key:ip:192.0.2.1", nil},
		{"falls through to the address", []v1alpha1.KeySource{
			{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}, {Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Forwarded-For": {"192.0.2.1"}}, "", "ip:192.0.2.1", nil},
		{"one hop: the rightmost entry", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Forwarded-For": {"203.0.113.9, 192.0.2.1"}}, "", "ip:192.0.2.1", nil},
		{"two hops", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)}},
			http.Header{"X-Forwarded-For": {"203.0.113.9, 192.0.2.1, 10.0.0.5"}}, "", "ip:192.0.2.1", nil},
		{"two hops over two lines", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)}},
			http.Header{"X-Forwarded-For": {"203.0.113.9, 192.0.2.1", "10.0.0.5"}}, "", "ip:192.0.2.1", nil},
		{"fewer entries than hops", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(3)}},
			http.Header{"X-Forwarded-For": {"192.0.2.1, 10.0.0.5"}}, "", "", nil},
		{"trusted entry not an address", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Forwarded-For": {"192.0.2.1, unknown"}}, "", "", nil},
		{"trusted entry empty", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Forwarded-For": {"192.0.2.1,"}}, "", "", nil},
		{"address with port, IPv6, mapped", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(3)}},
			http.Header{"X-Forwarded-For": {"[2001:DB8::1]:443, ::ffff:192.0.2.1, 192.0.2.2:80"}}, "", "ip:2001:db8::/64", nil},
		{"mapped address", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)}},
			http.Header{"X-Forwarded-For": {"[2001:DB8::1]:443, ::ffff:192.0.2.1, 192.0.2.2:80"}}, "", "ip:192.0.2.1", nil},
		{"IPv6 by its /64", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Forwarded-For": {"2001:db8:1:2:aaaa:bbbb:cccc:dddd"}}, "", "ip:2001:db8:1:2::/64", nil},
		{"no X-Forwarded-For: the peer", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress}},
			http.Header{}, "", "ip:10.1.2.3", nil},
		{"zero hops: the peer", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(0)}},
			http.Header{"X-Forwarded-For": {"192.0.2.1"}}, "", "ip:10.1.2.3", nil},
		{"X-Forwarded-For too large", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Forwarded-For": {strings.Repeat("1.1.1.1,", 600) + "192.0.2.1"}}, "", "", policy.ErrHeaderTooLarge},
		{"host in lower case", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHost}},
			http.Header{"X-Forwarded-Host": {"API.Example.com"}}, "", "host:api.example.com", nil},
		{"method forwarded", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceMethod}},
			http.Header{"X-Forwarded-Method": {"POST"}}, "GET", "method:POST", nil},
		{"method of the request", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceMethod}},
			http.Header{}, "DELETE", "method:DELETE", nil},
		{"whole path without query", []v1alpha1.KeySource{{Type: v1alpha1.KeySourcePath}},
			http.Header{"X-Forwarded-Uri": {"/api/v1/users/7?x=1"}}, "", "path:/api/v1/users/7", nil},
		{"path prefix", []v1alpha1.KeySource{{Type: v1alpha1.KeySourcePath, PathSegments: 2}},
			http.Header{"X-Forwarded-Uri": {"/api/v1/users/7"}}, "", "path:/api/v1", nil},
		{"path shorter than its prefix", []v1alpha1.KeySource{{Type: v1alpha1.KeySourcePath, PathSegments: 3}},
			http.Header{"X-Forwarded-Uri": {"/api/v1?q"}}, "", "path:/api/v1", nil},
		{"nginx's X-Original-URI", []v1alpha1.KeySource{{Type: v1alpha1.KeySourcePath, PathSegments: 1}},
			http.Header{"X-Original-Uri": {"/shop/cart"}}, "", "path:/shop", nil},
		{"nothing", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHost}, {Type: v1alpha1.KeySourcePath}},
			http.Header{}, "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: tc.sources}).Gateway
			key, ok, err := x.AppendKey(nil, &policy.ForwardedRequest{Header: tc.header, Peer: peer, Method: tc.method})
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if ok != (tc.want != "") || string(key) != tc.want {
				t.Errorf("key %q (%v), want %q", key, ok, tc.want)
			}
		})
	}
}

// TestForgedForwardedForKeepsTheTrustedEntry: a client that sends its own X-Forwarded-For,
// naming another client, still gets the key of the entry the trusted proxies wrote, whatever
// it puts to the left.
func TestForgedForwardedForKeepsTheTrustedEntry(t *testing.T) {
	x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
		{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)}}}).Gateway
	for _, forged := range []string{"", "192.0.2.99", "192.0.2.99, 192.0.2.98", "garbage,,", strings.Repeat("192.0.2.99,", 50)} {
		// The client sends forged; its load balancer appends the client's address, the gateway
		// the balancer's.
		xff := "198.51.100.7, 10.0.0.5"
		if forged != "" {
			xff = forged + ", " + xff
		}
		key, ok, err := x.AppendKey(nil, &policy.ForwardedRequest{Header: http.Header{"X-Forwarded-For": {xff}}})
		if err != nil || !ok || string(key) != "ip:198.51.100.7" {
			t.Errorf("X-Forwarded-For %q: key %q, %v, %v; want ip:198.51.100.7", xff, key, ok, err)
		}
	}
}

func TestKeyExtractionAllocatesNothing(t *testing.T) {
	x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
		{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"},
		{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)},
	}}).Gateway
	buf := make([]byte, 0, 256)
	for _, r := range []*policy.ForwardedRequest{
		{Header: http.Header{"X-Api-Key": {"k1"}}},
		{Header: http.Header{"X-Forwarded-For": {"203.0.113.9, 2001:db8::7, 10.0.0.5"}}},
	} {
		if n := testing.AllocsPerRun(100, func() { _, _, _ = x.AppendKey(buf[:0], r) }); n != 0 {
			t.Errorf("%v: %v allocations, want 0", r.Header, n)
		}
	}
}

func BenchmarkKeyExtraction(b *testing.B) {
	for _, bc := range []struct {
		name    string
		sources []v1alpha1.KeySource
		header  http.Header
	}{
		{"Header", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}},
			http.Header{"X-Api-Key": {"0123456789abcdef0123456789abcdef"}, "User-Agent": {"curl/8"}, "Accept": {"*/*"}}},
		{"ClientAddress", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)}},
			http.Header{"X-Forwarded-For": {"203.0.113.9, 198.51.100.7, 10.0.0.5"}, "User-Agent": {"curl/8"}}},
		{"ClientAddressIPv6", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Forwarded-For": {"2001:db8:85a3::8a2e:370:7334"}}},
		{"HeaderMissingThenAddress", []v1alpha1.KeySource{
			{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}, {Type: v1alpha1.KeySourceClientAddress}},
			http.Header{"X-Forwarded-For": {"198.51.100.7"}}},
		{"PathPrefix", []v1alpha1.KeySource{{Type: v1alpha1.KeySourcePath, PathSegments: 2}},
			http.Header{"X-Forwarded-Uri": {"/api/v1/users/7?expand=orders"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			x := gatewayPolicy(b, &v1alpha1.Gateway{KeySources: bc.sources}).Gateway
			r := &policy.ForwardedRequest{Header: bc.header, Method: http.MethodGet}
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			for b.Loop() {
				var ok bool
				buf, ok, _ = x.AppendKey(buf[:0], r)
				if !ok {
					b.Fatal("no key")
				}
			}
		})
	}
}

// FuzzClientAddress holds the X-Forwarded-For reader to a model: split every line on commas,
// take the entry trustedHops from the right of all of them, and key it if it is an address.
func FuzzClientAddress(f *testing.F) {
	f.Add("203.0.113.9, 192.0.2.1", "10.0.0.5", uint8(2))
	f.Add("[2001:db8::1]:443,,", "", uint8(1))
	f.Add(" , ::ffff:1.2.3.4 ", "fe80::1%eth0", uint8(3))
	f.Fuzz(func(t *testing.T, line1, line2 string, h uint8) {
		n := int32(h%v1alpha1.MaxTrustedHops) + 1
		x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
			{Type: v1alpha1.KeySourceClientAddress, TrustedHops: &n}}}).Gateway
		lines := []string{line1}
		if line2 != "" {
			lines = append(lines, line2)
		}
		key, ok, err := x.AppendKey(nil, &policy.ForwardedRequest{Header: http.Header{"X-Forwarded-For": lines}})
		if len(line1)+len(line2) > v1alpha1.MaxGatewayHeaderBytes {
			if !errors.Is(err, policy.ErrHeaderTooLarge) {
				t.Fatalf("%d bytes: %v, want ErrHeaderTooLarge", len(line1)+len(line2), err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var entries []string
		for _, l := range lines {
			entries = append(entries, strings.Split(l, ",")...)
		}
		want := ""
		if int(n) <= len(entries) {
			if a, ok := entryAddr(strings.TrimSpace(entries[len(entries)-int(n)])); ok {
				a = a.Unmap()
				if a.Is4() {
					want = "ip:" + a.String()
				} else {
					p, _ := a.Prefix(policy.IPv6ClientBits)
					want = "ip:" + p.String()
				}
			}
		}
		if got := string(key); ok != (want != "") || got != want {
			t.Fatalf("X-Forwarded-For %q, hops %d: key %q (%v), want %q", lines, n, got, ok, want)
		}
	})
}

// entryAddr is the grammar of an X-Forwarded-For entry: an address, an address and a port, or
// an IPv6 address in brackets; never with a zone.
func entryAddr(e string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(e); err == nil && a.Zone() == "" {
		return a, true
	}
	if ap, err := netip.ParseAddrPort(e); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr(), true
	}
	if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
		if a, err := netip.ParseAddr(e[1 : len(e)-1]); err == nil && a.Is6() && a.Zone() == "" {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// checkedPair returns the same request as a forward-auth request (the original request's host,
// method and path in X-Forwarded-* fields) and as an Envoy ext_authz check.
func checkedPair(apiKey, xff, host, method, path string) (forwarded, checked *policy.ForwardedRequest) {
	forwarded = &policy.ForwardedRequest{Header: http.Header{
		"X-Api-Key": {apiKey}, "X-Forwarded-For": {xff}, "X-Forwarded-Host": {host},
		"X-Forwarded-Method": {method}, "X-Forwarded-Uri": {path},
	}, Peer: netip.MustParseAddr("10.0.0.1")}
	checked = &policy.ForwardedRequest{Checked: &policy.CheckedRequest{
		Headers: map[string]string{"x-api-key": apiKey, "x-forwarded-for": xff},
		Host:    host, Method: method, Path: path,
	}, Peer: netip.MustParseAddr("10.0.0.1")}
	return forwarded, checked
}

// TestCheckedRequestIgnoresForwardedFields: an ext_authz check's host, method and path are its
// own, whatever X-Forwarded-* fields the client sent; its header names are lower case.
func TestCheckedRequestIgnoresForwardedFields(t *testing.T) {
	r := &policy.ForwardedRequest{
		Header: http.Header{"X-Api-Key": {"ignored"}}, Method: "IGNORED",
		Checked: &policy.CheckedRequest{Headers: map[string]string{
			"x-forwarded-host": "forged", "x-forwarded-method": "FORGED", "x-forwarded-uri": "/forged", "x-original-uri": "/forged",
			"X-Api-Key": "not lower case",
		}, Host: "Shop.Example", Method: "GET", Path: "/a/b/c?q"},
	}
	for typ, want := range map[v1alpha1.KeySourceType]string{
		v1alpha1.KeySourceHost: "host:shop.example", v1alpha1.KeySourceMethod: "method:GET", v1alpha1.KeySourcePath: "path:/a/b/c",
		v1alpha1.KeySourceHeader: "",
	} {
		s := v1alpha1.KeySource{Type: typ}
		if typ == v1alpha1.KeySourceHeader {
			s.Header = "X-Api-Key"
		}
		x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{s}}).Gateway
		key, ok, err := x.AppendKey(nil, r)
		if err != nil || ok != (want != "") || string(key) != want {
			t.Errorf("%s: %q %v %v, want %q", typ, key, ok, err, want)
		}
	}
}

func TestCheckedKeyExtractionAllocatesNothing(t *testing.T) {
	x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
		{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"},
		{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)},
	}}).Gateway
	buf := make([]byte, 0, 256)
	for _, r := range []*policy.ForwardedRequest{
		{Checked: &policy.CheckedRequest{Headers: map[string]string{"x-api-key": "k1"}}},
		{Checked: &policy.CheckedRequest{Headers: map[string]string{"x-forwarded-for": "203.0.113.9, 2001:db8::7, 10.0.0.5"}}},
	} {
		if n := testing.AllocsPerRun(100, func() { _, _, _ = x.AppendKey(buf[:0], r) }); n != 0 {
			t.Errorf("%v: %v allocations, want 0", r.Checked.Headers, n)
		}
	}
}

// targetForm is the forward-auth request Envoy's HTTP ext_authz sends for the request of
// checkedPair: its own method and Host are the original's, and its path holds the original
// target after the policy's name (the server gives Target, which always begins with '/').
// The X-Forwarded-* fields other than X-Forwarded-For are forged: a client sent them, and no
// source may read them.
func targetForm(apiKey, xff, host, method, target string) *policy.ForwardedRequest {
	return &policy.ForwardedRequest{Header: http.Header{
		"X-Api-Key": {apiKey}, "X-Forwarded-For": {xff}, "X-Forwarded-Host": {"forged.example"},
		"X-Forwarded-Method": {"FORGED"}, "X-Forwarded-Uri": {"/forged"}, "X-Original-Uri": {"/forged"},
	}, Peer: netip.MustParseAddr("10.0.0.1"), Method: method, Host: host, Target: target}
}

// FuzzCheckedMatchesForwarded holds the three forms of a request to one answer: every key
// source derives the same key (or the same error) from an ext_authz check as from the
// forward-auth request that carries its host, method and path in X-Forwarded-* fields, and as
// from the forward-auth request of Envoy's HTTP ext_authz, which carries them as its own
// method, Host and path suffix (Target).
func FuzzCheckedMatchesForwarded(f *testing.F) {
	f.Add("k1", "203.0.113.9, 192.0.2.1", "Shop.Example", "GET", "/api/v1/users?x", uint8(1), uint8(2))
	f.Add("", "[2001:db8::1]:443,,", "", "", "", uint8(0), uint8(0))
	f.Add(strings.Repeat("k", 5000), " , ::ffff:1.2.3.4 ", "h", "M", "/a#b", uint8(3), uint8(1))
	f.Add(token(`{"sub":"a"}`, "AA"), "", "", "", "", uint8(0), uint8(0))
	f.Add("k", "192.0.2.1", "h.example", "POST", "/a/%2F/../b?deny=403", uint8(1), uint8(3))
	f.Add("k", "", strings.Repeat("h", 5000), strings.Repeat("M", 5000), "/"+strings.Repeat("p", 5000), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, apiKey, xff, host, method, path string, h, segs uint8) {
		n := int32(h % (v1alpha1.MaxTrustedHops + 1))
		for _, s := range []v1alpha1.KeySource{
			{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"},
			{Type: v1alpha1.KeySourceClientAddress, TrustedHops: &n},
			{Type: v1alpha1.KeySourceHost},
			{Type: v1alpha1.KeySourceMethod},
			{Type: v1alpha1.KeySourcePath, PathSegments: int32(segs % 8)},
			{Type: v1alpha1.KeySourceJWTClaim, Header: "X-Api-Key", Claim: "sub"},
		} {
			x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{s}}).Gateway
			forwarded, checked := checkedPair(apiKey, xff, host, method, path)
			fk, fok, ferr := x.AppendKey(nil, forwarded)
			ck, cok, cerr := x.AppendKey(nil, checked)
			if string(fk) != string(ck) || fok != cok || errors.Is(ferr, policy.ErrHeaderTooLarge) != errors.Is(cerr, policy.ErrHeaderTooLarge) || (ferr == nil) != (cerr == nil) {
				t.Fatalf("%s: forward-auth %q %v %v, ext_authz %q %v %v", s.Type, fk, fok, ferr, ck, cok, cerr)
			}
			// The target form's path always begins with '/' (the server cuts it from its own
			// path, at the '/' after the name), so the check it matches has that path.
			target := path
			if !strings.HasPrefix(target, "/") {
				target = "/" + target
			}
			_, checked = checkedPair(apiKey, xff, host, method, target)
			tk, tok, terr := x.AppendKey(nil, targetForm(apiKey, xff, host, method, target))
			ck, cok, cerr = x.AppendKey(nil, checked)
			if string(tk) != string(ck) || tok != cok || errors.Is(terr, policy.ErrHeaderTooLarge) != errors.Is(cerr, policy.ErrHeaderTooLarge) || (terr == nil) != (cerr == nil) {
				t.Fatalf("%s: forward-auth with target %q: %q %v %v, ext_authz %q %v %v", s.Type, target, tk, tok, terr, ck, cok, cerr)
			}
		}
	})
}

// BenchmarkCheckedKeyExtraction is BenchmarkKeyExtraction for an Envoy ext_authz check, whose
// headers are a map of lower-case names.
func BenchmarkCheckedKeyExtraction(b *testing.B) {
	for _, bc := range []struct {
		name    string
		sources []v1alpha1.KeySource
		headers map[string]string
	}{
		{"Header", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}},
			map[string]string{"x-api-key": "0123456789abcdef0123456789abcdef", "user-agent": "curl/8", "accept": "*/*"}},
		{"ClientAddress", []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: hops(2)}},
			map[string]string{"x-forwarded-for": "203.0.113.9, 198.51.100.7, 10.0.0.5", "user-agent": "curl/8"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			x := gatewayPolicy(b, &v1alpha1.Gateway{KeySources: bc.sources}).Gateway
			r := &policy.ForwardedRequest{Checked: &policy.CheckedRequest{Headers: bc.headers, Method: http.MethodGet, Host: "h", Path: "/"}}
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			for b.Loop() {
				var ok bool
				buf, ok, _ = x.AppendKey(buf[:0], r)
				if !ok {
					b.Fatal("no key")
				}
			}
		})
	}
}

// TestForwardAuthMethodIsBounded: the forward-auth request's own method, which the Method
// source reads from Envoy's HTTP ext_authz (Target set) and without X-Forwarded-Method, is held
// to the bound of a header, as an ext_authz check's :method is: not a key of any length.
func TestForwardAuthMethodIsBounded(t *testing.T) {
	x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceMethod}}}).Gateway
	long := strings.Repeat("M", v1alpha1.MaxGatewayHeaderBytes+1)
	for name, r := range map[string]*policy.ForwardedRequest{
		"target":                {Header: http.Header{}, Method: long, Host: "h", Target: "/a"},
		"no X-Forwarded-Method": {Header: http.Header{}, Method: long},
		"ext_authz":             {Checked: &policy.CheckedRequest{Method: long, Path: "/a"}},
	} {
		key, ok, err := x.AppendKey(nil, r)
		if !errors.Is(err, policy.ErrHeaderTooLarge) || ok || len(key) != 0 {
			t.Errorf("%s: %d-byte key, %v, %v; want ErrHeaderTooLarge", name, len(key), ok, err)
		}
	}
	r := &policy.ForwardedRequest{Header: http.Header{}, Method: long[:v1alpha1.MaxGatewayHeaderBytes], Host: "h", Target: "/a"}
	if key, ok, err := x.AppendKey(nil, r); err != nil || !ok || string(key) != "method:"+r.Method {
		t.Errorf("method of %d bytes: %d-byte key, %v, %v", len(r.Method), len(key), ok, err)
	}
}
