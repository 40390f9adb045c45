package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

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
