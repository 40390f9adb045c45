package redis_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// sentinelPolicies are one policy per failure mode, each admitting everything while Redis
// answers (so that a rejection or a store error is the failure mode's), and default/exact, a
// bucket of 3 an hour, for counts after the failover.
const sentinelPolicies = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: open}
spec:
  defaultTier: standard
  failureMode: Open
  tiers: [{name: standard, algorithm: TokenBucket, tokenBucket: {capacity: 1000000, refillRate: 1000000, refillPeriod: 1s}}]
---
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: closed}
spec:
  defaultTier: standard
  failureMode: Closed
  tiers: [{name: standard, algorithm: TokenBucket, tokenBucket: {capacity: 1000000, refillRate: 1000000, refillPeriod: 1s}}]
---
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: local}
spec:
  defaultTier: standard
  failureMode: Local
  tiers: [{name: standard, algorithm: TokenBucket, tokenBucket: {capacity: 1000000, refillRate: 1000000, refillPeriod: 1s}}]
---
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: exact}
spec:
  defaultTier: standard
  failureMode: Closed
  tiers: [{name: standard, algorithm: TokenBucket, tokenBucket: {capacity: 3, refillRate: 1, refillPeriod: 1h}}]
`

// TestSentinelFailoverFailureModes runs limiterd through 3 Sentinels (quorum 2, down after 1 s)
// on a master and one replica, decides on a few keys of a policy per failure mode from 3
// goroutines each, kills the master (SIGKILL), and measures per failure mode what limiterd
// answered until the new master served decisions: Open admits, Closed rejects, Local decides
// in process. No request may wait past the store timeout and slack; Closed must admit again
// within failoverBound of the kill; then a fresh client of a limit of 3 is admitted exactly 3
// times.
func TestSentinelFailoverFailureModes(t *testing.T) {
	t.Parallel()
	const (
		timeout       = 100 * time.Millisecond
		slack         = 2 * time.Second // HTTP, a loaded machine
		failoverBound = 30 * time.Second
		perPolicy     = 3
	)
	g := redistest.StartSentinels(t, redistest.SentinelConfig{Name: "limiterd", Quorum: 2,
		DownAfter: time.Second, FailoverTimeout: 3 * time.Second})
	file := filepath.Join(t.TempDir(), "policies.yaml")
	writePolicies(t, file, sentinelPolicies)
	r := startReplica(t, "--policy-file", file, "--store", "redis", "--redis-sentinel-master", g.Name,
		"--redis-sentinel-addr", strings.Join(g.SentinelAddrs(), ","), "--store-timeout", timeout.String())

	type outcome struct {
		at     time.Time
		status int
	}
	var (
		mu       sync.Mutex
		outcomes = map[string][]outcome{} // by policy
		longest  time.Duration
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	modes := []string{"open", "closed", "local"}
	for _, p := range modes {
		for w := range perPolicy {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					start := time.Now()
					status, _ := allow(t, r, "default/"+p, fmt.Sprint("hot-", (w+i)%4))
					took := time.Since(start)
					mu.Lock()
					outcomes[p] = append(outcomes[p], outcome{start, status})
					longest = max(longest, took)
					mu.Unlock()
				}
			})
		}
	}
	halted := false
	halt := func() {
		if !halted {
			halted = true
			close(stop)
			wg.Wait()
		}
	}
	defer halt()
	time.Sleep(time.Second)
	errorsBefore := map[string]float64{}
	for _, p := range modes {
		errorsBefore[p] = metric(t, r, `limiterd_store_errors_total{policy="default/`+p+`"}`)
	}

	g.Master.Stop()
	killed := time.Now()    // from here, no request can reach the old master
	var recovered time.Time // the first request admitted under Closed after the kill
	deadline := killed.Add(failoverBound)
	for recovered.IsZero() {
		if time.Now().After(deadline) {
			t.Fatalf("failure mode Closed still rejects %v after the master was killed", failoverBound)
		}
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		for _, o := range outcomes["closed"] { // in the order they ended
			if o.at.After(killed) && o.status == http.StatusOK && (recovered.IsZero() || o.at.Before(recovered)) {
				recovered = o.at
			}
		}
		mu.Unlock()
	}
	time.Sleep(time.Second)
	halt()
	for _, o := range outcomes["closed"] { // one that started sooner may have ended later
		if o.at.After(killed) && o.status == http.StatusOK && o.at.Before(recovered) {
			recovered = o.at
		}
	}

	t.Logf("master %s killed; the new master %s served decisions again %v after the kill; longest request %v",
		g.Master.Addr(), g.MasterAddr(t), recovered.Sub(killed).Round(time.Millisecond), longest.Round(time.Millisecond))
	for _, p := range modes {
		statuses := map[int]int{}
		n := 0
		for _, o := range outcomes[p] {
			if o.at.After(killed) && o.at.Before(recovered) {
				statuses[o.status]++
				n++
			}
		}
		storeErrors := metric(t, r, `limiterd_store_errors_total{policy="default/`+p+`"}`) - errorsBefore[p]
		t.Logf("failure mode %-6s until the new master served: %d decisions, statuses %v; store errors (answered by the failure mode) %v",
			p, n, statuses, storeErrors)
		if storeErrors == 0 {
			t.Errorf("%s: no store error counted while the master was down", p)
		}
		want := http.StatusOK // Open admits; Local admits from memory, below its limit
		if p == "closed" {
			want = http.StatusTooManyRequests
		}
		for status, count := range statuses {
			if status != want {
				t.Errorf("%s: %d decisions answered %d while the master was down, want %d", p, count, status, want)
			}
		}
	}
	if bound := timeout + timeout/16 + slack; longest > bound {
		t.Errorf("a request took %v, want at most the store timeout and slack %v", longest, bound)
	}

	// Counts are exact on the new master: a fresh client of a limit of 3 is admitted 3 times.
	admitted := 0
	for range 10 {
		switch status, body := allow(t, r, "default/exact", "fresh"); status {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d: %v", status, body)
		}
	}
	if admitted != 3 {
		t.Errorf("a fresh client of a limit of 3 was admitted %d times of 10 after the failover, want 3", admitted)
	}
}
