package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
)

// TestReadyzStatusChecks checks that a status check (a shared store's reachability) never
// fails readiness, runs only for ?verbose, and is reported there with every readiness check.
func TestReadyzStatusChecks(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Second)))
	storeDown := errors.New("ping redis: connection refused")
	storeRuns := 0
	admin := NewAdmin(e, AdminOptions{
		Auth: adminauth.Open(),
		StatusChecks: []ReadinessCheck{{Name: "store", Check: func(context.Context) error {
			storeRuns++
			return storeDown
		}}},
	})
	a := serve(t, admin, http.MethodGet, "/readyz", "")
	if a.status != 200 || storeRuns != 0 {
		t.Fatalf("/readyz with the store down: %d %s (store checked %d times), want 200 without checking it", a.status, a.body, storeRuns)
	}
	a = serve(t, admin, http.MethodGet, "/readyz?verbose", "")
	var status StatusAnswer
	if err := json.Unmarshal([]byte(a.body), &status); err != nil {
		t.Fatal(err)
	}
	if a.status != 200 || status.Status != "ready" || len(status.Failed) != 0 ||
		status.Checks["store"] != storeDown.Error() || status.Checks["policies"] != "ok" {
		t.Errorf("/readyz?verbose with the store down: %d %s", a.status, a.body)
	}

	// A failing readiness check still fails readiness, verbose or not.
	notReady := NewAdmin(e, AdminOptions{
		Auth:            adminauth.Open(),
		ReadinessChecks: []ReadinessCheck{{Name: "shutdown", Check: func(context.Context) error { return errors.New("shutting down") }}},
	})
	a = serve(t, notReady, http.MethodGet, "/readyz?verbose", "")
	if err := json.Unmarshal([]byte(a.body), &status); err != nil {
		t.Fatal(err)
	}
	if a.status != 503 || status.Failed["shutdown"] != "shutting down" || status.Checks["shutdown"] != "shutting down" {
		t.Errorf("/readyz?verbose while shutting down: %d %s", a.status, a.body)
	}
}

// TestReadyzDetailsNeedAuthorization: /readyz, verbose or not, names the failing checks to
// anyone (the kubelet needs the status only), but shows their errors, which may name a store's
// address, only to a caller allowed to get ReadinessDetailsPath. Before, /readyz?verbose showed
// every error to whoever reached the port.
func TestReadyzDetailsNeedAuthorization(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Second)))
	storeDown := errors.New("dial tcp 10.1.2.3:6379: connect: connection refused")
	checks := func(auth *adminauth.Auth, ready bool) *Admin {
		opts := AdminOptions{Auth: auth, StatusChecks: []ReadinessCheck{{Name: "store", Check: func(context.Context) error { return storeDown }}}}
		if !ready {
			opts.ReadinessChecks = []ReadinessCheck{{Name: "configmaps", Check: func(context.Context) error { return storeDown }}}
		}
		return NewAdmin(e, opts)
	}
	authz := &rules{allow: map[string]bool{"monitor get " + ReadinessDetailsPath: true}}
	auth := adminauth.New(tokens, authz.authorizer(), "test")
	failing := adminauth.New(tokens, (&rules{failing: true}).authorizer(), "test")
	for _, c := range []struct {
		name    string
		admin   *Admin
		token   string
		details bool
	}{
		{"no Auth", checks(nil, true), "", false},
		{"no token", checks(auth, true), "", false},
		{"an unknown token", checks(auth, true), "wrong", false},
		{"an unauthorized caller", checks(auth, true), "token-alice", false},
		{"no review", checks(failing, true), "token-monitor", false},
		{"an authorized caller", checks(auth, true), "token-monitor", true},
		{"not ready, no token", checks(auth, false), "", false},
		{"not ready, an authorized caller", checks(auth, false), "token-monitor", true},
	} {
		for _, target := range []string{"/readyz", "/readyz?verbose"} {
			a := serveAs(t, c.admin, c.token, http.MethodGet, target)
			var status StatusAnswer
			if err := json.Unmarshal([]byte(a.body), &status); err != nil {
				t.Fatalf("%s: %s: %v", c.name, a.body, err)
			}
			want := checkFailed
			if c.details {
				want = storeDown.Error()
			}
			verbose := strings.HasSuffix(target, "verbose")
			shown := c.details && (verbose || strings.HasPrefix(c.name, "not ready"))
			if strings.Contains(a.body, "10.1.2.3") != shown {
				t.Errorf("%s: GET %s: %d %s: the store's address shown: %v, want %v", c.name, target, a.status, a.body, !shown, shown)
			}
			if verbose && status.Checks["store"] != want {
				t.Errorf("%s: GET %s: %s, want the store check %q", c.name, target, a.body, want)
			}
			if strings.HasPrefix(c.name, "not ready") {
				if a.status != 503 || status.Failed["configmaps"] != want {
					t.Errorf("%s: GET %s: %d %s, want 503 with configmaps %q", c.name, target, a.status, a.body, want)
				}
			} else if a.status != 200 {
				t.Errorf("%s: GET %s: %d %s, want 200", c.name, target, a.status, a.body)
			}
		}
	}
}
