package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/openapi"
	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
	"github.com/limiterd/limiterd/limiterd/policy"
)

func TestAdminHealthAndReadiness(t *testing.T) {
	clock := testsupport.NewClock()
	notReady := NewAdmin(newEngine(t, clock), AdminOptions{Auth: adminauth.Open()})
	if a := serve(t, notReady, http.MethodGet, "/healthz", ""); a.status != 200 || !strings.Contains(a.body, `"ok"`) {
		t.Errorf("healthz before policies: %d %s, want 200", a.status, a.body)
	}
	a := serve(t, notReady, http.MethodGet, "/readyz", "")
	if a.status != 503 {
		t.Fatalf("readyz before policies: %d %s, want 503", a.status, a.body)
	}
	var status StatusAnswer
	if err := json.Unmarshal([]byte(a.body), &status); err != nil || status.Failed["policies"] == "" {
		t.Errorf("readyz body %s: %v, want the policies check failed", a.body, err)
	}

	e := newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Second)))
	if a := serve(t, NewAdmin(e, AdminOptions{Auth: adminauth.Open()}), http.MethodGet, "/readyz", ""); a.status != 200 {
		t.Errorf("readyz with policies: %d %s, want 200", a.status, a.body)
	}

	// Extra checks take part, each bounded by the timeout.
	storeDown := errors.New("store unreachable")
	var sawDeadline bool
	admin := NewAdmin(e, AdminOptions{
		Auth:             adminauth.Open(),
		ReadinessTimeout: time.Minute,
		ReadinessChecks: []ReadinessCheck{
			{Name: "store", Check: func(ctx context.Context) error {
				_, sawDeadline = ctx.Deadline()
				return storeDown
			}},
			{Name: "fine", Check: func(context.Context) error { return nil }},
		},
	})
	a = serve(t, admin, http.MethodGet, "/readyz", "")
	if a.status != 503 || !strings.Contains(a.body, storeDown.Error()) || strings.Contains(a.body, "fine") {
		t.Errorf("readyz with a failing check: %d %s", a.status, a.body)
	}
	if !sawDeadline {
		t.Error("readiness check ran without a deadline")
	}
	if a := serve(t, admin, http.MethodPost, "/readyz", ""); a.status != 405 {
		t.Errorf("POST /readyz: %d, want 405", a.status)
	}
	if a := serve(t, admin, http.MethodGet, "/nope", ""); a.status != 404 {
		t.Errorf("unknown path: %d, want 404", a.status)
	}
}

func TestAdminMetricsRoute(t *testing.T) {
	e := newEngine(t, testsupport.NewClock())
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("limiterd_x 1\n")) })
	if a := serve(t, NewAdmin(e, AdminOptions{Metrics: metrics, Auth: adminauth.Open()}), http.MethodGet, "/metrics", ""); a.status != 200 || a.body != "limiterd_x 1\n" {
		t.Errorf("/metrics: %d %q", a.status, a.body)
	}
	if a := serve(t, NewAdmin(e, AdminOptions{Auth: adminauth.Open()}), http.MethodGet, "/metrics", ""); a.status != 404 {
		t.Errorf("/metrics without a handler: %d, want 404", a.status)
	}
}

func TestAdminClientsPeekAndReset(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Second), testsupport.UnlimitedTier("internal")))
	decisions := NewDecisions(e, nil)
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})

	peek := func() ClientAnswer {
		t.Helper()
		a := serve(t, admin, http.MethodGet, "/v1/clients?policy=default/api&key=alice", "")
		if a.status != 200 {
			t.Fatalf("peek: %d %s", a.status, a.body)
		}
		var c ClientAnswer
		if err := json.Unmarshal([]byte(a.body), &c); err != nil {
			t.Fatalf("decode %s: %v", a.body, err)
		}
		return c
	}
	c := peek()
	if c.Policy != "default/api" || c.Tier != "standard" || !c.Allowed || *c.Limit != 2 || *c.Remaining != 2 || c.ResetAfterSeconds != 0 {
		t.Fatalf("fresh client: %+v", c)
	}
	serve(t, decisions, http.MethodPost, "/v1/allow", `{"key":"alice"}`)
	serve(t, decisions, http.MethodPost, "/v1/allow", `{"key":"alice"}`)
	for range 3 { // peeking consumes nothing
		c = peek()
		if c.Allowed || *c.Remaining != 0 || c.ResetAfterSeconds != 2 || c.RetryAfterSeconds != 1 {
			t.Fatalf("exhausted client: %+v", c)
		}
	}
	if a := serve(t, admin, http.MethodDelete, "/v1/clients?key=alice", ""); a.status != http.StatusNoContent {
		t.Fatalf("reset: %d %s", a.status, a.body)
	}
	if a := serve(t, decisions, http.MethodPost, "/v1/allow", `{"key":"alice"}`); a.status != 200 || !strings.Contains(a.body, `"remaining":1`) {
		t.Fatalf("decision after the reset: %d %s, want a fresh allowance", a.status, a.body)
	}
}

func TestAdminClientsErrors(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock,
		newPolicy("a", testsupport.TokenBucketTier("standard", 2, 1, time.Second)),
		newPolicy("b", testsupport.TokenBucketTier("standard", 2, 1, time.Second)))
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})
	for _, tc := range []struct {
		method, target string
		status         int
	}{
		{"GET", "/v1/clients?policy=default/a", 400},
		{"GET", "/v1/clients?policy=default/a&key=k&cost=1", 400},
		{"GET", "/v1/clients?policy=default/a&key=k&key=j", 400},
		{"GET", "/v1/clients?key=k", 400}, // two policies loaded
		{"GET", "/v1/clients?policy=default/c&key=k", 404},
		{"GET", "/v1/clients?policy=a&key=k", 404}, // a bare name is not default/a here, unlike /v1/allow (docs/gateways.md)
		{"DELETE", "/v1/clients?policy=a&key=k", 404},
		{"DELETE", "/v1/clients?policy=default/c&key=k", 404},
		{"POST", "/v1/clients?policy=default/a&key=k", 405},
	} {
		a := serve(t, admin, tc.method, tc.target, "")
		if a.status != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.target, a.status, a.body, tc.status)
			continue
		}
		a.errorText(t)
	}
	if a := serve(t, NewAdmin(newEngine(t, clock), AdminOptions{Auth: adminauth.Open()}), http.MethodGet, "/v1/clients?key=k", ""); a.status != 503 {
		t.Errorf("before policies: %d %s, want 503", a.status, a.body)
	}
}

// TestAdminResetForgetsRemovedLimits resets a client through the admin API after a policy edit
// removed one of its tier's limits: when a later edit re-adds the limit, the client's next
// request is decided as its first by every limit, the re-added one included (issue 35).
func TestAdminResetForgetsRemovedLimits(t *testing.T) {
	clock := testsupport.NewClock()
	stacked := newPolicy("api", testsupport.StackedTier("paid",
		testsupport.TokenBucketLimit("burst", 2, 1, time.Hour), testsupport.SlidingWindowLimit("daily", 5, time.Hour)))
	edited := newPolicy("api", testsupport.StackedTier("paid", testsupport.SlidingWindowLimit("daily", 5, time.Hour)))
	e := newEngine(t, clock, stacked)
	decisions := NewDecisions(e, nil)
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})
	load := func(p *v1alpha1.RateLimitPolicy) {
		t.Helper()
		compiled, err := policy.Compile(p)
		if err != nil {
			t.Fatal(err)
		}
		set, err := policy.NewSet(compiled)
		if err != nil {
			t.Fatal(err)
		}
		e.Swap(set)
	}
	allow := func() string {
		t.Helper()
		a := serve(t, decisions, http.MethodPost, "/v1/allow", `{"key":"alice"}`)
		if a.status != 200 {
			t.Fatalf("decision: %d %s", a.status, a.body)
		}
		return a.body
	}
	allow()
	allow() // burst is empty
	load(edited)
	allow()
	if a := serve(t, admin, http.MethodDelete, "/v1/clients?policy=default/api&key=alice", ""); a.status != http.StatusNoContent {
		t.Fatalf("reset: %d %s", a.status, a.body)
	}
	load(stacked)
	want := limitJSON("burst", true, 2, 1, time.Hour) + "," + limitJSON("daily", true, 5, 4, time.Hour)
	if body := allow(); !strings.Contains(body, want) {
		t.Fatalf("first decision after the reset and the re-added limit: %s\n want the limits %s", body, want)
	}
}

// TestOpenAPIServed: the admin API serves the spec to every caller, unauthenticated, as it is.
func TestOpenAPIServed(t *testing.T) {
	admin := NewAdmin(newEngine(t, testsupport.NewClock()), AdminOptions{}) // no Auth: every other path is 401
	a := serve(t, admin, http.MethodGet, OpenAPIPath, "")
	if a.status != 200 || a.header.Get("Content-Type") != "application/yaml" || !bytes.Equal([]byte(a.body), openapi.Spec) {
		t.Fatalf("GET %s: %d %v, want 200 application/yaml with api/openapi/openapi.yaml", OpenAPIPath, a.status, a.header)
	}
	if a := serve(t, admin, http.MethodGet, "/v1/policies", ""); a.status != 401 {
		t.Fatalf("GET /v1/policies without Auth: %d, want 401", a.status)
	}
	if a := serve(t, admin, http.MethodDelete, OpenAPIPath, ""); a.status != 405 || !slices.Equal(a.header["Allow"], []string{"GET"}) {
		t.Fatalf("DELETE %s: %d %v, want 405", OpenAPIPath, a.status, a.header)
	}
}
