package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
)

// rules is a fake authorizer: "user verb namespace/resource" → allowed; path actions are
// "user verb path". failing makes every review fail.
type rules struct {
	allow   map[string]bool
	failing bool
	asked   []string
}

func (r *rules) authorizer() authorizer.Authorizer { return authorizer.AuthorizerFunc(r.authorize) }

func (r *rules) authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if r.failing {
		return authorizer.DecisionNoOpinion, "", errors.New("API server unreachable")
	}
	var k string
	if a.IsResourceRequest() {
		res := a.GetAPIGroup() + ":" + a.GetResource()
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		k = a.GetUser().GetName() + " " + a.GetVerb() + " " + a.GetNamespace() + "/" + res
	} else {
		k = a.GetUser().GetName() + " " + a.GetVerb() + " " + a.GetPath()
	}
	r.asked = append(r.asked, k)
	if r.allow[k] {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "no rule", nil
}

// tokens authenticates "token-<user>" as <user>.
var tokens = bearertoken.New(authenticator.TokenFunc(func(_ context.Context, token string) (*authenticator.Response, bool, error) {
	name, ok := strings.CutPrefix(token, "token-")
	if !ok {
		return nil, false, nil
	}
	return &authenticator.Response{User: &user.DefaultInfo{Name: name}}, true, nil
}))

func serveAs(t *testing.T, h http.Handler, token, method, target string) answer {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return answer{status: rec.Code, header: rec.Result().Header, body: rec.Body.String()}
}

func nsPolicy(namespace, name string) *v1alpha1.RateLimitPolicy {
	p := newPolicy(name, testsupport.TokenBucketTier("standard", 2, 1, time.Second))
	p.Namespace = namespace
	return p
}

func TestAdminAuthentication(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), nsPolicy("a", "api"))
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("m 1\n")) })
	admin := NewAdmin(e, AdminOptions{Metrics: metrics, Auth: adminauth.New(tokens, (&rules{}).authorizer(), "test")})
	for _, target := range []string{"/metrics", "/v1/policies", "/v1/clients?policy=a/api&key=k"} {
		for _, token := range []string{"", "wrong"} {
			a := serveAs(t, admin, token, http.MethodGet, target)
			if a.status != http.StatusUnauthorized || a.header.Get("WWW-Authenticate") == "" {
				t.Errorf("GET %s with token %q: %d %v, want 401 with a challenge", target, token, a.status, a.header)
				continue
			}
			a.errorText(t)
		}
	}
	a := serveAs(t, admin, "", http.MethodDelete, "/v1/clients?policy=a/api&key=k")
	if a.status != http.StatusUnauthorized {
		t.Errorf("DELETE without a token: %d, want 401", a.status)
	}
	// Health stays open for the kubelet.
	for _, target := range []string{"/healthz", "/readyz"} {
		if a := serveAs(t, admin, "", http.MethodGet, target); a.status != 200 {
			t.Errorf("%s without a token: %d, want 200", target, a.status)
		}
	}
	// Without an Auth, nothing but health is served.
	bare := NewAdmin(e, AdminOptions{Metrics: metrics})
	if a := serveAs(t, bare, "token-root", http.MethodDelete, "/v1/clients?policy=a/api&key=k"); a.status != http.StatusUnauthorized {
		t.Errorf("DELETE without an Auth: %d, want 401", a.status)
	}
	if a := serveAs(t, bare, "", http.MethodGet, "/healthz"); a.status != 200 {
		t.Errorf("/healthz without an Auth: %d, want 200", a.status)
	}
}

func TestAdminAuthorizationByNamespace(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, nsPolicy("a", "api"), nsPolicy("b", "api"))
	decisions := NewDecisions(e, nil)
	authz := &rules{allow: map[string]bool{
		"alice delete a/limiterd.dev:ratelimitpolicies/clients": true,
		"alice get a/limiterd.dev:ratelimitpolicies/clients":    true,
		"alice list a/limiterd.dev:ratelimitpolicies":           true,
		"prometheus get /metrics":                               true,
	}}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("m 1\n")) })
	admin := NewAdmin(e, AdminOptions{Metrics: metrics, Auth: adminauth.New(tokens, authz.authorizer(), "test")})

	for _, id := range []string{"a/api", "b/api"} {
		for range 2 {
			serve(t, decisions, http.MethodPost, "/v1/allow", `{"policy":"`+id+`","key":"k"}`)
		}
	}
	if a := serveAs(t, admin, "token-alice", http.MethodDelete, "/v1/clients?policy=a/api&key=k"); a.status != http.StatusNoContent {
		t.Fatalf("alice resets a/api: %d %s, want 204", a.status, a.body)
	}
	for _, tc := range []struct{ token, method, target string }{
		{"token-alice", http.MethodDelete, "/v1/clients?policy=b/api&key=k"},
		{"token-alice", http.MethodGet, "/v1/clients?policy=b/api&key=k"},
		{"token-alice", http.MethodDelete, "/v1/clients?policy=b/unknown&key=k"}, // 403, not 404: nothing revealed
		{"token-alice", http.MethodGet, "/metrics"},
		{"token-prometheus", http.MethodDelete, "/v1/clients?policy=a/api&key=k"},
	} {
		a := serveAs(t, admin, tc.token, tc.method, tc.target)
		if a.status != http.StatusForbidden {
			t.Errorf("%s %s %s: %d %s, want 403", tc.token, tc.method, tc.target, a.status, a.body)
			continue
		}
		a.errorText(t)
	}
	if a := serveAs(t, admin, "token-alice", http.MethodDelete, "/v1/clients?policy=a/unknown&key=k"); a.status != http.StatusNotFound {
		t.Errorf("alice resets a/unknown: %d, want 404 once authorized", a.status)
	}
	if a := serveAs(t, admin, "token-prometheus", http.MethodGet, "/metrics"); a.status != 200 || a.body != "m 1\n" {
		t.Errorf("prometheus scrapes: %d %q", a.status, a.body)
	}
	// Only a/api was reset.
	if a := serve(t, decisions, http.MethodPost, "/v1/allow", `{"policy":"a/api","key":"k"}`); a.status != 200 {
		t.Errorf("a/api after the reset: %d, want 200", a.status)
	}
	if a := serve(t, decisions, http.MethodPost, "/v1/allow", `{"policy":"b/api","key":"k"}`); a.status != 429 {
		t.Errorf("b/api after the refused reset: %d, want 429", a.status)
	}

	// The listing shows the namespaces the caller may list, asking once per namespace.
	authz.asked = nil
	a := serveAs(t, admin, "token-alice", http.MethodGet, "/v1/policies")
	var got PoliciesAnswer
	if err := json.Unmarshal([]byte(a.body), &got); a.status != 200 || err != nil {
		t.Fatalf("alice lists: %d %s %v", a.status, a.body, err)
	}
	if len(got.Policies) != 1 || got.Policies[0].ID != "a/api" {
		t.Errorf("alice sees %+v, want a/api only", got.Policies)
	}
	if len(authz.asked) != 2 {
		t.Errorf("reviews asked %q, want one per namespace", authz.asked)
	}
	a = serveAs(t, admin, "token-mallory", http.MethodGet, "/v1/policies")
	if err := json.Unmarshal([]byte(a.body), &got); a.status != 200 || err != nil || len(got.Policies) != 0 {
		t.Errorf("mallory lists: %d %s, want an empty list", a.status, a.body)
	}
	// A policy omitted is authorized as the only loaded one.
	one := NewAdmin(newEngine(t, clock, nsPolicy("b", "api")), AdminOptions{Auth: adminauth.New(tokens, authz.authorizer(), "test")})
	if a := serveAs(t, one, "token-alice", http.MethodDelete, "/v1/clients?key=k"); a.status != http.StatusForbidden {
		t.Errorf("alice resets the only policy b/api by omitting it: %d, want 403", a.status)
	}
}

// TestAdminAuthenticationUnavailable: a token that cannot be reviewed (the TokenReview fails, as
// when the API server cannot be reached) answers 401 with a challenge, as kube-apiserver does,
// not 503; the cause stays in the log.
func TestAdminAuthenticationUnavailable(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), nsPolicy("a", "api"))
	unreachable := bearertoken.New(authenticator.TokenFunc(func(context.Context, string) (*authenticator.Response, bool, error) {
		return nil, false, errors.New("API server unreachable")
	}))
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("m 1\n")) })
	admin := NewAdmin(e, AdminOptions{Metrics: metrics, Auth: adminauth.New(unreachable, (&rules{}).authorizer(), "test")})
	for _, target := range []string{"/metrics", "/v1/policies", "/v1/clients?policy=a/api&key=k"} {
		a := serveAs(t, admin, "token-alice", http.MethodGet, target)
		if a.status != http.StatusUnauthorized || a.header.Get("WWW-Authenticate") == "" {
			t.Errorf("GET %s while token reviews fail: %d %s, want 401 with a challenge", target, a.status, a.body)
			continue
		}
		if strings.Contains(a.body, "unreachable") {
			t.Errorf("GET %s: the answer tells the cause: %s", target, a.body)
		}
	}
}

func TestAdminAuthorizationUnavailable(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), nsPolicy("a", "api"))
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.New(tokens, (&rules{failing: true}).authorizer(), "test")})
	for _, target := range []string{"/v1/policies", "/v1/clients?policy=a/api&key=k"} {
		a := serveAs(t, admin, "token-alice", http.MethodGet, target)
		if a.status != http.StatusServiceUnavailable {
			t.Errorf("GET %s while reviews fail: %d %s, want 503", target, a.status, a.body)
			continue
		}
		a.errorText(t)
	}
}

func TestAdminPolicies(t *testing.T) {
	p := newPolicy("api", testsupport.TokenBucketTier("standard", 10, 5, time.Second), testsupport.UnlimitedTier("internal"))
	p.Spec.Overrides = append(p.Spec.Overrides,
		overrideOf("internal", []string{"svc-a", "svc-b"}, []string{"svc-"}))
	h := NewAdmin(newEngine(t, testsupport.NewClock(), p, newPolicy("b", testsupport.SlidingWindowTier("w", 5, time.Minute))),
		AdminOptions{Auth: adminauth.Open()})
	a := serve(t, h, http.MethodGet, "/v1/policies", "")
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	var got PoliciesAnswer
	if err := json.Unmarshal([]byte(a.body), &got); err != nil {
		t.Fatalf("decode %s: %v", a.body, err)
	}
	if len(got.Policies) != 2 || got.Policies[0].ID != "default/api" || got.Policies[1].ID != "default/b" {
		t.Fatalf("policies %+v, want default/api then default/b", got.Policies)
	}
	api := got.Policies[0]
	if api.Generation != 3 || api.DefaultTier != "standard" || api.Overrides != 1 ||
		api.OverrideClients != 2 || api.OverridePrefixes != 1 || len(api.Tiers) != 2 {
		t.Errorf("default/api = %+v", api)
	}
	if tb := api.Tiers[0].TokenBucket; tb == nil || tb.Capacity != 10 || tb.RefillRate != 5 || api.Tiers[0].Algorithm != "TokenBucket" {
		t.Errorf("tier standard = %+v", api.Tiers[0])
	}
	if api.Tiers[1].Name != "internal" || api.Tiers[1].Algorithm != "Unlimited" {
		t.Errorf("tier internal = %+v", api.Tiers[1])
	}
	if a := serve(t, h, http.MethodPost, "/v1/policies", ""); a.status != 405 {
		t.Errorf("POST /v1/policies: %d, want 405", a.status)
	}
	if a := serve(t, NewAdmin(newEngine(t, testsupport.NewClock()), AdminOptions{Auth: adminauth.Open()}), http.MethodGet, "/v1/policies", ""); a.status != 503 {
		t.Errorf("/v1/policies before any policy: %d, want 503", a.status)
	}
}
