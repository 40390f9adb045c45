package policy

import (
	"errors"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// ForwardedRequest holds what a gateway says of the request it asks about, in one of two forms:
//
//   - a forward-auth request (nginx, Traefik, Caddy): Header, Peer and Method are the
//     forward-auth request's own; the original request's host, method and path are in its
//     X-Forwarded-Host, X-Forwarded-Method and X-Forwarded-Uri (or X-Original-URI) fields;
//   - an Envoy ext_authz check (Checked not nil): Envoy reports the original request's
//     headers, host, method and path itself, and Peer is the address of Envoy's peer (the
//     client, or the last proxy in front of Envoy). X-Forwarded-Host, X-Forwarded-Method,
//     X-Forwarded-Uri and X-Original-URI are then never read: they are whatever the client
//     sent. X-Forwarded-For is read as from a forward-auth request (Envoy appends its peer
//     to it under use_remote_address).
//
// A forward-auth request may also carry the original request's target in its own path: Envoy's
// HTTP ext_authz sends the original method, Host and path (after its path_prefix) as its own.
// Target is then not empty, Host and Method are the original request's, and X-Forwarded-Host,
// X-Forwarded-Method, X-Forwarded-Uri and X-Original-URI are never read either.
//
// The same key sources read either form, in the same way otherwise.
type ForwardedRequest struct {
	// Header is the forward-auth request's header, with canonical keys (as net/http gives it).
	Header http.Header
	// Peer is the address of the peer that sent the forward-auth request, or that Envoy's
	// ext_authz reports as the request's source; invalid when unknown.
	Peer netip.Addr
	// Method is the method of the forward-auth request, which some gateways (nginx) give the
	// same as the original request's; X-Forwarded-Method takes precedence.
	Method string
	// Target, when not empty, is the original request's target (path and query) as the
	// forward-auth request's own path holds it; Host and Method are then the original
	// request's, and the X-Forwarded-* fields but X-Forwarded-For are not read.
	Target string
	// Host is the forward-auth request's Host, read only when Target is not empty.
	Host string
	// Checked, when not nil, is what Envoy's ext_authz reports of the request; Header and
	// Method are then not read.
	Checked *CheckedRequest
}

// CheckedRequest is what Envoy's ext_authz reports of a request (CheckRequest
// attributes.request.http).
type CheckedRequest struct {
	// Headers are the request's header fields, by lower-case name (as Envoy sends them: a
	// name in another case is never found), each with one value: Envoy joins a field given
	// several times into one value, separated by commas.
	Headers map[string]string
	// Host, Method and Path are the request's own (:authority, :method, :path); Path may hold
	// a query.
	Host, Method, Path string
}

// Errors of KeyExtractor.AppendKey: the request is refused, and nothing is charged.
var (
	// ErrHeaderTooLarge: a header the key is read from is longer than
	// v1alpha1.MaxGatewayHeaderBytes.
	ErrHeaderTooLarge = errors.New("header too large")
	// ErrHeaderRepeated: a header the key is read from is given more than once, so which value
	// names the client is ambiguous.
	ErrHeaderRepeated = errors.New("header given more than once")
	// ErrMalformedJWT: a JWTClaim source's header holds a token that is not a JSON Web Token
	// in JWS compact form whose payload is a JSON object naming the claim at most once (see
	// the rules at decodeJWTPayload and findClaim). The gateway verified the token, so this is
	// its mistake or the policy's (the wrong header), shown rather than keyed.
	ErrMalformedJWT = errors.New("malformed JWT: want three base64url segments whose payload is a JSON object (in UTF-8) naming each name of the claim's path at most once")
)

// KeyExtractor derives a forwarded request's client key from a policy's spec.gateway: its key
// sources, compiled once (header names canonicalised, key prefixes built), tried in order.
// It is immutable and safe for concurrent use.
type KeyExtractor struct {
	sources []keySource
	// MissingKey says what happens to a request from which no source yields a key.
	MissingKey v1alpha1.MissingKey
}

type keySource struct {
	typ    v1alpha1.KeySourceType
	header string   // canonical key of the header to read: the source's own, or X-Forwarded-*
	lower  string   // header in lower case: its name in an ext_authz check
	prefix string   // the start of the key: "header:<name in lower case>:", "ip:", ...
	hops   int      // ClientAddress: trusted entries of X-Forwarded-For
	segs   int      // Path: leading segments; 0 for the whole path
	claim  []string // JWTClaim: the names of the claim's path
	bearer bool     // JWTClaim: the header is Authorization, holding "Bearer <token>"
}

// headerAuthorization is the canonical key of the default header of a JWTClaim source.
const headerAuthorization = "Authorization"

// Canonical keys of the headers the gateways send.
const (
	headerXForwardedFor    = "X-Forwarded-For"
	headerXForwardedHost   = "X-Forwarded-Host"
	headerXForwardedMethod = "X-Forwarded-Method"
	headerXForwardedURI    = "X-Forwarded-Uri"
	headerXOriginalURI     = "X-Original-Uri"
)

// compileGateway compiles a validated spec.gateway.
func compileGateway(g *v1alpha1.Gateway) *KeyExtractor {
	x := &KeyExtractor{MissingKey: g.MissingKey, sources: make([]keySource, len(g.KeySources))}
	if x.MissingKey == "" {
		x.MissingKey = v1alpha1.DefaultMissingKey
	}
	for i, s := range g.KeySources {
		ks := keySource{typ: s.Type}
		switch s.Type {
		case v1alpha1.KeySourceHeader:
			ks.header = textproto.CanonicalMIMEHeaderKey(s.Header)
			ks.prefix = "header:" + strings.ToLower(s.Header) + ":"
		case v1alpha1.KeySourceClientAddress:
			ks.header, ks.prefix, ks.hops = headerXForwardedFor, "ip:", v1alpha1.DefaultTrustedHops
			if s.TrustedHops != nil {
				ks.hops = int(*s.TrustedHops)
			}
		case v1alpha1.KeySourceHost:
			ks.header, ks.prefix = headerXForwardedHost, "host:"
		case v1alpha1.KeySourceMethod:
			ks.header, ks.prefix = headerXForwardedMethod, "method:"
		case v1alpha1.KeySourcePath:
			ks.header, ks.prefix, ks.segs = headerXForwardedURI, "path:", int(s.PathSegments)
		case v1alpha1.KeySourceJWTClaim:
			ks.header = headerAuthorization
			if s.Header != "" {
				ks.header = textproto.CanonicalMIMEHeaderKey(s.Header)
			}
			ks.bearer = ks.header == headerAuthorization
			ks.claim = slices.Clone(s.JWTClaimPath()) // the extractor is immutable: not the spec's slice
			ks.prefix = "jwt:" + strings.ToLower(ks.header) + ":" + claimKeyName(ks.claim) + ":"
		}
		ks.lower = strings.ToLower(ks.header)
		x.sources[i] = ks
	}
	return x
}

// AppendKey appends the client key of r to dst, from the first key source that yields one,
// and reports whether one did. It fails, appending nothing, when a header a source reads before
// yielding a key is over v1alpha1.MaxGatewayHeaderBytes (ErrHeaderTooLarge), given twice
// (ErrHeaderRepeated), or holds a malformed token for a JWTClaim source (ErrMalformedJWT); headers of the sources after the one that yields are not read. It
// allocates nothing when dst has room for the key.
func (x *KeyExtractor) AppendKey(dst []byte, r *ForwardedRequest) ([]byte, bool, error) {
	for i := range x.sources {
		s := &x.sources[i]
		var (
			out []byte
			ok  bool
			err error
		)
		switch s.typ {
		case v1alpha1.KeySourceHeader, v1alpha1.KeySourceHost, v1alpha1.KeySourceMethod:
			out, ok, err = s.appendValue(dst, r)
		case v1alpha1.KeySourceClientAddress:
			out, ok, err = s.appendClientAddress(dst, r)
		case v1alpha1.KeySourcePath:
			out, ok, err = s.appendPath(dst, r)
		case v1alpha1.KeySourceJWTClaim:
			out, ok, err = s.appendJWT(dst, r)
		}
		if err != nil {
			return dst, false, err
		}
		if ok {
			return out, true, nil
		}
	}
	return dst, false, nil
}

// single returns the one value of header name, "" when it is absent.
func single(h http.Header, name string) (string, error) {
	v := h[name]
	switch {
	case len(v) == 0:
		return "", nil
	case len(v) > 1:
		return "", &HeaderError{Name: name, Err: ErrHeaderRepeated}
	case len(v[0]) > v1alpha1.MaxGatewayHeaderBytes:
		return "", &HeaderError{Name: name, Err: ErrHeaderTooLarge}
	}
	return v[0], nil
}

// bounded returns v, the value of the header name of an ext_authz check, unless it is over
// v1alpha1.MaxGatewayHeaderBytes.
func bounded(v, name string) (string, error) {
	if len(v) > v1alpha1.MaxGatewayHeaderBytes {
		return "", &HeaderError{Name: name, Err: ErrHeaderTooLarge}
	}
	return v, nil
}

// HeaderError says which header made a forwarded request unusable, and why.
type HeaderError struct {
	Name string
	Err  error
}

func (e *HeaderError) Error() string { return e.Name + ": " + e.Err.Error() }

func (e *HeaderError) Unwrap() error { return e.Err }

// appendValue yields a header's value: the source's own header, X-Forwarded-Host (in lower
// case) or X-Forwarded-Method (else the forward-auth request's method); of a request with a
// Target, its own Host (in lower case) and method. The forward-auth request's own method is
// held to v1alpha1.MaxGatewayHeaderBytes like a header, as an ext_authz check's :method is.
func (s *keySource) appendValue(dst []byte, r *ForwardedRequest) ([]byte, bool, error) {
	var (
		v   string
		err error
	)
	switch c := r.Checked; {
	case c == nil && r.Target != "" && s.typ == v1alpha1.KeySourceHost:
		v, err = bounded(r.Host, "Host")
	case c == nil && r.Target != "" && s.typ == v1alpha1.KeySourceMethod:
		v, err = bounded(r.Method, "method")
	case c == nil:
		if v, err = single(r.Header, s.header); v == "" && err == nil && s.typ == v1alpha1.KeySourceMethod {
			v, err = bounded(r.Method, "method")
		}
	case s.typ == v1alpha1.KeySourceHost:
		v, err = bounded(c.Host, ":authority")
	case s.typ == v1alpha1.KeySourceMethod:
		v, err = bounded(c.Method, ":method")
	default:
		v, err = bounded(c.Headers[s.lower], s.lower)
	}
	if err != nil {
		return dst, false, err
	}
	if v == "" {
		return dst, false, nil
	}
	dst = append(dst, s.prefix...)
	if s.typ == v1alpha1.KeySourceHost {
		for i := 0; i < len(v); i++ {
			c := v[i]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			dst = append(dst, c)
		}
		return dst, true, nil
	}
	return append(dst, v...), true, nil
}

// appendJWT yields the claim of the token in the source's header (see jwt.go): nothing when
// the header is absent or holds no token, ErrMalformedJWT when the token is malformed.
func (s *keySource) appendJWT(dst []byte, r *ForwardedRequest) ([]byte, bool, error) {
	var (
		v   string
		err error
	)
	name := s.header // as the other errors of the form name it
	if r.Checked != nil {
		name = s.lower
		v, err = bounded(r.Checked.Headers[s.lower], s.lower)
	} else {
		v, err = single(r.Header, s.header)
	}
	if err != nil {
		return dst, false, err
	}
	token, ok := s.jwtToken(v)
	if !ok {
		return dst, false, nil
	}
	out, found, ok := appendJWTClaim(dst, s.prefix, token, s.claim)
	if !ok {
		return dst, false, &HeaderError{Name: name, Err: ErrMalformedJWT}
	}
	return out, found, nil
}

// appendPath yields the path of r.Target, else of X-Forwarded-Uri, else of X-Original-URI (of
// an ext_authz check: its path), without its query or fragment, cut after s.segs segments when s.segs > 0.
func (s *keySource) appendPath(dst []byte, r *ForwardedRequest) ([]byte, bool, error) {
	var (
		uri string
		err error
	)
	if r.Checked != nil {
		uri, err = bounded(r.Checked.Path, ":path")
	} else if r.Target != "" {
		uri, err = bounded(r.Target, "path")
	} else if uri, err = single(r.Header, headerXForwardedURI); uri == "" && err == nil {
		uri, err = single(r.Header, headerXOriginalURI)
	}
	if err != nil {
		return dst, false, err
	}
	if i := strings.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	if uri == "" {
		return dst, false, nil
	}
	if s.segs > 0 {
		n := 0
		for i := 1; i < len(uri); i++ {
			if uri[i] == '/' {
				if n++; n == s.segs {
					uri = uri[:i]
					break
				}
			}
		}
	}
	dst = append(dst, s.prefix...)
	return append(dst, uri...), true, nil
}

// appendClientAddress yields the entry s.hops from the right of X-Forwarded-For (its lines
// read as one list, in order), or the peer's address when s.hops is 0 or the request has no
// X-Forwarded-For. Only the s.hops rightmost entries are looked at: those a client sent
// itself, to the left, are never parsed. Fewer entries than s.hops, or an entry that is no IP
// address, yield nothing.
func (s *keySource) appendClientAddress(dst []byte, r *ForwardedRequest) ([]byte, bool, error) {
	lines := r.Header[headerXForwardedFor]
	var checked [1]string
	if r.Checked != nil {
		lines = nil
		if v, ok := r.Checked.Headers[s.lower]; ok {
			checked[0] = v
			lines = checked[:]
		}
	}
	if s.hops == 0 || len(lines) == 0 {
		if !r.Peer.IsValid() {
			return dst, false, nil
		}
		return appendAddr(append(dst, s.prefix...), r.Peer), true, nil
	}
	total := 0
	for _, l := range lines {
		total += len(l)
	}
	if total > v1alpha1.MaxGatewayHeaderBytes {
		return dst, false, &HeaderError{Name: headerXForwardedFor, Err: ErrHeaderTooLarge}
	}
	seen := 0
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		// Every comma-separated entry counts, an empty one too: the entry s.hops from the
		// right is the one the trusted proxies wrote, whatever it holds.
		for end := len(l); ; {
			start := strings.LastIndexByte(l[:end], ',') + 1
			if seen++; seen == s.hops {
				addr, ok := parseForwardedAddr(strings.TrimSpace(l[start:end]))
				if !ok {
					return dst, false, nil
				}
				return appendAddr(append(dst, s.prefix...), addr), true, nil
			}
			if start == 0 {
				break
			}
			end = start - 1
		}
	}
	return dst, false, nil
}

// IPv6ClientBits is the prefix length by which a ClientAddress source keys an IPv6 client, as
// client/middleware does by default: a host is usually given a /64 and picks its addresses in
// it at will, and must not get a fresh budget with each.
const IPv6ClientBits = 64

// appendAddr appends a client's address as a key: an IPv4 address (an IPv4-mapped IPv6 one
// too) as it is, an IPv6 address as its /64 in CIDR notation ("2001:db8:1:2::/64").
func appendAddr(dst []byte, a netip.Addr) []byte {
	a = a.Unmap()
	if a.Is4() {
		return a.AppendTo(dst)
	}
	p, _ := a.WithZone("").Prefix(IPv6ClientBits)
	return p.AppendTo(dst)
}

// parseForwardedAddr parses an X-Forwarded-For entry: an IP address, optionally with a port
// ("192.0.2.1:443", "[2001:db8::1]:443") or in brackets, without a zone.
func parseForwardedAddr(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a, true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() && a.Zone() == "" {
			return a, true
		}
	}
	return netip.Addr{}, false
}
