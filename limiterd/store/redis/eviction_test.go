package redis

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// TestEvictionKeepsDeciding fills a Redis of 4 MB under maxmemory-policy volatile-ttl (the
// documented bound on client state) with ten times more clients than fit, all with state of one
// minute: every decision is still Redis's (none fails for the failure mode to answer), Redis
// evicts, and a client whose state lasts a day (exhausted, waiting for its refill) is still
// rejected: the eviction took the state closest to fresh, not its.
func TestEvictionKeepsDeciding(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", RecommendedEvictionPolicy)
	var logs testsupport.SyncBuffer
	// A timeout of a second: this test is about Redis refusing nothing, not its speed on a
	// shared machine.
	c := newClient(t, Options{Addrs: []string{srv.Addr()}, Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if strings.Contains(logs.String(), "WARN") {
		t.Errorf("warned about the recommended memory settings: %s", logs.String())
	}
	s := c.Store(t.Name())
	daily := tokenBucket(t, 5, 5, 24*time.Hour)
	for i := range 6 {
		d, err := s.Decide(t.Context(), "hot", limitertest.One(daily), time.Now(), 1, nil)
		if err != nil || d.Allowed != (i < 5) {
			t.Fatalf("hot client, decision %d: %+v, %v", i, d, err)
		}
	}
	flood := slidingWindow(t, 10, time.Minute)
	pad := strings.Repeat("x", 400)
	const batches, items = 60, 500
	failed := 0
	for b := range batches {
		reqs := make([]limiter.Request, items)
		for i := range reqs {
			reqs[i] = limiter.Request{Key: fmt.Sprintf("%s-%d-%d", pad, b, i), Stack: limitertest.One(flood), Cost: 1}
		}
		out := make([]limiter.Answer, items)
		s.DecideBatch(t.Context(), reqs, time.Now(), out)
		for _, a := range out {
			if a.Err != nil || !a.Allowed {
				failed++
				if failed == 1 {
					t.Errorf("a flooding client under eviction: %+v", a)
				}
			}
		}
	}
	evicted, _ := strconv.Atoi(srv.Info(t, "stats", "evicted_keys"))
	t.Logf("%d clients of one minute: %d evicted, %d failed", batches*items, evicted, failed)
	if evicted == 0 {
		t.Fatal("Redis evicted nothing: the test did not fill it")
	}
	if d, err := s.Decide(t.Context(), "hot", limitertest.One(daily), time.Now(), 1, nil); err != nil || d.Allowed {
		t.Errorf("the hot client after the flood: %+v, %v; want rejected (its day-long state kept)", d, err)
	}
}

// TestWarnsAboutUnboundedMemory checks that a client connecting to a Redis without maxmemory,
// or with noeviction, warns that client state is unbounded or that a full Redis will refuse
// decisions.
func TestWarnsAboutUnboundedMemory(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"--maxmemory", "64mb", "--maxmemory-policy", "noeviction"}} {
		srv := redistest.Start(t, args...)
		var logs testsupport.SyncBuffer
		newClient(t, Options{Addrs: []string{srv.Addr()}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), RecommendedEvictionPolicy) {
			t.Errorf("redis-server %v: no warning naming %s in %q", args, RecommendedEvictionPolicy, logs.String())
		}
	}
}
