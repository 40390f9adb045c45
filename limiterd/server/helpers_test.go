package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// newPolicy returns a policy default/<name> whose default tier is the first tier.
func newPolicy(name string, tiers ...v1alpha1.Tier) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Generation: 3},
		Spec:       v1alpha1.RateLimitPolicySpec{Tiers: tiers, DefaultTier: tiers[0].Name},
	}
}

// newEngine returns an engine on clock with the policies loaded (none: not ready).
func newEngine(t testing.TB, clock *testsupport.Clock, policies ...*v1alpha1.RateLimitPolicy) *engine.Engine {
	t.Helper()
	return testsupport.NewEngine(t, clock.Now, policies...)
}

// answer is a recorded response.
type answer struct {
	status int
	header http.Header
	body   string
}

func serve(t testing.TB, h http.Handler, method, target, body string) answer {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, r)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rec.Result()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: string(b)}
}

// errorText returns the "error" of an error answer, failing the test if the body is not one.
func (a answer) errorText(t testing.TB) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(a.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == "" {
		t.Fatalf("body %q is not an error answer: %v", a.body, err)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type = %q, want application/json", ct)
	}
	return e.Error
}

func overrideOf(tier string, clients, prefixes []string) v1alpha1.Override {
	return v1alpha1.Override{Tier: tier, Clients: clients, ClientPrefixes: prefixes}
}
