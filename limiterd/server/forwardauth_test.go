package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// gatewayPolicy returns a policy default/<name> of one token bucket (capacity 2, 1 a minute),
// whose forward-auth requests are keyed by g.
func gatewayPolicy(name string, g *v1alpha1.Gateway) *v1alpha1.RateLimitPolicy {
	p := newPolicy(name, testsupport.TokenBucketTier("standard", 2, 1, time.Minute))
	p.Spec.Gateway = g
	return p
}

func byAddress(hops int32) *v1alpha1.Gateway {
	return &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: &hops}}}
}

// forward sends a forward-auth request from the peer 10.0.0.1 (the gateway) with header.
func forward(t testing.TB, h http.Handler, method, target string, header http.Header) answer {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = "10.0.0.1:40000"
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rec.Result()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: string(b)}
}

func xff(v string) http.Header { return http.Header{"X-Forwarded-For": {v}} }

func TestForwardAuthAllowsThenRejects(t *testing.T) {
	clock := testsupport.NewClock()
	h := NewDecisions(newEngine(t, clock, gatewayPolicy("api", byAddress(1))), nil)
	for i, want := range []struct {
		status     int
		rateLimit  string
		retryAfter string
	}{{200, `"standard";r=1;t=60`, ""}, {200, `"standard";r=0;t=120`, ""}, {429, `"standard";r=0;t=120`, "60"}} {
		a := forward(t, h, http.MethodGet, "/v1/forward-auth/default/api", xff("198.51.100.7"))
		if a.status != want.status {
			t.Fatalf("request %d: %d %s, want %d", i, a.status, a.body, want.status)
		}
		if got := a.header.Get("RateLimit"); got != want.rateLimit {
			t.Errorf("request %d: RateLimit %q, want %q", i, got, want.rateLimit)
		}
		if got := a.header.Get("RateLimit-Policy"); got != `"standard";q=2;w=120` {
			t.Errorf("request %d: RateLimit-Policy %q", i, got)
		}
		if got := a.header.Get("Retry-After"); got != want.retryAfter {
			t.Errorf("request %d: Retry-After %q, want %q", i, got, want.retryAfter)
		}
	}
	// nginx's form: a rejection answers 403, with Retry-After all the same.
	a := forward(t, h, http.MethodGet, "/v1/forward-auth/default/api?deny=403", xff("198.51.100.7"))
	if a.status != http.StatusForbidden || a.header.Get("Retry-After") != "60" || !strings.Contains(a.body, `"allowed":false`) {
		t.Errorf("deny=403: %d Retry-After %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	// Another client has its own budget; deny=403 changes nothing for an admission.
	if a := forward(t, h, http.MethodGet, "/v1/forward-auth/default/api?deny=403", xff("198.51.100.8")); a.status != 200 {
		t.Errorf("another client: %d %s", a.status, a.body)
	}
}

// TestForwardAuthAnyMethodNoBrowserChecks: the gateways forward the original method, content
// type and browser headers; none of them is refused as the decisions API refuses them.
func TestForwardAuthAnyMethodNoBrowserChecks(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), gatewayPolicy("api", byAddress(1))), nil)
	for _, m := range []string{http.MethodPost, http.MethodDelete, http.MethodPatch, "PROPFIND"} {
		hdr := xff("198.51.100.7")
		hdr["Content-Type"] = []string{"text/plain"}
		hdr["Origin"] = []string{"https://elsewhere.example"}
		hdr["Sec-Fetch-Site"] = []string{"cross-site"}
		a := forward(t, h, m, "/v1/forward-auth/default/api", hdr)
		if a.status != 200 && a.status != 429 {
			t.Errorf("%s: %d %s, want a decision", m, a.status, a.body)
		}
	}
}

// TestForwardAuthForgedForwardedFor: a client that sends its own X-Forwarded-For naming
// another client gets neither that client's budget nor a fresh one: the gateway appends the
// address it sees, and only that entry (trustedHops 1) is read.
func TestForwardAuthForgedForwardedFor(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), gatewayPolicy("api", byAddress(1))), nil)
	const target = "/v1/forward-auth/default/api"
	// The attacker, 203.0.113.5, claims to be the victim 198.51.100.7, then others.
	for i, forged := range []string{"198.51.100.7", "192.0.2.1", "192.0.2.2, 192.0.2.3", "198.51.100.7"} {
		a := forward(t, h, http.MethodGet, target, xff(forged+", 203.0.113.5"))
		if want := []int{200, 200, 429, 429}[i]; a.status != want {
			t.Errorf("forged %q: %d, want %d: the attacker's own budget", forged, a.status, want)
		}
	}
	// The victim's budget is untouched.
	if a := forward(t, h, http.MethodGet, target, xff("198.51.100.7")); a.status != 200 || a.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("victim: %d RateLimit %q, want 200 with its whole budget", a.status, a.header.Get("RateLimit"))
	}
	// Behind a load balancer (two trusted hops), the entry the client wrote is still ignored.
	h2 := NewDecisions(newEngine(t, testsupport.NewClock(), gatewayPolicy("api", byAddress(2))), nil)
	for i := range 3 {
		a := forward(t, h2, http.MethodGet, target, xff("198.51.100.7, 203.0.113.5, 10.0.0.9"))
		if want := []int{200, 200, 429}[i]; a.status != want {
			t.Errorf("two hops, request %d: %d, want %d", i, a.status, want)
		}
	}
	if a := forward(t, h2, http.MethodGet, target, xff("198.51.100.7, 10.0.0.9")); a.status != 200 {
		t.Errorf("two hops, victim: %d", a.status)
	}
}

// TestForwardAuthHugeAndRepeatedHeaders: a header the key is read from that is too large (431)
// or given twice (400) is refused and charges nothing.
func TestForwardAuthHugeAndRepeatedHeaders(t *testing.T) {
	g := &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
		{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"},
		{Type: v1alpha1.KeySourceClientAddress},
	}}
	h := NewDecisions(newEngine(t, testsupport.NewClock(), gatewayPolicy("api", g)), nil)
	const target = "/v1/forward-auth/default/api"
	huge := xff("198.51.100.7")
	huge["X-Api-Key"] = []string{strings.Repeat("k", v1alpha1.MaxGatewayHeaderBytes+1)}
	repeated := xff("198.51.100.7")
	repeated["X-Api-Key"] = []string{"a", "b"}
	hugeXFF := xff(strings.Repeat("192.0.2.1, ", 1000) + "198.51.100.7")
	for _, tc := range []struct {
		name   string
		header http.Header
		status int
		text   string
	}{
		{"huge key header", huge, http.StatusRequestHeaderFieldsTooLarge, "X-Api-Key: header too large"},
		{"repeated key header", repeated, http.StatusBadRequest, "X-Api-Key: header given more than once"},
		{"huge X-Forwarded-For", hugeXFF, http.StatusRequestHeaderFieldsTooLarge, "X-Forwarded-For: header too large"},
	} {
		for range 3 {
			a := forward(t, h, http.MethodGet, target, tc.header)
			if a.status != tc.status || a.errorText(t) != tc.text {
				t.Errorf("%s: %d %s, want %d %q", tc.name, a.status, a.body, tc.status, tc.text)
			}
		}
	}
	// Nothing was charged to the address.
	if a := forward(t, h, http.MethodGet, target, xff("198.51.100.7")); a.status != 200 || a.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("after refusals: %d RateLimit %q, want the whole budget", a.status, a.header.Get("RateLimit"))
	}
}

// TestForwardAuthMissingKey: a request no key source yields a key for follows missingKey.
func TestForwardAuthMissingKey(t *testing.T) {
	byKey := func(m v1alpha1.MissingKey) *v1alpha1.Gateway {
		return &v1alpha1.Gateway{MissingKey: m, KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}}}
	}
	const target = "/v1/forward-auth/default/"

	reject := gatewayPolicy("reject", byKey(""))
	allow := gatewayPolicy("allow", byKey(v1alpha1.MissingKeyAllow))
	shared := gatewayPolicy("shared", byKey(v1alpha1.MissingKeyShared))
	h := NewDecisions(newEngine(t, testsupport.NewClock(), reject, allow, shared), nil)

	for _, q := range []struct {
		query  string
		status int
	}{{"", 429}, {"?deny=403", 403}} {
		a := forward(t, h, http.MethodGet, target+"reject"+q.query, nil)
		if a.status != q.status || a.header.Get("Retry-After") != "" || a.errorText(t) != engine.ErrNoKey.Error() {
			t.Errorf("Reject%s: %d Retry-After %q %s", q.query, a.status, a.header.Get("Retry-After"), a.body)
		}
	}
	for range 5 {
		a := forward(t, h, http.MethodGet, target+"allow", nil)
		if a.status != 200 || a.body != "{\"allowed\":true}\n" || a.header.Get("RateLimit") != "" {
			t.Errorf("Allow: %d %q RateLimit %q", a.status, a.body, a.header.Get("RateLimit"))
		}
	}
	// Shared: every request without a key spends the one key "anonymous"; keyed ones do not.
	for i := range 3 {
		a := forward(t, h, http.MethodGet, target+"shared", xff("198.51.100."+string(rune('1'+i))))
		if want := []int{200, 200, 429}[i]; a.status != want {
			t.Errorf("Shared, request %d: %d, want %d", i, a.status, want)
		}
	}
	if a := forward(t, h, http.MethodGet, target+"shared", http.Header{"X-Api-Key": {"k"}}); a.status != 200 {
		t.Errorf("Shared, keyed request: %d", a.status)
	}
	// A key source's key never collides with the shared key.
	if a := forward(t, h, http.MethodGet, target+"shared", http.Header{"X-Api-Key": {v1alpha1.SharedGatewayKey}}); a.status != 200 {
		t.Errorf("Shared, key %q: %d", v1alpha1.SharedGatewayKey, a.status)
	}
}

func TestForwardAuthRefusals(t *testing.T) {
	plain := newPolicy("plain", testsupport.TokenBucketTier("standard", 2, 1, time.Minute))
	h := NewDecisions(newEngine(t, testsupport.NewClock(), plain, gatewayPolicy("api", byAddress(1))), nil)
	for _, tc := range []struct {
		target string
		status int
		text   string
	}{
		{"/v1/forward-auth/default/plain", http.StatusConflict, "default/plain: " + engine.ErrNoGateway.Error()},
		{"/v1/forward-auth/default/nope", http.StatusNotFound, `unknown policy "default/nope"`},
		{"/v1/forward-auth/default", http.StatusNotFound, ""},
		{"/v1/forward-auth/api", http.StatusNotFound, ""}, // a bare name is never default/api here (docs/gateways.md)
		{"/v1/forward-auth/default/nope/x", http.StatusNotFound, `unknown policy "default/nope"`},
		{"/v1/forward-auth/default/plain/x", http.StatusConflict, "default/plain: " + engine.ErrNoGateway.Error()},
		{"/v1/forward-auth/default//api/x", http.StatusNotFound, errForwardAuthPath},
		{"/v1/forward-auth/default/api%2Fx", http.StatusNotFound, `unknown policy "default/api%2Fx"`}, // never split on an escaped '/'
		{"/v1/forward-auth/default/api*", http.StatusNotFound, `unknown policy "default/api*"`},       // OPTIONS * after path_prefix
		{"/v1/forward%2Dauth/default/api", http.StatusNotFound, errForwardAuthPath},
		{"/v1/forward-auth/Default/api", http.StatusNotFound, ""},
		{"/v1/forward-auth/default/api?deny=500", http.StatusBadRequest, errDeny},
		{"/v1/forward-auth/default/api?deny=403&x=1", http.StatusBadRequest, errDeny},
	} {
		a := forward(t, h, http.MethodGet, tc.target, xff("198.51.100.7"))
		text := a.errorText(t)
		if a.status != tc.status || tc.text != "" && text != tc.text {
			t.Errorf("%s: %d %q, want %d %q", tc.target, a.status, text, tc.status, tc.text)
		}
	}
	notReady := NewDecisions(newEngine(t, testsupport.NewClock()), nil)
	if a := forward(t, notReady, http.MethodGet, "/v1/forward-auth/default/api", nil); a.status != http.StatusServiceUnavailable {
		t.Errorf("not ready: %d %s", a.status, a.body)
	}
	// The Host check applies: a name not allowed answers 421.
	hosts := NewDecisions(newEngine(t, testsupport.NewClock(), gatewayPolicy("api", byAddress(1))), nil, WithAllowedHosts([]string{"limiterd.limiterd.svc"}))
	for host, want := range map[string]int{"app.example.com": 421, "limiterd.limiterd.svc:8080": 200, "10.96.0.10:8080": 200} {
		req := httptest.NewRequest(http.MethodGet, "/v1/forward-auth/default/api", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		hosts.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("Host %s: %d, want %d", host, rec.Code, want)
		}
	}
}
