// Package httphost parses the Host of an HTTP request, without allocating, for the checks that
// keep DNS rebinding away from limiterd's APIs: a web page can make a browser send requests to a
// name of its own that resolves to limiterd's address and read the answers, but such a request
// names that name in its Host. An IP address literal is never such a name.
package httphost

import (
	"net/netip"
	"strings"
)

// Parse splits hostport, a request's Host (RFC 9110's authority without userinfo: "host",
// "host:port", "[ipv6]" or "[ipv6]:port", the port made of digits, possibly none), and
// classifies its host without allocating:
//
//   - an IP address literal, IPv4 in dotted decimal or IPv6 in brackets (with or without a
//     zone), is returned as ip, with name empty;
//   - any other host is a name, returned as it is written (not case-folded) without one
//     trailing dot, so that "example.com." and "example.com" are one name.
//
// ok is false, and name and ip are zero, for an empty host, a port that is not digits, an IPv6
// address without brackets, brackets around anything but an IPv6 address, an empty label at a
// name's end, and a host of digits and dots only that is not an IPv4 address (browsers parse
// such a host as IPv4 and never send it). Names are otherwise not checked: a caller compares
// them with the names it knows.
func Parse(hostport string) (name string, ip netip.Addr, ok bool) {
	if strings.HasPrefix(hostport, "[") {
		end := strings.IndexByte(hostport, ']')
		if end < 0 || !isPort(hostport[end+1:]) {
			return "", netip.Addr{}, false
		}
		ip, err := netip.ParseAddr(hostport[1:end])
		if err != nil || !ip.Is6() {
			return "", netip.Addr{}, false
		}
		return "", ip, true
	}
	host := hostport
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		if !isPort(hostport[i:]) {
			return "", netip.Addr{}, false
		}
		host = hostport[:i]
	}
	if host == "" {
		return "", netip.Addr{}, false
	}
	digitsAndDots := true
	for i := 0; i < len(host); i++ {
		switch c := host[i]; {
		case c == ':' || c == '[' || c == ']':
			return "", netip.Addr{}, false
		case (c < '0' || c > '9') && c != '.':
			digitsAndDots = false
		}
	}
	if digitsAndDots {
		// Only here: ParseAddr allocates its error, and a name would always make one.
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is4() {
			return "", netip.Addr{}, false
		}
		return "", ip, true
	}
	name = strings.TrimSuffix(host, ".")
	if name == "" || strings.HasSuffix(name, ".") {
		return "", netip.Addr{}, false
	}
	return name, netip.Addr{}, true
}

// isPort reports whether s is empty or a colon followed by digits (possibly none).
func isPort(s string) bool {
	if s == "" {
		return true
	}
	if s[0] != ':' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
