package server

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

func TestAllowTokenBucketAnswersAndHeaders(t *testing.T) {
	clock := testsupport.NewClock()
	// 2 tokens, 1 a second: a full refill takes 2 s.
	h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Second))), nil)
	const req = `{"policy":"default/api","key":"alice","cost":1}`

	want := []struct {
		status                      int
		body, rateLimit, retryAfter string
	}{
		{200, `{"allowed":true,"limit":2,"remaining":1,"resetAfterSeconds":1,"retryAfterSeconds":0,"resetAfterMs":1000,"retryAfterMs":0}`, `"standard";r=1;t=1`, ""},
		{200, `{"allowed":true,"limit":2,"remaining":0,"resetAfterSeconds":2,"retryAfterSeconds":0,"resetAfterMs":2000,"retryAfterMs":0}`, `"standard";r=0;t=2`, ""},
		{429, `{"allowed":false,"limit":2,"remaining":0,"resetAfterSeconds":2,"retryAfterSeconds":1,"resetAfterMs":2000,"retryAfterMs":1000}`, `"standard";r=0;t=2`, "1"},
	}
	for i, w := range want {
		a := serve(t, h, http.MethodPost, "/v1/allow", req)
		if a.status != w.status || strings.TrimSpace(a.body) != w.body {
			t.Fatalf("request %d: %d %s, want %d %s", i, a.status, a.body, w.status, w.body)
		}
		if got := a.header.Get("RateLimit-Policy"); got != `"standard";q=2;w=2` {
			t.Errorf("request %d: RateLimit-Policy = %q", i, got)
		}
		if got := a.header.Get("RateLimit"); got != w.rateLimit {
			t.Errorf("request %d: RateLimit = %q, want %q", i, got, w.rateLimit)
		}
		if got := a.header.Get("Retry-After"); got != w.retryAfter {
			t.Errorf("request %d: Retry-After = %q, want %q", i, got, w.retryAfter)
		}
		if got := a.header.Get("Content-Type"); got != "application/json" {
			t.Errorf("request %d: Content-Type = %q", i, got)
		}
	}
	// Half a second later half a token is back: still rejected, retry in 0.5 s rounds up to 1.
	clock.Advance(500 * time.Millisecond)
	a := serve(t, h, http.MethodGet, "/v1/allow?key=alice", "")
	if a.status != 429 || a.header.Get("Retry-After") != "1" {
		t.Fatalf("after 0.5 s: %d Retry-After %q", a.status, a.header.Get("Retry-After"))
	}
	clock.Advance(500 * time.Millisecond)
	if a := serve(t, h, http.MethodGet, "/v1/allow?key=alice", ""); a.status != 200 {
		t.Fatalf("after 1 s: %d %s, want 200", a.status, a.body)
	}
}

func TestAllowGetAndPostAreTheSameDecision(t *testing.T) {
	clock := testsupport.NewClock()
	h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 5, 1, time.Second))), nil)
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"bob","cost":3}`); a.status != 200 || !strings.Contains(a.body, `"remaining":2`) {
		t.Fatalf("POST: %d %s", a.status, a.body)
	}
	q := url.Values{"policy": {"default/api"}, "key": {"bob"}, "cost": {"2"}}
	if a := serve(t, h, http.MethodGet, "/v1/allow?"+q.Encode(), ""); a.status != 200 || !strings.Contains(a.body, `"remaining":0`) {
		t.Fatalf("GET: %d %s", a.status, a.body)
	}
	if a := serve(t, h, http.MethodGet, "/v1/allow?key=bob", ""); a.status != 429 {
		t.Fatalf("GET after the allowance: %d %s, want 429", a.status, a.body)
	}
}

func TestAllowSlidingWindowHeaders(t *testing.T) {
	clock := testsupport.NewClock()
	h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.SlidingWindowTier("hourly", 3, time.Hour))), nil)
	a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`)
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	if got := a.header.Get("RateLimit-Policy"); got != `"hourly";q=3;w=3600` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	if got := a.header.Get("RateLimit"); got != `"hourly";r=2;t=3600` {
		t.Errorf("RateLimit = %q", got)
	}
}

// TestAllowCostAboveTheLimit checks that a cost no wait can admit answers 429 with no retry
// time in the body or the header fields, and the client's state as it is.
func TestAllowCostAboveTheLimit(t *testing.T) {
	for _, tier := range []v1alpha1.Tier{
		testsupport.TokenBucketTier("standard", 3, 1, 8*time.Hour/3),
		testsupport.SlidingWindowTier("standard", 3, 8*time.Hour),
	} {
		t.Run(string(tier.Algorithm), func(t *testing.T) {
			h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("api", tier)), nil)
			for _, step := range []struct{ body, want, rateLimit string }{
				{`{"key":"fresh","cost":4}`, `{"allowed":false,"limit":3,"remaining":3,"resetAfterSeconds":0,"retryAfterSeconds":0,"resetAfterMs":0,"retryAfterMs":0}`, `"standard";r=3;t=0`},
				{`{"key":"used","cost":1}`, `{"allowed":true,"limit":3,"remaining":2,"resetAfterSeconds":`, ``},
				{`{"key":"used","cost":4}`, `{"allowed":false,"limit":3,"remaining":2,"resetAfterSeconds":`, ``},
			} {
				a := serve(t, h, http.MethodPost, "/v1/allow", step.body)
				if !strings.HasPrefix(a.body, step.want) {
					t.Fatalf("%s: %d %s, want %s...", step.body, a.status, a.body, step.want)
				}
				if step.rateLimit != "" && a.header.Get("RateLimit") != step.rateLimit {
					t.Errorf("%s: RateLimit %q, want %q", step.body, a.header.Get("RateLimit"), step.rateLimit)
				}
				if a.status == 429 && (a.header.Get("Retry-After") != "" || !strings.Contains(a.body, `"retryAfterSeconds":0,`) || !strings.Contains(a.body, `"retryAfterMs":0}`)) {
					t.Errorf("%s: Retry-After %q, body %s: want no retry time", step.body, a.header.Get("Retry-After"), a.body)
				}
			}
		})
	}
}

func TestAllowNeverNamesTheAlgorithm(t *testing.T) {
	clock := testsupport.NewClock()
	h := NewDecisions(newEngine(t, clock, newPolicy("api",
		testsupport.TokenBucketTier("standard", 1, 1, time.Second), testsupport.SlidingWindowTier("other", 1, time.Second))), nil)
	for i := range 2 {
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`)
		text := strings.ToLower(a.body + a.header.Get("RateLimit-Policy") + a.header.Get("RateLimit"))
		for _, word := range []string{"token", "bucket", "sliding", "window", "gcra"} {
			if strings.Contains(text, word) {
				t.Errorf("answer %d names the algorithm (%q): %s", i, word, text)
			}
		}
	}
}

func TestAllowUnlimitedTierHasNoQuota(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.UnlimitedTier("free"))), nil)
	for range 3 {
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":1000000000}`)
		if a.status != 200 || strings.TrimSpace(a.body) != `{"allowed":true,"limit":null,"remaining":null,"resetAfterSeconds":0,"retryAfterSeconds":0,"resetAfterMs":0,"retryAfterMs":0}` {
			t.Fatalf("%d %s", a.status, a.body)
		}
		for _, name := range []string{"RateLimit", "RateLimit-Policy", "Retry-After"} {
			if v := a.header.Get(name); v != "" {
				t.Errorf("%s = %q, want none", name, v)
			}
		}
	}
}

func TestAllowDryRunTierAlwaysAdmits(t *testing.T) {
	tier := testsupport.TokenBucketTier("shadow", 1, 1, time.Minute)
	tier.DryRun = true
	h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("api", tier)), nil)
	serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`)
	a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`)
	if a.status != 200 || !strings.Contains(a.body, `"allowed":true`) || a.header.Get("Retry-After") != "" {
		t.Fatalf("dry run over the limit: %d %s Retry-After %q", a.status, a.body, a.header.Get("Retry-After"))
	}
	if got := a.header.Get("RateLimit"); got != `"shadow";r=0;t=60` {
		t.Errorf("RateLimit = %q, want the enforced-would-be state", got)
	}
}

// TestAllowDryRunTierSaysWhatItWouldDo: a dry-run tier's answer admits (200, "allowed":true, no
// Retry-After) and says that it is a dry run and what enforcing the tier would have answered:
// "wouldAllow" and the would-be retry time in the body, Limiterd-Dry-Run in the header. Before,
// a would-be rejection answered "allowed":true and retry 0 with no hint of it. A batch item
// says it too.
func TestAllowDryRunTierSaysWhatItWouldDo(t *testing.T) {
	tier := testsupport.TokenBucketTier("shadow", 1, 1, time.Minute)
	tier.DryRun = true
	h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("api", tier)), nil)
	for i, want := range []struct{ body, header string }{
		{`{"allowed":true,"limit":1,"remaining":0,"resetAfterSeconds":60,"retryAfterSeconds":0,"resetAfterMs":60000,"retryAfterMs":0,` +
			`"dryRun":true,"wouldAllow":true,"wouldRetryAfterSeconds":0,"wouldRetryAfterMs":0}`, "would-allow"},
		{`{"allowed":true,"limit":1,"remaining":0,"resetAfterSeconds":60,"retryAfterSeconds":0,"resetAfterMs":60000,"retryAfterMs":0,` +
			`"dryRun":true,"wouldAllow":false,"wouldRetryAfterSeconds":60,"wouldRetryAfterMs":60000}`, "would-reject"},
	} {
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`)
		if a.status != 200 || strings.TrimSpace(a.body) != want.body || a.header.Get("Retry-After") != "" {
			t.Errorf("request %d: %d %s Retry-After %q, want 200 %s", i, a.status, a.body, a.header.Get("Retry-After"), want.body)
		}
		if got := a.header.Get("Limiterd-Dry-Run"); got != want.header {
			t.Errorf("request %d: Limiterd-Dry-Run %q, want %q", i, got, want.header)
		}
	}
	a := serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[{"key":"k"}]}`)
	if a.status != 200 || !strings.Contains(a.body, `"allowed":true`) || !strings.Contains(a.body, `"dryRun":true,"wouldAllow":false,"wouldRetryAfterSeconds":60,`) {
		t.Errorf("batch: %d %s, want the item's would-be rejection", a.status, a.body)
	}
	// An enforced tier's answer has none of it.
	enforced := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 1, 1, time.Minute))), nil)
	if a := serve(t, enforced, http.MethodPost, "/v1/allow", `{"key":"k"}`); strings.Contains(a.body, "dryRun") || strings.Contains(a.body, "would") || a.header.Get("Limiterd-Dry-Run") != "" {
		t.Errorf("enforced tier: %s %v, want no dry-run fields", a.body, a.header)
	}
}

// TestAppendDecisionDryRunAllocatesNothing: the dry-run fields keep the answer's body free of
// allocations.
func TestAppendDecisionDryRunAllocatesNothing(t *testing.T) {
	tier := testsupport.TokenBucketTier("shadow", 1, 1, time.Minute)
	tier.DryRun = true
	e := newEngine(t, testsupport.NewClock(), newPolicy("api", tier))
	res, err := e.Decide(t.Context(), "", "k", 2)
	if err != nil || res.Outcome != engine.DryRunRejected {
		t.Fatalf("Decide: %v %v, want a dry-run rejection", res.Outcome, err)
	}
	b := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() { b = appendDecision(b[:0], &res, false) }); n != 0 {
		t.Errorf("appendDecision of a dry-run rejection: %v allocations, want 0", n)
	}
}

func TestAllowPolicySelection(t *testing.T) {
	clock := testsupport.NewClock()
	two := NewDecisions(newEngine(t, clock,
		newPolicy("a", testsupport.TokenBucketTier("standard", 5, 1, time.Second)),
		newPolicy("b", testsupport.SlidingWindowTier("strict", 1, time.Second))), nil)
	if a := serve(t, two, http.MethodPost, "/v1/allow", `{"key":"k"}`); a.status != 400 {
		t.Errorf("omitted policy with two loaded: %d %s, want 400", a.status, a.body)
	} else {
		a.errorText(t)
	}
	if a := serve(t, two, http.MethodPost, "/v1/allow", `{"policy":"default/b","key":"k"}`); a.status != 200 ||
		a.header.Get("RateLimit-Policy") != `"strict";q=1;w=1` {
		t.Errorf("named policy: %d %s %v", a.status, a.body, a.header)
	}
	if a := serve(t, two, http.MethodPost, "/v1/allow", `{"policy":"default/c","key":"k"}`); a.status != 404 {
		t.Errorf("unknown policy: %d %s, want 404", a.status, a.body)
	} else {
		a.errorText(t)
	}
	if a := serve(t, two, http.MethodGet, "/v1/allow?policy=nope&key=k", ""); a.status != 404 {
		t.Errorf("unknown policy (GET): %d %s, want 404", a.status, a.body)
	}
}

// TestAllowBareNameIsDefaultNamespace: a policy named without a namespace is the policy of
// namespace "default", in POST, GET and batch requests alike, as an Envoy domain is
// (envoyrls): "api" and "default/api" share one policy's counts. A bare name never names a
// policy of another namespace.
func TestAllowBareNameIsDefaultNamespace(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(),
		newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Minute)),
		nsPolicy("team", "other")), nil)
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"policy":"api","key":"k"}`); a.status != 200 ||
		a.header.Get("RateLimit-Policy") != `"standard";q=2;w=120` {
		t.Errorf(`POST "api": %d %s %v, want 200 from default/api`, a.status, a.body, a.header)
	}
	if a := serve(t, h, http.MethodGet, "/v1/allow?policy=default%2Fapi&key=k", ""); a.status != 200 {
		t.Errorf(`GET "default/api" after "api": %d %s, want 200 (the second of 2 tokens)`, a.status, a.body)
	}
	if a := serve(t, h, http.MethodGet, "/v1/allow?policy=api&key=k", ""); a.status != 429 {
		t.Errorf(`GET "api" after two decisions of default/api: %d %s, want 429`, a.status, a.body)
	}
	results := batchAnswer(t, serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[{"policy":"api","key":"k"},{"policy":"api","key":"j"}]}`))
	if !strings.Contains(string(results[0]), `"allowed":false`) || !strings.Contains(string(results[1]), `"allowed":true`) {
		t.Errorf(`batch of "api": %s, want k rejected and j allowed`, results)
	}
	for _, body := range []string{`{"policy":"other","key":"k"}`, `{"policy":"team","key":"k"}`} {
		a := serve(t, h, http.MethodPost, "/v1/allow", body)
		if a.status != 404 || !strings.Contains(a.errorText(t), `"default/`) {
			t.Errorf("%s: %d %s, want 404 naming the policy of namespace default it looked up", body, a.status, a.body)
		}
	}
}

func TestAllowBeforeAnyPolicyIs503(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock()), nil)
	for _, tc := range []struct{ method, target, body string }{
		{http.MethodPost, "/v1/allow", `{"key":"k"}`},
		{http.MethodGet, "/v1/allow?key=k", ""},
	} {
		a := serve(t, h, tc.method, tc.target, tc.body)
		if a.status != http.StatusServiceUnavailable {
			t.Errorf("%s %s: %d %s, want 503", tc.method, tc.target, a.status, a.body)
			continue
		}
		a.errorText(t)
	}
}

func TestAllowRejectsBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		target string
		body   string
		status int
	}{
		{"missing key", "POST", "/v1/allow", `{"cost":1}`, 400},
		{"empty key", "POST", "/v1/allow", `{"key":""}`, 400},
		{"null key", "POST", "/v1/allow", `{"key":null}`, 400},
		{"numeric key", "POST", "/v1/allow", `{"key":12}`, 400},
		{"cost leading zero", "POST", "/v1/allow", `{"key":"k","cost":01}`, 400},
		{"cost negative", "POST", "/v1/allow", `{"key":"k","cost":-1}`, 400},
		{"cost fraction", "POST", "/v1/allow", `{"key":"k","cost":1.5}`, 400},
		{"cost integral float", "POST", "/v1/allow", `{"key":"k","cost":1.0}`, 400},
		{"cost exponent", "POST", "/v1/allow", `{"key":"k","cost":1e3}`, 400},
		{"cost string", "POST", "/v1/allow", `{"key":"k","cost":"2"}`, 400},
		{"cost bool", "POST", "/v1/allow", `{"key":"k","cost":true}`, 400},
		{"cost too large", "POST", "/v1/allow", `{"key":"k","cost":1000000001}`, 400},
		{"cost huge", "POST", "/v1/allow", `{"key":"k","cost":99999999999999999999999}`, 400},
		{"malformed", "POST", "/v1/allow", `{"key":"k"`, 400},
		{"not an object", "POST", "/v1/allow", `["k"]`, 400},
		{"empty body", "POST", "/v1/allow", ``, 400},
		{"unknown field", "POST", "/v1/allow", `{"key":"k","cots":2}`, 400},
		{"field twice", "POST", "/v1/allow", `{"key":"k","key":"j"}`, 400},
		{"trailing data", "POST", "/v1/allow", `{"key":"k"} {}`, 400},
		{"GET missing key", "GET", "/v1/allow?policy=default/api", "", 400},
		{"GET cost leading zero", "GET", "/v1/allow?key=k&cost=00", "", 400},
		{"GET cost float", "GET", "/v1/allow?key=k&cost=1.5", "", 400},
		{"GET cost string", "GET", "/v1/allow?key=k&cost=two", "", 400},
		{"GET cost too large", "GET", "/v1/allow?key=k&cost=1000000001", "", 400},
		{"GET unknown parameter", "GET", "/v1/allow?key=k&cots=1", "", 400},
		{"GET key twice", "GET", "/v1/allow?key=k&key=j", "", 400},
		{"GET bad escape", "GET", "/v1/allow?key=%zz", "", 400},
		{"PUT", "PUT", "/v1/allow", `{"key":"k"}`, 405},
		{"DELETE", "DELETE", "/v1/allow?key=k", "", 405},
		{"policies are not listed here", "GET", "/v1/policies", "", 404},
		{"unknown path", "GET", "/v1/allowed?key=k", "", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := testsupport.NewClock()
			h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Minute))), nil)
			a := serve(t, h, tc.method, tc.target, tc.body)
			if a.status != tc.status {
				t.Fatalf("%d %s, want %d", a.status, a.body, tc.status)
			}
			a.errorText(t)
			if tc.status == 405 && a.header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
			// An error consumes nothing: the key still has its whole allowance.
			ok := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`)
			if ok.status != 200 || !strings.Contains(ok.body, `"remaining":2`) {
				t.Fatalf("decision after the error: %d %s, want the full allowance", ok.status, ok.body)
			}
		})
	}
}

func TestAllowBodyTooLarge(t *testing.T) {
	clock := testsupport.NewClock()
	h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Minute))), nil)
	big := `{"key":"k","policy":"` + strings.Repeat("p", MaxBodyBytes) + `"}`

	a := serve(t, h, http.MethodPost, "/v1/allow", big)
	if a.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("declared length: %d %s, want 413", a.status, a.body)
	}
	a.errorText(t)

	// Without a declared length (chunked), the limit holds while reading.
	req := httptest.NewRequest(http.MethodPost, "/v1/allow", struct{ *strings.Reader }{strings.NewReader(big)})
	req.ContentLength = -1
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("undeclared length: %d %s, want 413", rec.Code, rec.Body)
	}
	// A body of exactly the limit is read (and then judged on its content).
	exact := `{"key":"k"}` + strings.Repeat(" ", MaxBodyBytes-len(`{"key":"k"}`))
	if a := serve(t, h, http.MethodPost, "/v1/allow", exact); a.status != 200 {
		t.Fatalf("body of exactly %d bytes: %d %s", MaxBodyBytes, a.status, a.body)
	}
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`); a.status != 200 || !strings.Contains(a.body, `"remaining":1`) {
		t.Fatalf("after the 413s: %d %s, want one unit spent by the exact-limit body only", a.status, a.body)
	}
}

func TestAllowKeyBounds(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Minute))), nil)
	key := strings.Repeat("é", MaxKeyBytes/2) // 1024 bytes
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"`+key+`"}`); a.status != 200 {
		t.Fatalf("key of %d bytes: %d %s", len(key), a.status, a.body)
	}
	// Escapes count once decoded: 1024 escaped bytes are within the bound.
	escaped := strings.Repeat(`\u00e9`, MaxKeyBytes/2)
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"`+escaped+`"}`); a.status != 200 || !strings.Contains(a.body, `"remaining":1`) {
		t.Fatalf("escaped key: %d %s, want the same client as the raw key", a.status, a.body)
	}
	if a := serve(t, h, http.MethodGet, "/v1/allow?key="+url.QueryEscape(key), ""); a.status != 200 || !strings.Contains(a.body, `"remaining":0`) {
		t.Fatalf("GET with the same key: %d %s", a.status, a.body)
	}
}

// TestAllowCostZeroPeeks checks that a cost of 0 answers the client's state, as a one-unit
// request would see it, and consumes nothing, with either algorithm, by POST and GET.
func TestAllowCostZeroPeeks(t *testing.T) {
	for _, tc := range []struct {
		tier  v1alpha1.Tier
		retry string // seconds until one unit is back
	}{
		{testsupport.TokenBucketTier("standard", 2, 2, time.Minute), "30"},
		{testsupport.SlidingWindowTier("standard", 2, time.Minute), "60"},
	} {
		t.Run(string(tc.tier.Algorithm), func(t *testing.T) {
			clock := testsupport.NewClock()
			h := NewDecisions(newEngine(t, clock, newPolicy("api", tc.tier)), nil)
			peek := func(method string) answer {
				if method == http.MethodGet {
					return serve(t, h, method, "/v1/allow?key=k&cost=0", "")
				}
				return serve(t, h, method, "/v1/allow", `{"key":"k","cost":0}`)
			}
			for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodPost} {
				if a := peek(m); a.status != 200 || !strings.HasPrefix(a.body, `{"allowed":true,"limit":2,"remaining":2,"resetAfterSeconds":0,`) {
					t.Fatalf("%s peek at a fresh client: %d %s", m, a.status, a.body)
				}
			}
			for i := range 2 {
				if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`); a.status != 200 {
					t.Fatalf("request %d after the peeks: %d %s, want 200: a peek consumed", i, a.status, a.body)
				}
			}
			for _, m := range []string{http.MethodPost, http.MethodGet} {
				a := peek(m)
				if a.status != 429 || !strings.HasPrefix(a.body, `{"allowed":false,"limit":2,"remaining":0,"resetAfterSeconds":60,"retryAfterSeconds":`+tc.retry) ||
					a.header.Get("Retry-After") != tc.retry || a.header.Get("RateLimit") != `"standard";r=0;t=60` {
					t.Fatalf("%s peek at an exhausted client: %d %v %s", m, a.status, a.header, a.body)
				}
			}
			clock.Advance(time.Minute)
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":2}`); a.status != 200 {
				t.Fatalf("after the window: %d %s, want the whole allowance", a.status, a.body)
			}
		})
	}
}

// TestAllowMillisecondsAreExact checks that tiers with windows under a second answer exact
// waits in retryAfterMs and resetAfterMs (rounded up to the next millisecond), where the
// seconds fields and header fields round up to 1.
func TestAllowMillisecondsAreExact(t *testing.T) {
	for _, tc := range []struct {
		tier  v1alpha1.Tier
		steps []struct {
			after time.Duration // the clock advances first
			want  string        // the answer's body
		}
	}{
		// One request per 100 ms window.
		{testsupport.SlidingWindowTier("fast", 1, 100*time.Millisecond), []struct {
			after time.Duration
			want  string
		}{
			{0, `{"allowed":true,"limit":1,"remaining":0,"resetAfterSeconds":1,"retryAfterSeconds":0,"resetAfterMs":100,"retryAfterMs":0}`},
			{30 * time.Millisecond, `{"allowed":false,"limit":1,"remaining":0,"resetAfterSeconds":1,"retryAfterSeconds":1,"resetAfterMs":70,"retryAfterMs":70}`},
			{70 * time.Millisecond, `{"allowed":true,"limit":1,"remaining":0,"resetAfterSeconds":1,"retryAfterSeconds":0,"resetAfterMs":100,"retryAfterMs":0}`},
		}},
		// 3 tokens per 100 ms: one every 33.33 ms, a wait that rounds up to 34 ms.
		{testsupport.TokenBucketTier("fast", 1, 3, 100*time.Millisecond), []struct {
			after time.Duration
			want  string
		}{
			{0, `{"allowed":true,"limit":1,"remaining":0,"resetAfterSeconds":1,"retryAfterSeconds":0,"resetAfterMs":34,"retryAfterMs":0}`},
			{time.Millisecond, `{"allowed":false,"limit":1,"remaining":0,"resetAfterSeconds":1,"retryAfterSeconds":1,"resetAfterMs":33,"retryAfterMs":33}`},
			{33 * time.Millisecond, `{"allowed":true,"limit":1,"remaining":0,"resetAfterSeconds":1,"retryAfterSeconds":0,"resetAfterMs":34,"retryAfterMs":0}`},
		}},
	} {
		t.Run(string(tc.tier.Algorithm), func(t *testing.T) {
			clock := testsupport.NewClock()
			h := NewDecisions(newEngine(t, clock, newPolicy("api", tc.tier)), nil)
			for i, s := range tc.steps {
				clock.Advance(s.after)
				a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`)
				if strings.TrimSpace(a.body) != s.want {
					t.Fatalf("step %d: %d %s\nwant %s", i, a.status, a.body, s.want)
				}
				if a.status == 429 && a.header.Get("Retry-After") != "1" {
					t.Fatalf("step %d: Retry-After %q, want whole seconds rounded up", i, a.header.Get("Retry-After"))
				}
			}
		})
	}
}

// TestLegacyHeaders checks that WithLegacyHeaders adds X-RateLimit-Limit, -Remaining and -Reset
// (a Unix time in seconds, rounded up) to decisions, peeks and refunds of a tier with a limit,
// and nothing otherwise.
func TestLegacyHeaders(t *testing.T) {
	clock := testsupport.NewClock()
	p := newPolicy("api", testsupport.TokenBucketTier("standard", 4, 2, time.Second), testsupport.UnlimitedTier("internal"))
	p.Spec.Overrides = []v1alpha1.Override{overrideOf("internal", []string{"svc"}, nil)}
	e := newEngine(t, clock, withRefunds(p))
	legacy := NewDecisions(e, nil, WithLegacyHeaders())
	var rsv string // the last reservation answered
	start := clock.Now().Unix()
	clock.Advance(100 * time.Millisecond)
	for _, tc := range []struct {
		target, body     string
		limit, remaining string
		reset            int64 // seconds after start
	}{
		{"/v1/allow", `{"key":"k","cost":3}`, "4", "1", 2},            // 1.5 s to refill from t+0.1 s
		{"/v1/allow", `{"key":"k","cost":0}`, "4", "1", 2},            // a peek
		{"/v1/refund", `{"reservation":"RSV","cost":1}`, "4", "2", 2}, // 1 s to refill from t+0.1 s: t+1.1 s
		{"/v1/allow", `{"key":"k","cost":3}`, "4", "2", 2},            // rejected: the state as it is
	} {
		a := serve(t, legacy, http.MethodPost, tc.target, strings.ReplaceAll(tc.body, "RSV", rsv))
		if r := reservationOf(t, a.body); r != "" {
			rsv = r
		}
		want := strconv.FormatInt(start+tc.reset, 10)
		if a.header.Get("X-RateLimit-Limit") != tc.limit || a.header.Get("X-RateLimit-Remaining") != tc.remaining || a.header.Get("X-RateLimit-Reset") != want {
			t.Errorf("%s %s: %d %v, want limit %s, remaining %s, reset %s", tc.target, tc.body, a.status, a.header, tc.limit, tc.remaining, want)
		}
		if a.header.Get("RateLimit") == "" {
			t.Errorf("%s %s: the RateLimit field is gone", tc.target, tc.body)
		}
	}
	if a := serve(t, legacy, http.MethodPost, "/v1/allow", `{"key":"svc"}`); a.header.Get("X-RateLimit-Limit") != "" {
		t.Errorf("unlimited tier: %v, want no X-RateLimit fields", a.header)
	}
	if a := serve(t, NewDecisions(e, nil), http.MethodPost, "/v1/allow", `{"key":"k"}`); a.header.Get("X-RateLimit-Limit") != "" || a.header.Get("X-RateLimit-Reset") != "" {
		t.Errorf("without the option: %v, want no X-RateLimit fields", a.header)
	}
}
