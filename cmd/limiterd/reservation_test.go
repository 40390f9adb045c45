package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

const refundsPolicy = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: standard
  refunds: Enabled
  tiers:
  - name: standard
    algorithm: TokenBucket
    tokenBucket: {capacity: 3, refillRate: 1, refillPeriod: 1h}
`

// spendAndRefund spends 3 units of key and refunds them by the answer's reservation; it returns
// the reservation, the refund's status and its body.
func spendAndRefund(t *testing.T, base, key string) (string, int, string) {
	t.Helper()
	post := func(path, body string) (int, string) {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, body := post("/v1/allow", `{"key":"`+key+`","cost":3}`)
	var v struct {
		Reservation string `json:"reservation"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || status != 200 {
		t.Fatalf("allow: %d %s", status, body)
	}
	named := v.Reservation
	if named == "" {
		named = "none" // to see why a refund is refused
	}
	status, body = post("/v1/refund", `{"reservation":"`+named+`"}`)
	return v.Reservation, status, body
}

// TestReservationKey checks the three ways limiterd gets its reservation key: memory without a
// file (its own key: refunds work), Redis without a file (refunds refused, no reservation),
// Redis with a file (refunds work); and that a short key file stops limiterd.
func TestReservationKey(t *testing.T) {
	dir := t.TempDir()
	policy := policyFile(t, dir, refundsPolicy)
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("x", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte(strings.Repeat("x", 31)), 0o600); err != nil {
		t.Fatal(err)
	}

	d := start(t, hooks{}, "--policy-file", policy)
	if rsv, status, body := spendAndRefund(t, d.decisions, "m"); rsv == "" || status != 200 {
		t.Errorf("memory without a key file: reservation %q, refund %d %s", rsv, status, body)
	}
	// Memory replicas with the chart's shared key still sign with their own: a reservation of
	// one replica's state does not refund another's.
	d1 := start(t, hooks{}, "--policy-file", policy, "--reservation-key-file", keyFile)
	d2 := start(t, hooks{}, "--policy-file", policy, "--reservation-key-file", keyFile)
	rsv, _, _ := spendAndRefund(t, d1.decisions, "n")
	resp, err := http.Post(d2.decisions+"/v1/refund", "application/json", strings.NewReader(`{"reservation":"`+rsv+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("another memory replica's reservation: %d, want 403", resp.StatusCode)
	}

	cfg, err := parseFlags([]string{"--policy-file", policy, "--reservation-key-file", short}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newDaemon(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Errorf("a 31-byte key file: %v", err)
	}

	redistest.Require(t)
	srv := redistest.Start(t)
	redisArgs := []string{"--policy-file", policy, "--store", "redis", "--redis-addr", srv.Addr(), "--store-timeout", "5s"}
	d = start(t, hooks{}, redisArgs...)
	if rsv, status, body := spendAndRefund(t, d.decisions, "r"); rsv != "" || status != 403 || !strings.Contains(body, "--reservation-key-file") {
		t.Errorf("redis without a key file: reservation %q, refund %d %s; want none and 403", rsv, status, body)
	}
	d = start(t, hooks{}, append(redisArgs, "--reservation-key-file", keyFile)...)
	if rsv, status, body := spendAndRefund(t, d.decisions, "s"); rsv == "" || status != 200 {
		t.Errorf("redis with a key file: reservation %q, refund %d %s", rsv, status, body)
	}
}
