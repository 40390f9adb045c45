package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// concurrencyPolicy has a tier of 2 requests in flight (the default) and a stack of a rate and
// a concurrency limit, with leases long enough that none expires during a test.
const concurrencyPolicy = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: slow
  tiers:
  - name: slow
    algorithm: Concurrency
    concurrency: {limit: 2, leaseTimeout: 1h}
  - name: llm
    limits:
    - name: rate
      algorithm: TokenBucket
      tokenBucket: {capacity: 10, refillRate: 1, refillPeriod: 1h}
    - name: in-flight
      algorithm: Concurrency
      concurrency: {limit: 3, leaseTimeout: 1h}
  overrides:
  - tier: llm
    clientPrefixes: ["llm:"]
`

// TestPolicyFileWithConcurrencyOnMemory: a policy file with a Concurrency tier and a stack
// holding a concurrency limit loads on the memory store, and its clients are held to their
// places in flight (no lease is released here: the leases outlast the test), with the
// RateLimit-Policy field naming the quota unit.
func TestPolicyFileWithConcurrencyOnMemory(t *testing.T) {
	t.Parallel()
	d := start(t, hooks{}, "--policy-file", policyFile(t, t.TempDir(), concurrencyPolicy))
	for _, c := range []struct {
		key    string
		places int
		policy string
	}{
		{"alice", 2, `"slow";q=2;w=3600;qu="concurrent-requests"`},
		{"llm:bob", 3, `"llm/rate";q=10;w=36000, "llm/in-flight";q=3;w=3600;qu="concurrent-requests"`},
	} {
		for i := range c.places + 1 {
			want := http.StatusOK
			if i == c.places {
				want = http.StatusTooManyRequests
			}
			got := decide(t, d.decisions, c.key)
			if got.status != want {
				t.Fatalf("%s, request %d in flight: status %d, want %d (%v)", c.key, i+1, got.status, want, got.body)
			}
			if got.policy != c.policy {
				t.Errorf("%s: RateLimit-Policy %s, want %s", c.key, got.policy, c.policy)
			}
		}
	}
}

// TestPolicyFileConcurrencyOnRedis: on --store redis, a policy file's concurrency tier and
// stacked concurrency limit are decided in Redis (their leases are keys there) and released
// through /v1/release as on the memory store (checkConcurrencyReleases).
func TestPolicyFileConcurrencyOnRedis(t *testing.T) {
	t.Parallel()
	redistest.Require(t)
	srv := redistest.Start(t)
	d := start(t, hooks{}, "--policy-file", policyFile(t, t.TempDir(), concurrencyPolicy),
		"--store", "redis", "--redis-addr", srv.Addr(), "--store-timeout", "5s")
	checkConcurrencyReleases(t, d.decisions)
	// Each client's leases (alice's tier, bob's in-flight limit) and lease counter, and bob's rate.
	if keys := srv.Do(t, "DBSIZE"); keys != "5" {
		t.Errorf("redis holds %s keys, want 5: each client's leases and lease counter, and a rate", keys)
	}
}

// release posts a lease to /v1/release and returns the status and the answer.
func release(t *testing.T, base, lease string) (int, map[string]any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"lease": lease})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(base+"/v1/release", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatalf("decode the release's answer: %v", err)
	}
	return resp.StatusCode, answer
}

// TestPolicyFileConcurrencyReleases: through the daemon, a policy file's concurrency tier and
// stacked concurrency limit hand out leases that POST /v1/release gives back, one place each:
// a client at its limit is admitted again after a release, and a second release of one lease
// is refused and frees nothing.
func TestPolicyFileConcurrencyReleases(t *testing.T) {
	t.Parallel()
	d := start(t, hooks{}, "--policy-file", policyFile(t, t.TempDir(), concurrencyPolicy))
	checkConcurrencyReleases(t, d.decisions)
}

// checkConcurrencyReleases checks, through the daemon whose decisions are served at base, that
// concurrencyPolicy's concurrency tier and stacked concurrency limit hand out leases that POST
// /v1/release gives back, one place each: a client at its limit is admitted again after a
// release, and a second release of one lease is refused and frees nothing.
func checkConcurrencyReleases(t *testing.T, base string) {
	t.Helper()
	for _, c := range []struct {
		key    string
		places int
	}{{"alice", 2}, {"llm:bob", 3}} {
		var leases []string
		for i := range c.places {
			got := decide(t, base, c.key)
			lease, _ := got.body["lease"].(string)
			if got.status != http.StatusOK || lease == "" {
				t.Fatalf("%s, request %d: status %d, lease %q, want 200 with a lease (%v)", c.key, i+1, got.status, lease, got.body)
			}
			leases = append(leases, lease)
		}
		if got := decide(t, base, c.key); got.status != http.StatusTooManyRequests || got.body["lease"] != nil {
			t.Fatalf("%s over its places: status %d, %v, want 429 without a lease", c.key, got.status, got.body)
		}
		if status, answer := release(t, base, leases[0]); status != http.StatusOK {
			t.Fatalf("%s: release: %d %v, want 200", c.key, status, answer)
		}
		if status, answer := release(t, base, leases[0]); status != http.StatusConflict {
			t.Fatalf("%s: second release of one lease: %d %v, want 409", c.key, status, answer)
		}
		if got := decide(t, base, c.key); got.status != http.StatusOK {
			t.Fatalf("%s after a release: status %d, want 200 (%v)", c.key, got.status, got.body)
		}
		if got := decide(t, base, c.key); got.status != http.StatusTooManyRequests {
			t.Fatalf("%s: the second release freed a place: status %d, want 429 (%v)", c.key, got.status, got.body)
		}
	}
}
