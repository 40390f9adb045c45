package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/client/middleware"
)

// fivePolicy is default/api: 5 requests per client, refilled by one a minute.
const fivePolicy = `
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: standard
  tiers:
    - name: standard
      algorithm: TokenBucket
      tokenBucket: {capacity: 5, refillRate: 1, refillPeriod: 1m}
`

// passed counts the requests of n that reached the handler.
func passed(t *testing.T, h http.Handler, n int, prepare func(r *http.Request)) int {
	t.Helper()
	count := 0
	for range n {
		r := httptest.NewRequest(http.MethodGet, "/orders", nil)
		r.RemoteAddr = "192.0.2.1:1"
		prepare(r)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			count++
		}
	}
	return count
}

// The measurement: a 1,025-byte X-Api-Key passed 20 of 20 requests where alice got 5.
// An over-long key is limited like any other.
func TestOverLongKeyIsLimited(t *testing.T) {
	h := middleware.New(startLimiterd(t, fivePolicy), middleware.KeyBy(middleware.Header("X-Api-Key")))(&app{})
	for _, key := range []string{"alice", strings.Repeat("k", 1025), strings.Repeat("j", 60<<10)} {
		if got := passed(t, h, 20, func(r *http.Request) { r.Header.Set("X-Api-Key", key) }); got != 5 {
			t.Errorf("X-Api-Key of %d bytes: %d of 20 passed, want 5", len(key), got)
		}
	}
}

// The shipped sample policy grants tiers only to keys a caller cannot choose: a header value
// such as svc:evil gets the default tier, a verified subject the sample names gets its tier.
func TestSamplePolicyGrantsNoTierToChosenKeys(t *testing.T) {
	sample, err := os.ReadFile("../../config/samples/ratelimitpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := startLimiterd(t, string(sample))
	byHeader := middleware.New(c, middleware.KeyBy(middleware.Header("X-Api-Key")))(&app{})
	for _, key := range []string{"svc:evil", "10.0.0.1", "partner:evil", "sub:system:serviceaccount:shop:evil", "sub:acme-corp"} {
		if got := passed(t, byHeader, 60, func(r *http.Request) { r.Header.Set("X-Api-Key", key) }); got != 20 {
			t.Errorf("X-Api-Key %q: %d of 60 passed, want the free tier's 20", key, got)
		}
	}
	bySubject := middleware.New(c, middleware.KeyBy(middleware.FirstOf(middleware.Source("sub", subject), middleware.ClientIP())))(&app{})
	verified := func(s string) func(r *http.Request) {
		return func(r *http.Request) { *r = *r.WithContext(context.WithValue(r.Context(), subjectKey{}, s)) }
	}
	if got := passed(t, bySubject, 60, verified("system:serviceaccount:shop:billing")); got != 60 {
		t.Errorf("a service account of shop: %d of 60 passed, want all (internal)", got)
	}
	if got := passed(t, bySubject, 60, verified("svc:evil")); got != 20 {
		t.Errorf("subject svc:evil: %d of 60 passed, want the free tier's 20", got)
	}
	if got := passed(t, bySubject, 60, func(*http.Request) {}); got != 20 {
		t.Errorf("anonymous: %d of 60 passed, want the free tier's 20", got)
	}
}

// subject reads the subject that authentication verified from the request's context.
func subject(r *http.Request) (string, bool) {
	s, ok := r.Context().Value(subjectKey{}).(string)
	return s, ok
}

// Keys carry their source and escape what is not printable UTF-8: no two sources or values
// collide, and every value is decided.
func TestKeysCarryTheirSource(t *testing.T) {
	header, ip, sub := middleware.Header("X-Api-Key"), middleware.ClientIP(), middleware.Source("sub", subject)
	request := func(remote, apiKey, subj string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		if apiKey != "" {
			r.Header["X-Api-Key"] = []string{apiKey}
		}
		if subj != "" {
			r = r.WithContext(context.WithValue(r.Context(), subjectKey{}, subj))
		}
		return r
	}
	for _, tc := range []struct {
		name string
		f    middleware.KeyFunc
		r    *http.Request
		want string
	}{
		{"ip", ip, request("192.0.2.7:1", "", ""), "ip:192.0.2.7"},
		{"header", header, request("192.0.2.7:1", "192.0.2.7", ""), "header:x-api-key:192.0.2.7"},
		{"header naming an ip", header, request("192.0.2.7:1", "ip:192.0.2.7", ""), "header:x-api-key:ip:192.0.2.7"},
		{"subject", sub, request("192.0.2.7:1", "", "alice"), "sub:alice"},
		{"subject with a colon", sub, request("192.0.2.7:1", "", "system:serviceaccount:a:b"), "sub:system:serviceaccount:a:b"},
		{"obs-text", header, request("192.0.2.7:1", "caf\xe9", ""), "header:x-api-key:caf%E9"},
		{"percent", header, request("192.0.2.7:1", "caf%E9", ""), "header:x-api-key:caf%25E9"},
		{"UTF-8 kept", header, request("192.0.2.7:1", "café", ""), "header:x-api-key:café"},
		{"control", sub, request("192.0.2.7:1", "", "a\tb\x7f"), "sub:a%09b%7F"},
		{"no header", header, request("192.0.2.7:1", "", ""), ""},
		{"no subject", sub, request("192.0.2.7:1", "", ""), ""},
	} {
		got, ok := tc.f(tc.r)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: %q %t, want %q", tc.name, got, ok, tc.want)
		}
	}

	// Values that are not UTF-8 are decided, each its own client.
	h := middleware.New(startLimiterd(t, fivePolicy), middleware.KeyBy(header))(&app{})
	for _, v := range []string{"\xff", "\xfe", "%FF", "\xff\xfe\x80"} {
		if got := passed(t, h, 7, func(r *http.Request) { r.Header["X-Api-Key"] = []string{v} }); got != 5 {
			t.Errorf("X-Api-Key %q: %d of 7 passed, want its own 5", v, got)
		}
	}

	for _, bad := range []string{"", "ip", "header", "Sub", "a:b", "-a", "1a", strings.Repeat("a", 64)} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Source(%q) did not panic", bad)
				}
			}()
			middleware.Source(bad, subject)
		}()
	}
}

// The measurement, through the middleware: a key function of the application's own
// that returns raw bytes (u\xff, u\xfe, u\x80 shared one budget of 2, so 2 of 3 passed). The
// client refuses such a key, and the middleware answers 503 whatever FailOpen says: the
// request never passes unlimited, and nothing is charged to the key limiterd would have read.
func TestKeyNotUTF8FailsClosed(t *testing.T) {
	c := startLimiterd(t, apiPolicy)
	raw := func(r *http.Request) (string, bool) { v := r.Header.Get("X-Raw"); return v, v != "" }
	for _, open := range []bool{true, false} {
		a := &app{}
		var hooked []error
		h := middleware.New(c, middleware.KeyBy(raw), middleware.FailOpen(open),
			middleware.OnError(func(_ *http.Request, err error) { hooked = append(hooked, err) }))(a)
		for _, key := range []string{"u\xff", "u\xfe", "u\x80"} {
			w := get(h, "192.0.2.1:1", "X-Raw", key)
			if w.Code != http.StatusServiceUnavailable || w.Body.String() != `{"error":"rate limiter unavailable"}`+"\n" {
				t.Errorf("FailOpen(%t), key %q: %d %q, want 503", open, key, w.Code, w.Body)
			}
		}
		if a.count() != 0 {
			t.Errorf("FailOpen(%t): %d of 3 requests passed, want none", open, a.count())
		}
		if len(hooked) != 3 {
			t.Fatalf("FailOpen(%t): the hook was told %d errors, want 3", open, len(hooked))
		}
		for _, err := range hooked {
			if !errors.Is(err, client.ErrKeyNotUTF8) {
				t.Errorf("FailOpen(%t): the hook was told %v, want client.ErrKeyNotUTF8", open, err)
			}
		}
	}
	// Nothing reached limiterd: the key all three would have become still has its budget.
	h := middleware.New(c, middleware.KeyBy(raw))(&app{})
	if got := passed(t, h, 3, func(r *http.Request) { r.Header.Set("X-Raw", "u\uFFFD") }); got != 2 {
		t.Errorf("X-Raw %q: %d of 3 passed, want its own 2", "u\uFFFD", got)
	}
}
