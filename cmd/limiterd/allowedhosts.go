package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/limiterd/limiterd/limiterd/httphost"
	"github.com/limiterd/limiterd/limiterd/server"
)

// hostNames is the --allowed-hosts flag: host names, comma-separated or repeated.
type hostNames []string

func (l *hostNames) String() string { return strings.Join(*l, ",") }

// Set adds the comma-separated names of v. Each must be a DNS name (letters, digits, '-', '_'
// and dots; an IDN in its xn-- form) without a port: IP addresses are always answered, and a
// port, a scheme or a path would never match a Host.
func (l *hostNames) Set(v string) error {
	for n := range strings.SplitSeq(v, ",") {
		n = strings.TrimSpace(n)
		name, ip, ok := httphost.Parse(n)
		switch {
		case n == "":
			return errors.New("empty name")
		case ok && ip.IsValid():
			return fmt.Errorf("%q is an IP address, and IP addresses are always answered: list names only", n)
		case !ok || !isHostName(n) || len(name) > 253:
			return fmt.Errorf("%q is not a host name: give names without a port, scheme or path", n)
		}
		*l = append(*l, name)
	}
	return nil
}

// isHostName reports whether s holds only the bytes of DNS names: ASCII letters, digits, '-',
// '_' and dots.
func isHostName(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// decisionsHostCheck returns the Host check of the decisions API listening on addr, or nil for
// none (every Host answered): with names, IP addresses, localhost and names; without, on a
// loopback-only address, IP addresses and localhost, which is what clients on the host use;
// without, elsewhere, none, since the names clients use are not known.
func decisionsHostCheck(addr string, names []string) server.DecisionsOption {
	if len(names) == 0 && !isLoopback(addr) {
		return nil
	}
	return server.WithAllowedHosts(names)
}
