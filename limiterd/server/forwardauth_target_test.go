package server

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
)

func keyedBy(sources ...v1alpha1.KeySource) *v1alpha1.Gateway {
	return &v1alpha1.Gateway{KeySources: sources}
}

// TestForwardAuthOriginalTarget: in Envoy's form (/v1/forward-auth/<ns>/<name>/<original
// target>) the query is the original request's, never limiterd's deny; the Path source reads
// the target, not the client's X-Forwarded-Uri; Host and Method are the request's own.
func TestForwardAuthOriginalTarget(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(),
		gatewayPolicy("api", byAddress(1)),
		gatewayPolicy("bypath", keyedBy(v1alpha1.KeySource{Type: v1alpha1.KeySourcePath})),
		gatewayPolicy("byhost", keyedBy(v1alpha1.KeySource{Type: v1alpha1.KeySourceHost})),
		gatewayPolicy("bymethod", keyedBy(v1alpha1.KeySource{Type: v1alpha1.KeySourceMethod})),
	), nil)
	const p = "/v1/forward-auth/default/"

	// The client's ?deny=403 is its own request's query: it neither fails the check (400) nor
	// turns the rejection into 403.
	for i, want := range []int{200, 200, 429} {
		a := forward(t, h, http.MethodPost, p+"api/cart?deny=403", xff("198.51.100.7"))
		if a.status != want {
			t.Fatalf("api request %d: %d %s, want %d", i, a.status, a.body, want)
		}
		if want == 429 && (a.header.Get("Retry-After") != "60" || a.header.Get("RateLimit") != `"standard";r=0;t=120`) {
			t.Errorf("rejection: Retry-After %q RateLimit %q", a.header.Get("Retry-After"), a.header.Get("RateLimit"))
		}
	}

	// The Path source keys /a, whatever the query, and whatever X-Forwarded-Uri the client sent.
	spoof := http.Header{"X-Forwarded-Uri": {"/b"}, "X-Original-Uri": {"/b"}}
	for i, target := range []string{"a?x=1", "a?deny=429", "a"} {
		want := 200
		if i == 2 {
			want = 429
		}
		if a := forward(t, h, http.MethodGet, p+"bypath/"+target, spoof); a.status != want {
			t.Errorf("bypath %s: %d %s, want %d", target, a.status, a.body, want)
		}
	}
	if a := forward(t, h, http.MethodGet, p+"bypath/b", nil); a.status != 200 || a.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("bypath /b, its own budget: %d RateLimit %q", a.status, a.header.Get("RateLimit"))
	}
	// An escaped '/' or a dot segment is the client's path, keyed as sent: /a%2F.. is not /a.
	if a := forward(t, h, http.MethodGet, p+"bypath/a%2F..", nil); a.status != 200 {
		t.Errorf("bypath /a%%2F..: %d %s", a.status, a.body)
	}

	// Host is the request's own (Envoy forwards the original :authority as Host), in lower case;
	// X-Forwarded-Host, which only a client sets here, is not read.
	for i, host := range []string{"shop.example", "SHOP.example", "shop.example"} {
		req := httptest.NewRequest(http.MethodGet, p+"byhost/", nil)
		req.Host = host
		req.Header.Set("X-Forwarded-Host", "other"+string(rune('a'+i)))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if want := []int{200, 200, 429}[i]; rec.Code != want {
			t.Errorf("byhost %s: %d, want %d", host, rec.Code, want)
		}
	}

	// Method is the request's own; X-Forwarded-Method is not read.
	for i, m := range []string{"GET", "PUT", "DELETE"} {
		a := forward(t, h, "PATCH", p+"bymethod/", http.Header{"X-Forwarded-Method": {m}})
		if want := []int{200, 200, 429}[i]; a.status != want {
			t.Errorf("bymethod, X-Forwarded-Method %s: %d, want %d", m, a.status, want)
		}
	}
}

// TestForwardAuthTargetCannotPickPolicy: whatever the client appends after the path_prefix, the
// policy is the one the prefix names, charged for the client's own key. The policy other has a
// budget of its own, left untouched.
func TestForwardAuthTargetCannotPickPolicy(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), gatewayPolicy("api", byAddress(1)), gatewayPolicy("other", byAddress(1))), nil)
	for _, target := range []string{
		"/../other/x",
		"/../../forward-auth/default/other",
		"/%2E%2E/other",
		"//default/other",
		"/?/../other",
		"/x?../../default/other",
	} {
		raw := "GET /v1/forward-auth/default/api" + target + " HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: 198.51.100.7\r\n\r\n"
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		req.RemoteAddr = "10.0.0.1:40000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 && rec.Code != 429 {
			t.Errorf("%s: %d %s", target, rec.Code, rec.Body)
		}
	}
	// Six checks of api's budget of 2: the last four were rejected, and other's is whole.
	if a := forward(t, h, http.MethodGet, "/v1/forward-auth/default/other/x", xff("198.51.100.7")); a.status != 200 || a.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("other: %d RateLimit %q, want its budget untouched", a.status, a.header.Get("RateLimit"))
	}
	if a := forward(t, h, http.MethodGet, "/v1/forward-auth/default/api/x", xff("198.51.100.7")); a.status != 429 {
		t.Errorf("api: %d, want its budget spent", a.status)
	}
}

// FuzzForwardAuthTarget: any original target Envoy appends to the path_prefix of the policy api
// is decided under api (its RateLimit-Policy, its own budget of 3), never under another policy
// (other, of budget 5), and never refused for its query.
func FuzzForwardAuthTarget(f *testing.F) {
	for _, s := range []string{"/", "/a?deny=403", "/../other", "/%2F..%2Fother", "//x", "/a?b#c", "/a;b", "*"} {
		f.Add(s)
	}
	api := gatewayPolicy("api", byAddress(1))
	api.Spec.Tiers = []v1alpha1.Tier{testsupport.TokenBucketTier("standard", 3, 1, time.Minute)}
	h := NewDecisions(newEngine(f, testsupport.NewClock(), api, gatewayPolicy("other", byAddress(1))), nil)
	f.Fuzz(func(t *testing.T, target string) {
		if !strings.HasPrefix(target, "/") {
			return // Envoy's :path of an origin-form request begins with '/'
		}
		raw := "GET /v1/forward-auth/default/api" + target + " HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: 198.51.100.7\r\n\r\n"
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // net/http refuses it (400) before any handler
		}
		req.RemoteAddr = "10.0.0.1:40000"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 && rec.Code != 429 {
			t.Fatalf("%q: %d %s", target, rec.Code, rec.Body)
		}
		if got := rec.Header().Get("RateLimit-Policy"); got != `"standard";q=3;w=180` {
			t.Fatalf("%q: RateLimit-Policy %q, want api's", target, got)
		}
	})
}

// TestForwardAuthMethodOverBound: a Method source reads the request's own method in Envoy's form
// (and without X-Forwarded-Method in the other), held to the bound of a header: one over it is
// refused with 431 and charges nothing, not keyed as a client of its own.
func TestForwardAuthMethodOverBound(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(),
		gatewayPolicy("bymethod", keyedBy(v1alpha1.KeySource{Type: v1alpha1.KeySourceMethod})),
	), nil)
	long := strings.Repeat("M", v1alpha1.MaxGatewayHeaderBytes+1)
	for _, target := range []string{"/v1/forward-auth/default/bymethod/a", "/v1/forward-auth/default/bymethod"} {
		a := forward(t, h, long, target, nil)
		if a.status != http.StatusRequestHeaderFieldsTooLarge || !strings.Contains(a.body, `"method: header too large"`) {
			t.Errorf("%s: %d %s, want 431 naming the method", target, a.status, a.body)
		}
	}
}
