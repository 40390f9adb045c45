package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
)

func decodeTop(t *testing.T, a answer) TopAnswer {
	t.Helper()
	var top TopAnswer
	dec := json.NewDecoder(strings.NewReader(a.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&top); err != nil || a.status != http.StatusOK {
		t.Fatalf("top answer %d %s: %v", a.status, a.body, err)
	}
	return top
}

func clientsOf(top TopAnswer) string {
	var s []string
	for _, c := range top.Clients {
		s = append(s, fmt.Sprintf("%s=%d±%d", c.Key, c.Count, c.Error))
	}
	return strings.Join(s, " ")
}

func TestAdminTop(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Hour)))
	decisions := NewDecisions(e, nil)
	for key, n := range map[string]int{"alice": 5, "bob": 3, "carol": 1} {
		for range n {
			serve(t, decisions, http.MethodPost, "/v1/allow", `{"policy":"default/api","key":"`+key+`"}`)
		}
	}
	serve(t, decisions, http.MethodPost, "/v1/allow", `{"policy":"default/api","key":"alice","cost":0}`) // a peek
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open(), Replica: "limiterd-0"})

	top := decodeTop(t, serve(t, admin, http.MethodGet, "/v1/top?policy=default/api", ""))
	if got := clientsOf(top); got != "alice=3±0 bob=1±0" {
		t.Errorf("rejected: %s, want alice=3±0 bob=1±0", got)
	}
	if top.Policy != "default/api" || top.Replica != "limiterd-0" || top.By != "rejected" || top.Decisions != 4 ||
		top.PeriodSeconds < 4*60 || top.PeriodSeconds > 5*60 || !top.To.Equal(clock.Now()) || top.ErrorBound != 0 {
		t.Errorf("answer %+v", top)
	}
	top = decodeTop(t, serve(t, admin, http.MethodGet, "/v1/top?by=admitted&n=2", "")) // the only policy
	if got := clientsOf(top); got != "alice=2±0 bob=2±0" || top.By != "admitted" || top.Decisions != 5 {
		t.Errorf("admitted, n=2: %s (%+v)", got, top)
	}
	if top := decodeTop(t, serve(t, admin, http.MethodGet, "/v1/top?by=admitted&n=1000", "")); len(top.Clients) != 3 {
		t.Errorf("n=1000: %s", clientsOf(top))
	}
	// Five minutes on, the period holds none of it.
	clock.Advance(5 * time.Minute)
	if top := decodeTop(t, serve(t, admin, http.MethodGet, "/v1/top", "")); len(top.Clients) != 0 || top.Clients == nil {
		t.Errorf("five minutes on: %+v, want an empty list", top.Clients)
	}
}

// Bad input gets a 4xx with a JSON message; a huge n is refused, not served.
func TestAdminTopBadInput(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Hour)),
		newPolicy("web", testsupport.TokenBucketTier("standard", 2, 1, time.Hour)))
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})
	for _, tc := range []struct {
		target string
		status int
		says   string
	}{
		{"/v1/top?policy=default/api&n=1001", 400, "1000"},
		{"/v1/top?policy=default/api&n=1000000000", 400, "1000"},
		{"/v1/top?policy=default/api&n=99999999999999999999999", 400, "1000"},
		{"/v1/top?policy=default/api&n=0", 400, "1000"},
		{"/v1/top?policy=default/api&n=-5", 400, "1000"},
		{"/v1/top?policy=default/api&n=ten", 400, "1000"},
		{"/v1/top?policy=default/api&n=", 400, "1000"},
		{"/v1/top?policy=default/api&by=everyone", 400, "by"},
		{"/v1/top?policy=default/api&key=alice", 400, "unknown"},
		{"/v1/top?policy=default/api&n=1&n=2", 400, "twice"},
		{"/v1/top?policy=default/api&%zz", 400, "malformed"},
		{"/v1/top?policy=default/nope", 404, "unknown policy"},
		{"/v1/top?policy=nonsense", 404, "unknown policy"},
		{"/v1/top?policy=" + strings.Repeat("x", MaxPolicyBytes+1), 400, ""},
		{"/v1/top", 400, "several policies"},
	} {
		a := serve(t, admin, http.MethodGet, tc.target, "")
		if a.status != tc.status {
			t.Errorf("%.80s: %d %s, want %d", tc.target, a.status, a.body, tc.status)
			continue
		}
		if msg := a.errorText(t); !strings.Contains(msg, tc.says) {
			t.Errorf("%.80s: error %q, want it to say %q", tc.target, msg, tc.says)
		}
	}
	if a := serve(t, admin, http.MethodPost, "/v1/top?policy=default/api", ""); a.status != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", a.status)
	}
	noTop := engine.New(engine.Options{NoTopClients: true})
	p, err := policy.Compile(newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.NewSet(p)
	if err != nil {
		t.Fatal(err)
	}
	noTop.Swap(set)
	off := NewAdmin(noTop, AdminOptions{Auth: adminauth.Open()})
	if a := serve(t, off, http.MethodGet, "/v1/top", ""); a.status != 404 || !strings.Contains(a.errorText(t), "not recorded") {
		t.Errorf("with the record off: %d %s, want 404", a.status, a.body)
	}
}

// The endpoint is not reachable without authentication, nor without the permission to read the
// policy's clients; an unauthorized caller does not learn whether a policy is loaded.
func TestAdminTopAuthorization(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), nsPolicy("a", "api"), nsPolicy("b", "api"))
	decisions := NewDecisions(e, nil)
	for range 3 {
		serve(t, decisions, http.MethodPost, "/v1/allow", `{"policy":"b/api","key":"secret-customer"}`)
	}
	authz := &rules{allow: map[string]bool{
		"alice get a/limiterd.dev:ratelimitpolicies/clients":   true,
		"carol list b/limiterd.dev:ratelimitpolicies":          true, // may list, not read clients
		"dave delete b/limiterd.dev:ratelimitpolicies/clients": true, // may reset, not read
	}}
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.New(tokens, authz.authorizer(), "test")})
	for _, token := range []string{"", "wrong"} {
		a := serveAs(t, admin, token, http.MethodGet, "/v1/top?policy=b/api")
		if a.status != http.StatusUnauthorized || strings.Contains(a.body, "secret-customer") {
			t.Errorf("token %q: %d %s, want 401", token, a.status, a.body)
		}
	}
	bare := NewAdmin(e, AdminOptions{})
	if a := serveAs(t, bare, "token-alice", http.MethodGet, "/v1/top?policy=b/api"); a.status != http.StatusUnauthorized {
		t.Errorf("without an Auth: %d, want 401", a.status)
	}
	for _, tc := range []struct{ token, target string }{
		{"token-alice", "/v1/top?policy=b/api"},
		{"token-alice", "/v1/top?policy=b/unknown"}, // 403, not 404: nothing revealed
		{"token-carol", "/v1/top?policy=b/api"},
		{"token-dave", "/v1/top?policy=b/api"},
		{"token-mallory", "/v1/top?policy=b/api&by=admitted"},
	} {
		a := serveAs(t, admin, tc.token, http.MethodGet, tc.target)
		if a.status != http.StatusForbidden || strings.Contains(a.body, "secret-customer") {
			t.Errorf("%s %s: %d %s, want 403", tc.token, tc.target, a.status, a.body)
			continue
		}
		if msg := a.errorText(t); !strings.Contains(msg, "ratelimitpolicies/clients") {
			t.Errorf("403 %q does not name the permission", msg)
		}
	}
	if a := serveAs(t, admin, "token-alice", http.MethodGet, "/v1/top?policy=a/unknown"); a.status != http.StatusNotFound {
		t.Errorf("alice asks for a/unknown: %d, want 404 once authorized", a.status)
	}
	authz.allow["alice get b/limiterd.dev:ratelimitpolicies/clients"] = true
	if top := decodeTop(t, serveAs(t, admin, "token-alice", http.MethodGet, "/v1/top?policy=b/api&by=admitted")); clientsOf(top) != "secret-customer=2±0" {
		t.Errorf("alice, authorized: %s", clientsOf(top))
	}
}
