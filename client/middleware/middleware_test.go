package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/client/middleware"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/server"
)

// apiPolicy is default/api: 2 requests per client, then one a second.
const apiPolicy = `
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: standard
  tiers:
    - name: standard
      algorithm: TokenBucket
      tokenBucket:
        capacity: 2
        refillRate: 1
`

// startLimiterd serves limiterd's real decisions API for a policy file on a clock that never
// moves, until the test ends; it returns a client of it.
func startLimiterd(tb testing.TB, policies string, opts ...client.Option) *client.Client {
	tb.Helper()
	c, stop, err := newLimiterd(policies, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	return c
}

// newLimiterd serves limiterd's real decisions API for a policy file on a clock that never
// moves; it returns a client of it and the func that stops the server.
func newLimiterd(policies string, opts ...client.Option) (*client.Client, func(), error) {
	docs, err := v1alpha1.DecodePolicies([]byte(policies))
	if err != nil {
		return nil, nil, err
	}
	var compiled []*policy.Policy
	for i := range docs {
		p, err := policy.Compile(&docs[i])
		if err != nil {
			return nil, nil, err
		}
		compiled = append(compiled, p)
	}
	set, err := policy.NewSet(compiled...)
	if err != nil {
		return nil, nil, err
	}
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	e := engine.New(engine.Options{Clock: func() time.Time { return now }})
	e.Swap(set)
	srv := httptest.NewServer(server.NewDecisions(e, nil))
	c, err := client.New(srv.URL, opts...)
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	return c, srv.Close, nil
}

// app is the limited handler: it counts its calls and answers "hello".
type app struct {
	mu    sync.Mutex
	calls int
}

func (a *app) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	a.calls++
	a.mu.Unlock()
	_, _ = io.WriteString(w, "hello")
}

func (a *app) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

func get(h http.Handler, remoteAddr string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/orders", nil)
	r.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestAdmitsThenRejects(t *testing.T) {
	a := &app{}
	h := middleware.New(startLimiterd(t, apiPolicy))(a)
	for i, want := range []struct {
		status                int
		rateLimit, retryAfter string
		body                  string
	}{
		{200, `"standard";r=1;t=1`, "", "hello"},
		{200, `"standard";r=0;t=2`, "", "hello"},
		{429, `"standard";r=0;t=2`, "1", `{"error":"rate limited","retryAfterSeconds":1}` + "\n"},
	} {
		w := get(h, "192.0.2.7:4711")
		if w.Code != want.status || w.Body.String() != want.body {
			t.Fatalf("request %d: %d %q, want %d %q", i, w.Code, w.Body, want.status, want.body)
		}
		if got := w.Header().Get("RateLimit-Policy"); got != `"standard";q=2;w=2` {
			t.Errorf("request %d: RateLimit-Policy %q", i, got)
		}
		if got := w.Header().Get("RateLimit"); got != want.rateLimit {
			t.Errorf("request %d: RateLimit %q, want %q", i, got, want.rateLimit)
		}
		if got := w.Header().Get("Retry-After"); got != want.retryAfter {
			t.Errorf("request %d: Retry-After %q, want %q", i, got, want.retryAfter)
		}
	}
	if a.count() != 2 {
		t.Errorf("the handler ran %d times, want 2", a.count())
	}
	// Another address has its own quota.
	if w := get(h, "192.0.2.8:4711"); w.Code != 200 {
		t.Errorf("another address: %d", w.Code)
	}
}

func TestKeyByHeaderAndNoKey(t *testing.T) {
	a := &app{}
	h := middleware.New(startLimiterd(t, apiPolicy), middleware.KeyBy(middleware.Header("x-api-key")))(a)
	for range 2 {
		if w := get(h, "192.0.2.1:1", "X-Api-Key", "k1"); w.Code != 200 {
			t.Fatalf("k1: %d", w.Code)
		}
	}
	// k1 is spent, whatever the address; k2 is not.
	if w := get(h, "192.0.2.2:1", "X-Api-Key", "k1"); w.Code != 429 {
		t.Errorf("k1 from another address: %d, want 429", w.Code)
	}
	if w := get(h, "192.0.2.1:1", "X-Api-Key", "k2"); w.Code != 200 {
		t.Errorf("k2: %d, want 200", w.Code)
	}
	w := get(h, "192.0.2.1:1")
	if w.Code != 400 || w.Body.String() != `{"error":"no rate-limit key"}`+"\n" || w.Header().Get("Content-Type") != "application/json" {
		t.Errorf("no key: %d %q %q", w.Code, w.Body, w.Header())
	}
}

func TestKeyBySubjectFirst(t *testing.T) {
	subject := func(r *http.Request) (string, bool) {
		s, ok := r.Context().Value(subjectKey{}).(string)
		return "user:" + s, ok
	}
	a := &app{}
	h := middleware.New(startLimiterd(t, apiPolicy),
		middleware.KeyBy(middleware.FirstOf(subject, middleware.ClientIP())))(a)
	authed := func(user string) int {
		r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(context.WithValue(t.Context(), subjectKey{}, user))
		r.RemoteAddr = "192.0.2.1:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if got := []int{authed("ann"), authed("ann"), authed("ann")}; !slices.Equal(got, []int{200, 200, 429}) {
		t.Errorf("ann's quota is not her own: %v, want [200 200 429]", got)
	}
	// The address of ann's requests was never charged.
	if w := get(h, "192.0.2.1:1"); w.Code != 200 {
		t.Errorf("anonymous from ann's address: %d, want 200", w.Code)
	}
}

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("192.0.2.1/32")}
	key := middleware.ClientIP(trusted...)
	for _, tc := range []struct {
		name   string
		remote string
		xff    []string
		want   string // "": no key
	}{
		{"untrusted peer", "203.0.113.5:1234", nil, "ip:203.0.113.5"},
		{"untrusted peer's XFF is ignored", "203.0.113.5:1234", []string{"198.51.100.1"}, "ip:203.0.113.5"},
		{"trusted peer, no XFF", "10.1.2.3:80", nil, "ip:10.1.2.3"},
		{"trusted peer, client in XFF", "10.1.2.3:80", []string{"198.51.100.1"}, "ip:198.51.100.1"},
		{"forged entries left of the real client", "10.1.2.3:80", []string{"1.1.1.1, 2.2.2.2, 198.51.100.1, 10.9.9.9"}, "ip:198.51.100.1"},
		{"several XFF lines are one list", "10.1.2.3:80", []string{"1.1.1.1, 198.51.100.1", "10.0.0.2 , 10.0.0.1"}, "ip:198.51.100.1"},
		{"all trusted: the leftmost", "10.1.2.3:80", []string{"10.0.0.5, 10.0.0.6"}, "ip:10.0.0.5"},
		{"empty fields are skipped", "10.1.2.3:80", []string{"198.51.100.1,, ", ""}, "ip:198.51.100.1"},
		{"garbage where the client should be", "10.1.2.3:80", []string{"198.51.100.1, unknown"}, ""},
		{"garbage left of the client is not read", "10.1.2.3:80", []string{"unknown, 198.51.100.1"}, "ip:198.51.100.1"},
		{"XFF with ports and brackets", "[fd00::1]:443", []string{"[2001:db8::1]:5555, 10.0.0.1:80"}, "ip:2001:db8::/64"},
		{"IPv6 bracketed without port", "[fd00::1]:443", []string{"[2001:db8:0:7::2]"}, "ip:2001:db8:0:7::/64"},
		{"IPv4-mapped peer", "[::ffff:203.0.113.9]:1", nil, "ip:203.0.113.9"},
		{"IPv4-mapped trusted peer", "[::ffff:10.0.0.1]:1", []string{"198.51.100.2"}, "ip:198.51.100.2"},
		{"zone dropped", "[fe80::1%eth0]:1", nil, "ip:fe80::/64"},
		{"IPv6 peer: its /64", "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:1", nil, "ip:2001:db8:1:2::/64"},
		{"IPv4-mapped in XFF", "10.1.2.3:80", []string{"::ffff:198.51.100.4"}, "ip:198.51.100.4"},
		{"peer without port", "203.0.113.5", nil, "ip:203.0.113.5"},
		{"host /32 trusted", "192.0.2.1:1", []string{"198.51.100.3"}, "ip:198.51.100.3"},
		{"neighbour of a /32 is not", "192.0.2.2:1", []string{"198.51.100.3"}, "ip:192.0.2.2"},
		{"peer not an IP", "@", nil, ""},
		{"no peer", "", nil, ""},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.remote
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		got, ok := key(r)
		if ok != (tc.want != "") || got != tc.want {
			t.Errorf("%s: %q %t, want %q", tc.name, got, ok, tc.want)
		}
	}
	// Without trusted proxies, X-Forwarded-For is never read.
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.1.2.3:80"
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	if got, _ := middleware.ClientIP()(r); got != "ip:10.1.2.3" {
		t.Errorf("no trusted proxy: %q, want the peer", got)
	}
	// Prefixes with host bits set are masked.
	if got, _ := middleware.ClientIP(netip.MustParsePrefix("10.1.2.3/8"))(r); got != "ip:198.51.100.1" {
		t.Errorf("10.1.2.3/8 trusted: %q, want the forwarded client", got)
	}
}

// TestClientIPNetworks keys clients by the configured prefix lengths: a host that owns a /64
// cannot rotate through its addresses to fresh limits.
func TestClientIPNetworks(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	for _, tc := range []struct {
		name   string
		v4, v6 int
		remote string
		xff    string
		want   string
	}{
		{"default: IPv4 per address", 0, 0, "203.0.113.5:1", "", "ip:203.0.113.5"},
		{"default: IPv6 per /64", 0, 0, "[2001:db8:1:2::1]:1", "", "ip:2001:db8:1:2::/64"},
		{"default: same /64, other host bits", 0, 0, "[2001:db8:1:2:ffff:ffff:ffff:fffe]:1", "", "ip:2001:db8:1:2::/64"},
		{"default: next /64", 0, 0, "[2001:db8:1:3::1]:1", "", "ip:2001:db8:1:3::/64"},
		{"default: IPv4-mapped is IPv4", 0, 0, "[::ffff:203.0.113.5]:1", "", "ip:203.0.113.5"},
		{"/48", 0, 48, "[2001:db8:1:2::1]:1", "", "ip:2001:db8:1::/48"},
		{"/128: per address", 0, 128, "[2001:db8:1:2::1]:1", "", "ip:2001:db8:1:2::1"},
		{"IPv4 /24", 24, 0, "203.0.113.5:1", "", "ip:203.0.113.0/24"},
		{"IPv4 /24 applies to IPv4-mapped", 24, 0, "[::ffff:203.0.113.5]:1", "", "ip:203.0.113.0/24"},
		{"IPv4 /32 explicit", 32, 0, "203.0.113.5:1", "", "ip:203.0.113.5"},
		{"IPv6 bits leave IPv4 alone", 0, 48, "203.0.113.5:1", "", "ip:203.0.113.5"},
		// Trust is decided on whole addresses: the proxy's network is not the client's.
		{"trusted IPv6 proxy, IPv6 client", 0, 0, "[2001:db8:ffff::1]:1", "2001:db8:5:6::9", "ip:2001:db8:5:6::/64"},
		{"trusted IPv6 proxy, IPv4-mapped client", 24, 0, "[2001:db8:ffff::1]:1", "::ffff:198.51.100.9", "ip:198.51.100.0/24"},
		{"trusted IPv4 proxy, IPv6 client behind two proxies", 0, 0, "10.0.0.1:1", "2001:db8:5:6::9, 2001:db8:ffff:1::2", "ip:2001:db8:5:6::/64"},
		{"untrusted peer in a trusted /64's neighbour", 0, 0, "[2001:db8:fffe::1]:1", "2001:db8:5:6::9", "ip:2001:db8:fffe::/64"},
		{"all trusted: the leftmost's network", 0, 0, "10.0.0.1:1", "2001:db8:ffff:1::7, 10.0.0.2", "ip:2001:db8:ffff:1::/64"},
	} {
		key, err := middleware.ClientIPWith(middleware.ClientIPOptions{Trusted: trusted, IPv4Bits: tc.v4, IPv6Bits: tc.v6})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if got, ok := key(r); !ok || got != tc.want {
			t.Errorf("%s: %q %t, want %q", tc.name, got, ok, tc.want)
		}
	}
	for _, o := range []middleware.ClientIPOptions{{IPv4Bits: -1}, {IPv4Bits: 33}, {IPv6Bits: -1}, {IPv6Bits: 129}} {
		if _, err := middleware.ClientIPWith(o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// TestIPv6HostSharesOneLimit drives the default middleware from many addresses of one /64:
// they share one client's allowance, while another /64 has its own.
func TestIPv6HostSharesOneLimit(t *testing.T) {
	a := &app{}
	h := middleware.New(startLimiterd(t, apiPolicy))(a)
	for i, want := range []int{200, 200, 429, 429} {
		if w := get(h, fmt.Sprintf("[2001:db8:1:2::%x]:443", i+1)); w.Code != want {
			t.Errorf("address %d of the /64: %d, want %d", i+1, w.Code, want)
		}
	}
	if w := get(h, "[2001:db8:1:3::1]:443"); w.Code != 200 {
		t.Errorf("another /64: %d, want 200", w.Code)
	}
}

func TestFailOpenAndClosed(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	down, err := client.New(gone.URL)
	if err != nil {
		t.Fatal(err)
	}
	misconfigured := startLimiterd(t, apiPolicy, client.WithPolicy("default/nope"))
	answering := func(status int, body string) *client.Client {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		c, err := client.New(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	failing := answering(http.StatusServiceUnavailable, `{"error":"no policy is loaded yet"}`)
	notLimiterd := answering(http.StatusOK, `<html>hello</html>`)
	malformed := answering(http.StatusBadRequest, `{"error":"key is required"}`)
	for _, tc := range []struct {
		name      string
		c         *client.Client
		open      bool
		status    int
		typedHook bool
	}{
		{"unreachable, open", down, true, 200, false},
		{"unreachable, closed", down, false, 503, false},
		{"5xx answer, open", failing, true, 200, true},
		{"5xx answer, closed", failing, false, 503, true},
		// What FailOpen does not cover is answered 503 whatever it says.
		{"404 answer, open", misconfigured, true, 503, true},
		{"404 answer, closed", misconfigured, false, 503, true},
		{"400 answer, open", malformed, true, 503, true},
		{"not a decision, open", notLimiterd, true, 503, false},
	} {
		a := &app{}
		var hooked []error
		h := middleware.New(tc.c, middleware.FailOpen(tc.open),
			middleware.OnError(func(_ *http.Request, err error) { hooked = append(hooked, err) }))(a)
		w := get(h, "192.0.2.1:1")
		if w.Code != tc.status {
			t.Errorf("%s: %d, want %d", tc.name, w.Code, tc.status)
		}
		if passed := tc.status == 200; passed != (a.count() == 1) {
			t.Errorf("%s: the handler ran %d times", tc.name, a.count())
		}
		if tc.status == 503 && w.Body.String() != `{"error":"rate limiter unavailable"}`+"\n" {
			t.Errorf("%s: body %q", tc.name, w.Body)
		}
		var e *client.Error
		if len(hooked) != 1 || errors.As(hooked[0], &e) != tc.typedHook {
			t.Errorf("%s: hook got %v, want one error (a *client.Error: %t)", tc.name, hooked, tc.typedHook)
		}
	}
}

func TestRequestGoneIsDropped(t *testing.T) {
	a := &app{}
	hooked := 0
	h := middleware.New(startLimiterd(t, apiPolicy), middleware.FailOpen(false),
		middleware.OnError(func(*http.Request, error) { hooked++ }))(a)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx)
	r.RemoteAddr = "192.0.2.1:1"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if a.count() != 0 || hooked != 0 || w.Body.Len() != 0 || len(w.Header()) != 0 {
		t.Errorf("cancelled request: handler %d, hook %d, answer %q %q; want nothing", a.count(), hooked, w.Header(), w.Body)
	}
}

func TestDefaultHookLogs(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	down, err := client.New(gone.URL)
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	var mu sync.Mutex
	prev := testingLogger(&buf, &mu)
	defer prev()
	get(middleware.New(down)(&app{}), "192.0.2.1:1")
	mu.Lock()
	defer mu.Unlock()
	if out := buf.String(); !strings.Contains(out, `"msg":"rate limit check failed"`) || !strings.Contains(out, `"path":"/orders"`) {
		t.Errorf("log: %s", out)
	}
}

// lockedWriter serialises writes to a builder.
type lockedWriter struct {
	mu  *sync.Mutex
	buf *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// testingLogger makes slog.Default write JSON to buf; the returned func restores it.
func testingLogger(buf *strings.Builder, mu *sync.Mutex) func() {
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(lockedWriter{mu: mu, buf: buf}, nil)))
	return func() { slog.SetDefault(prev) }
}
