// Package middleware rate-limits an http.Handler with limiterd.
//
//	c, err := client.New("http://limiterd:8080", client.WithPolicy("shop/api"))
//	...
//	// authenticate verified the caller and put its subject in the request's context.
//	subject := func(r *http.Request) (string, bool) { s, ok := r.Context().Value(subjectKey{}).(string); return s, ok && s != "" }
//	limit := middleware.New(c, middleware.KeyBy(middleware.FirstOf(middleware.Source("sub", subject), middleware.ClientIP())))
//	http.ListenAndServe(":8000", authenticate(limit(mux)))
//
// # Keys
//
// A key carries its source, so that keys from different sources never collide and a value a
// caller sends never looks like a key an operator names in a policy's overrides:
//
//	ClientIP              ip:<address>, ip:<network>/<bits>     ip:198.51.100.7, ip:2001:db8:1:2::/64
//	Header(name)          header:<name in lower case>:<value>   header:x-api-key:k-123
//	Source(source, f)     <source>:<value>                      sub:alice
//
// A value is written as it is, but for '%', control characters and bytes that are not valid
// UTF-8 (a header may carry obs-text), each written %XX (upper-case hex): distinct values give
// distinct keys, and every key can be sent to limiterd. A key of any length is decided (limiterd
// keys one over 1,024 bytes by its digest).
//
// Key by what the caller cannot choose: a subject the application verified (a token's subject,
// an API key after it was validated), or the client's address. A raw header is the caller's
// choice, so a policy must never grant a tier to header keys (nor to any key a caller picks):
// the caller would pick the key of the better tier.
//
// Over TLS (and mutual TLS), give the client the configuration:
// client.New("https://limiterd:8080", client.WithTLSConfig(cfg)).
//
// Each request is keyed (by default by its peer's IPv4 address or IPv6 /64, see KeyBy and
// ClientIP) and decided by
// limiterd before it reaches the handler. An admitted request proceeds with limiterd's
// RateLimit-Policy and RateLimit header fields set on its response. A rejected one is answered
// 429 with those fields, Retry-After and the body
//
//	{"error":"rate limited","retryAfterSeconds":N}
//
// A request for which the key function finds no key is answered 400
// {"error":"no rate-limit key"}. When limiterd is unavailable (client.Unavailable: it cannot be
// reached, does not answer in time, or answers a 5xx status), the OnError hook is told and the
// request proceeds (FailOpen(true), the default) or is answered 503
// {"error":"rate limiter unavailable"} (FailOpen(false)). Any other error — a 4xx answer (a
// malformed request, an unknown policy), an answer that is not a decision, or a key the client
// refuses (client.ErrKeyNotUTF8: a KeyFunc of your own returned bytes that are not UTF-8) — is
// told to OnError and always answered 503 {"error":"rate limiter unavailable"}: what a request
// carries must never make it pass unlimited. A request whose own context is done before limiterd
// answered is dropped without an answer.
//
// # Concurrency limits
//
// On a tier with a concurrency limit (at most N of a client's requests in flight), an admitted
// request holds its place by the decision's client.Lease while the handler runs. The middleware
// releases it when the handler returns, also when it panics (the release is deferred, and the
// panic goes on after it), and when the request's context was cancelled: the release is made
// under a context of its own, which keeps the request's values but not its cancellation,
// bounded by ReleaseTimeout. A release that fails (limiterd unavailable, the lease expired) is
// told to the OnReleaseError hook and changes nothing of the response; its places come back at
// the lease's expiry. The lease's token never reaches the response.
//
// By default the middleware does not extend leases: set the tier's leaseTimeout above the
// longest a handler runs, since a lease that expires while its handler still runs frees the
// place to another request (and its release then fails, 410). For handlers that may run
// longer, ExtendEvery extends the lease while the handler runs.
package middleware

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/limiterd/limiterd/client"
)

// KeyFunc returns the rate-limit key of a request, and false when the request has none. A key
// must be valid UTF-8: the client refuses any other (client.ErrKeyNotUTF8), and the request is
// answered 503. The key functions of this package escape what is not; a KeyFunc of your own
// that keys by binary data (a digest, raw bytes) encodes it first, e.g. with
// hex.EncodeToString or base64.RawURLEncoding.EncodeToString, or wraps it with Source.
type KeyFunc func(r *http.Request) (key string, ok bool)

// Option configures the middleware.
type Option func(*config)

type config struct {
	key            KeyFunc
	failOpen       bool
	onError        func(r *http.Request, err error)
	onReleaseError func(r *http.Request, err error)
	extendEvery    time.Duration
}

// ReleaseTimeout bounds the release of a request's lease after its handler returned (the
// Client's own timeout, WithTimeout, bounds it too).
const ReleaseTimeout = 2 * time.Second

// KeyBy keys requests with f. Default: ClientIP() (the peer's IPv4 address or IPv6 /64; no
// proxy is trusted).
// For an authenticated subject, pass Source with a func that reads it from the request (its
// context, where authentication put it after verifying the caller); FirstOf combines key
// functions.
func KeyBy(f KeyFunc) Option { return func(c *config) { c.key = f } }

// FailOpen says what happens to a request when limiterd is unavailable (client.Unavailable:
// unreachable, a timeout, a 5xx answer): it proceeds (true, the default) or is answered 503
// (false). It never covers a 4xx answer or an answer that is not a decision: those are always
// answered 503.
func FailOpen(open bool) Option { return func(c *config) { c.failOpen = open } }

// OnError is called, before FailOpen applies, for every request limiterd did not decide,
// with the error of the client package (a *client.Error for an error answer). Default: a
// warning on slog.Default.
func OnError(f func(r *http.Request, err error)) Option { return func(c *config) { c.onError = f } }

// OnReleaseError is called for every lease the middleware failed to release after the handler
// returned, and every extension of ExtendEvery that failed while it ran (see Concurrency limits
// in the package documentation), with the error of client.Release or client.Extend:
// client.Unavailable for one whose outcome is unknown, a *client.Error otherwise (409: released
// or extended before, 410: expired). The response is not changed. With ExtendEvery, f is called
// from another goroutine while the handler runs: it must be safe for concurrent use. Default: a
// warning on slog.Default.
func OnReleaseError(f func(r *http.Request, err error)) Option {
	return func(c *config) { c.onReleaseError = f }
}

// ExtendEvery makes the middleware extend an admitted request's lease (client.Client.Extend)
// every d while its handler runs, and release the newest lease when it returns. Choose d well
// below the tier's leaseTimeout (a half, say), so that a lease is extended before it expires
// even when an extension is slow; each extension is bounded by ReleaseTimeout. A failed
// extension is told to OnReleaseError: after one whose outcome is unknown
// (client.Unavailable) the same lease is tried again at the next tick; after a refusal (the
// lease expired, 410, or is no longer held, 409) extensions stop, and the lease is not
// released. Default 0: no extension.
func ExtendEvery(d time.Duration) Option { return func(c *config) { c.extendEvery = d } }

// New returns middleware that asks c, for every request, whether it may proceed.
func New(c *client.Client, opts ...Option) func(http.Handler) http.Handler {
	cfg := config{key: ClientIP(), failOpen: true, onError: logError, onReleaseError: logReleaseError}
	for _, o := range opts {
		o(&cfg)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, ok := cfg.key(r)
			if !ok {
				writeJSON(w, http.StatusBadRequest, `{"error":"no rate-limit key"}`)
				return
			}
			d, err := c.Allow(r.Context(), key)
			if err != nil {
				if r.Context().Err() != nil {
					return // the request's client went away, or its deadline passed
				}
				cfg.onError(r, err)
				if cfg.failOpen && client.Unavailable(err) {
					next.ServeHTTP(w, r)
					return
				}
				writeJSON(w, http.StatusServiceUnavailable, `{"error":"rate limiter unavailable"}`)
				return
			}
			h := w.Header()
			if d.RateLimitPolicy != "" {
				h.Set("RateLimit-Policy", d.RateLimitPolicy)
			}
			if d.RateLimit != "" {
				h.Set("RateLimit", d.RateLimit)
			}
			if d.Allowed {
				if d.Lease.Token != "" {
					// Deferred, so that a panicking handler releases too; the panic goes on.
					defer hold(c, &cfg, r, d.Lease)()
				}
				next.ServeHTTP(w, r)
				return
			}
			retry := strconv.FormatInt(retryAfterSeconds(d.RetryAfter), 10)
			h.Set("Retry-After", retry)
			writeJSON(w, http.StatusTooManyRequests, `{"error":"rate limited","retryAfterSeconds":`+retry+`}`)
		})
	}
}

// hold starts extending lease every cfg.extendEvery, if set, and returns the func that stops
// extending it and releases it: the newest lease, unless an extension was refused.
func hold(c *client.Client, cfg *config, r *http.Request, lease client.Lease) (done func()) {
	if cfg.extendEvery <= 0 {
		return func() { release(c, cfg, r, lease) }
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	held := true
	go func() {
		defer close(stopped)
		tick := time.NewTicker(cfg.extendEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), ReleaseTimeout)
			next, err := c.Extend(ctx, lease)
			cancel()
			switch {
			case err == nil:
				lease = next
			case client.Unavailable(err):
				cfg.onReleaseError(r, err)
			default: // refused: the lease is no longer held
				cfg.onReleaseError(r, err)
				held = false
				return
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped // lease and held are the goroutine's until it is done
		if held {
			release(c, cfg, r, lease)
		}
	}
}

// release ends the lease of request r after its handler returned, under a context that keeps
// r's values but not its cancellation (the request may be gone; its places must still come
// back), bounded by ReleaseTimeout. A failure is told to the hook.
func release(c *client.Client, cfg *config, r *http.Request, lease client.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), ReleaseTimeout)
	defer cancel()
	if err := c.Release(ctx, lease); err != nil {
		cfg.onReleaseError(r, err)
	}
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return max(1, s)
}

func logError(r *http.Request, err error) {
	slog.Default().WarnContext(r.Context(), "rate limit check failed", "method", r.Method, "path", r.URL.Path, "error", err)
}

func logReleaseError(r *http.Request, err error) {
	slog.Default().WarnContext(r.Context(), "lease release failed", "method", r.Method, "path", r.URL.Path, "error", err)
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body + "\n"))
}

// Header keys requests by the value of a request header field: the key is
// "header:<name in lower case>:<value>", the value escaped (see the package documentation). A
// request without the field (or with an empty value) has no key.
//
// A header is whatever the caller sends: key by it only to limit each value on its own, never to
// give chosen values a tier (key by a verified subject instead, with Source).
func Header(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return sourced("header:"+strings.ToLower(name), func(r *http.Request) (string, bool) {
		v := r.Header.Get(name)
		return v, v != ""
	})
}

// Source keys requests by value(r) from the named source: the key is "<source>:<value>", the
// value escaped (see the package documentation); a request for which value finds none (false,
// or "") has no key. Name the source after what the value is, e.g. "sub" for the subject the
// application verified, "apikey" for an API key it validated, so that a policy's overrides can
// name "sub:alice".
//
// source is 1 to 63 lower-case letters, digits and '-', starting with a letter, other than
// "header" and "ip" (the sources of Header and ClientIP); Source panics otherwise, as a
// constant of the program that is wrong.
func Source(source string, value func(r *http.Request) (string, bool)) KeyFunc {
	if !validSource(source) {
		panic(fmt.Sprintf("middleware: source %q is not 1 to 63 of [a-z0-9-] starting with a letter, or is reserved (header, ip)", source))
	}
	return sourced(source, value)
}

// validSource reports whether a source name is allowed by Source.
func validSource(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] < 'a' || s[0] > 'z' || s == "header" || s == "ip" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// sourced keys requests by value(r) under source, unchecked.
func sourced(source string, value func(r *http.Request) (string, bool)) KeyFunc {
	prefix := source + ":"
	return func(r *http.Request) (string, bool) {
		v, ok := value(r)
		if !ok || v == "" {
			return "", false
		}
		return appendEscaped([]byte(prefix), v), true
	}
}

// appendEscaped returns b followed by v with '%', control characters (below 0x20, and 0x7F)
// and every byte that is not part of valid UTF-8 written %XX. The mapping is injective: every
// '%' of the result starts an escape, and the rest is v's own bytes.
func appendEscaped(b []byte, v string) string {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(v); {
		c := v[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(v[i:])
			if r != utf8.RuneError || size > 1 {
				b = append(b, v[i:i+size]...)
				i += size
				continue
			}
		} else if c >= 0x20 && c != 0x7F && c != '%' {
			b = append(b, c)
			i++
			continue
		}
		b = append(b, '%', hexDigits[c>>4], hexDigits[c&0xF])
		i++
	}
	return string(b)
}

// FirstOf keys requests by the first of fs that finds a key, e.g.
// FirstOf(subject, ClientIP(proxies...)) limits authenticated requests per subject and the
// others per address.
func FirstOf(fs ...KeyFunc) KeyFunc {
	return func(r *http.Request) (string, bool) {
		for _, f := range fs {
			if k, ok := f(r); ok {
				return k, true
			}
		}
		return "", false
	}
}

// Default prefix lengths of the networks ClientIP keys clients by.
const (
	// DefaultIPv4Bits keys an IPv4 client by its address.
	DefaultIPv4Bits = 32
	// DefaultIPv6Bits keys an IPv6 client by its /64: the smallest network a host is usually
	// given (RFC 4291's interface identifier is 64 bits, SLAAC and privacy addresses pick them at
	// will), so that a host cannot rotate through its 2^64 addresses to fresh limits.
	DefaultIPv6Bits = 64
)

// ClientIPOptions configure ClientIPWith. The zero value trusts no proxy and keys IPv4 clients
// by address and IPv6 clients by their /64.
type ClientIPOptions struct {
	// Trusted are the prefixes of your proxies: X-Forwarded-For is read only from a peer in one
	// of them (see ClientIP).
	Trusted []netip.Prefix
	// IPv4Bits is the prefix length, 1 to 32, an IPv4 client is keyed by (0: DefaultIPv4Bits).
	IPv4Bits int
	// IPv6Bits is the prefix length, 1 to 128, an IPv6 client is keyed by (0: DefaultIPv6Bits;
	// 128 keys each address on its own).
	IPv6Bits int
}

// ClientIP keys requests by the client's network: an IPv4 client by its address, an IPv6 client
// by its /64 (ClientIPWith sets other prefix lengths). The peer (http.Request.RemoteAddr) is the
// client unless it lies in one of the trusted prefixes — a proxy of yours. Only then is
// X-Forwarded-For read, from right to left (its last field was added by the nearest proxy):
// addresses in trusted prefixes are skipped, and the first other one is the client. X-Forwarded-
// For is never read for an untrusted peer, whose header a client could have forged; nor past
// the first untrusted address. When every address is trusted, the leftmost is the client. Trust
// is decided on whole addresses, before the client is reduced to its network. A request has no
// key when the peer is not an IP address or an X-Forwarded-For field read is not one.
//
// A key is "ip:" and the client's address in canonical form when the prefix length is the
// address's ("ip:198.51.100.7"), else its network in CIDR notation ("ip:2001:db8:1:2::/64"). An
// IPv4-mapped IPv6 address (::ffff:198.51.100.7) is an IPv4 client; a zone is dropped.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	f, _ := ClientIPWith(ClientIPOptions{Trusted: trusted}) // the default lengths are valid
	return f
}

// ClientIPWith is ClientIP with the options of opts. It fails when a prefix length is out of
// range.
func ClientIPWith(opts ClientIPOptions) (KeyFunc, error) {
	v4, v6 := cmp.Or(opts.IPv4Bits, DefaultIPv4Bits), cmp.Or(opts.IPv6Bits, DefaultIPv6Bits)
	if v4 < 1 || v4 > 32 {
		return nil, fmt.Errorf("middleware: IPv4 prefix length %d out of range 1-32", opts.IPv4Bits)
	}
	if v6 < 1 || v6 > 128 {
		return nil, fmt.Errorf("middleware: IPv6 prefix length %d out of range 1-128", opts.IPv6Bits)
	}
	prefixes := make([]netip.Prefix, len(opts.Trusted))
	for i, p := range opts.Trusted {
		prefixes[i] = p.Masked()
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range prefixes {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	key := func(a netip.Addr) string {
		bits := v6
		if a.Is4() {
			bits = v4
		}
		if bits == a.BitLen() {
			return "ip:" + a.String()
		}
		p, _ := a.Prefix(bits) // bits is within the address's length
		return "ip:" + p.String()
	}
	return func(r *http.Request) (string, bool) {
		peer, ok := parseAddr(r.RemoteAddr)
		if !ok {
			return "", false
		}
		client := peer
		if !isTrusted(peer) {
			return key(client), true
		}
		fields := r.Header.Values("X-Forwarded-For")
		for i := len(fields) - 1; i >= 0; i-- {
			rest := fields[i]
			for rest != "" {
				var hop string
				if j := strings.LastIndexByte(rest, ','); j >= 0 {
					hop, rest = rest[j+1:], rest[:j]
				} else {
					hop, rest = rest, ""
				}
				hop = strings.TrimSpace(hop)
				if hop == "" {
					continue
				}
				a, ok := parseAddr(hop)
				if !ok {
					return "", false
				}
				client = a
				if !isTrusted(a) {
					return key(client), true
				}
			}
		}
		return key(client), true
	}, nil
}

// parseAddr parses an IP address, with or without a port ("10.0.0.1", "10.0.0.1:80", "::1",
// "[::1]", "[::1]:80"); a zone is dropped.
func parseAddr(s string) (netip.Addr, bool) {
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), true
}
