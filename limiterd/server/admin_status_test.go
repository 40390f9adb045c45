package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
)

// TestReadyzStatusChecks checks that a status check (a shared store's reachability) never
// fails readiness, runs only for ?verbose, and is reported there with every readiness check.
func TestReadyzStatusChecks(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Second)))
	storeDown := errors.New("ping redis: connection refused")
	storeRuns := 0
	admin := NewAdmin(e, AdminOptions{
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
