package redis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// rejectedAndCached drives key on s until it is rejected, then checks that the next rejection
// is answered from s's cache.
func rejectedAndCached(t *testing.T, c *Client, s *Store, key string, rl limiter.RateLimiter, now time.Time) {
	t.Helper()
	for i := 0; decide(t, s, key, rl, now, 1).Allowed; i++ {
		if i > 100 {
			t.Fatal("never rejected")
		}
	}
	hits := c.RejectCacheStats().Hits
	if d := decide(t, s, key, rl, now, 1); d.Allowed || c.RejectCacheStats().Hits != hits+1 {
		t.Fatalf("second rejection %+v not answered from the cache (hits %d -> %d)", d, hits, c.RejectCacheStats().Hits)
	}
}

// admittedWithin decides key on s until it is admitted, failing after wait; errors (Redis
// away) count as not admitted.
func admittedWithin(t *testing.T, s *Store, key string, rl limiter.RateLimiter, now time.Time, wait time.Duration) limiter.Decision {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		d, err := s.Decide(t.Context(), key, limitertest.One(rl), now, 1, nil)
		if err == nil && d.Allowed {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("still not admitted after %v: %+v, %v", wait, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestResetReachesEveryReplica resets a client through one replica while another has its
// rejection cached: the other replica admits the client again, and does not keep rejecting it
// until the retry time it cached (an hour here).
func TestResetReachesEveryReplica(t *testing.T) {
	opts := testOptions(shared(t).Addr())
	opts.RejectCache = 100
	a, b := newClient(t, opts), newClient(t, opts)
	sa, sb := a.Store(t.Name()), b.Store(t.Name())
	rl := tokenBucket(t, 3, 1, time.Hour)
	now := limitertest.T0
	rejectedAndCached(t, b, sb, "hot", rl, now)

	if err := sa.Reset(t.Context(), "hot", now); err != nil {
		t.Fatal(err)
	}
	if d := admittedWithin(t, sb, "hot", rl, now, 10*time.Second); d.Remaining != 2 {
		t.Fatalf("after the reset through the other replica: %+v, want a fresh client", d)
	}
	if n := b.RejectCacheStats().ResetsReceived; n != 1 {
		t.Errorf("replica b received %d resets, want 1", n)
	}
	// The cache still works for the client afterwards.
	rejectedAndCached(t, b, sb, "hot", rl, now)
}

// TestRejectCacheDroppedAfterResubscribe restarts Redis (its state is lost, as a reset of every
// client) under a replica with a cached rejection: resets made while the replica was not
// subscribed may have been missed, so the cache is emptied before it answers again.
func TestRejectCacheDroppedAfterResubscribe(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	opts := testOptions(srv.Addr())
	opts.RejectCache = 100
	c := newClient(t, opts)
	s := c.Store(t.Name())
	rl := tokenBucket(t, 3, 1, time.Hour)
	now := limitertest.T0
	rejectedAndCached(t, c, s, "hot", rl, now)

	srv.Stop()
	srv.Restart(t)
	if d := admittedWithin(t, s, "hot", rl, now, 20*time.Second); d.Remaining != 2 {
		t.Fatalf("after Redis lost the state: %+v, want a fresh client", d)
	}
}

// TestResetRace resets a client through one replica while another hammers it: once the reset
// message has arrived, the other replica never answers from a rejection decided before it.
func TestResetRace(t *testing.T) {
	opts := testOptions(shared(t).Addr())
	opts.RejectCache = 100
	a, b := newClient(t, opts), newClient(t, opts)
	sa, sb := a.Store(t.Name()), b.Store(t.Name())
	rl := tokenBucket(t, 2, 1, time.Hour)
	now := limitertest.T0
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range 4 {
		go func() {
			for ctx.Err() == nil {
				_, _ = sb.Decide(ctx, "hot", limitertest.One(rl), now, 1, nil)
			}
		}()
	}
	for round := range 20 {
		before := b.RejectCacheStats().ResetsReceived
		if err := sa.Reset(t.Context(), "hot", now); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for b.RejectCacheStats().ResetsReceived == before {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: reset never reached replica b", round)
			}
			time.Sleep(time.Millisecond)
		}
		// The hammering goroutines may have used the allowance again, but a rejection decided
		// before the reset must not answer now: the client's state in Redis is what decides.
		cached, ok := sb.cache.get("hot", limitertest.One(rl), 1, now, nil)
		if !ok {
			continue
		}
		peek, err := sb.Decide(t.Context(), "hot", limitertest.One(rl), now, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if peek.Allowed {
			t.Fatalf("round %d: cache rejects (%+v) while Redis admits (%+v)", round, cached, peek)
		}
	}
}

// TestResetForgetsEveryLimit resets a client: its state and that of every limit it has state
// for go, on the client's slot, while another client's limits, the client's refund records
// and another policy's state of the client stay. Enough other keys make the scan take several
// steps.
func TestResetForgetsEveryLimit(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	cn, err := c.get()
	if err != nil {
		t.Fatal(err)
	}
	policy := t.Name()
	s := c.Store(policy)
	gone := []string{Key(policy, "k"), LimitKey(policy, "k", "burst"), LimitKey(policy, "k", "daily"), LimitKey(policy, "k", "removed-long-ago")}
	kept := []string{LimitKey(policy, "other", "burst"), Key(policy, "k") + refundSuffix([16]byte{1}),
		LimitKey(policy+"2", "k", "burst"), Key(policy+"2", "k"), LimitKey(policy, "k:burst", "x"), Key(policy, "k:burst")}
	for i := range 3 * resetScanCount {
		kept = append(kept, LimitKey(policy, fmt.Sprint("c", i), "burst"))
	}
	for _, k := range append(gone, kept...) {
		if err := cn.Do(t.Context(), cn.B().Set().Key(k).Value("x").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Reset(t.Context(), "k", limitertest.T0); err != nil {
		t.Fatal(err)
	}
	for _, k := range append(gone, kept...) {
		n, err := cn.Do(t.Context(), cn.B().Exists().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if want := !slices.Contains(gone, k); (n == 1) != want {
			t.Errorf("EXISTS %q = %d after the reset, want it kept: %t", k, n, want)
		}
	}
}

// TestResetTable runs the reset table of limitertest: limits a policy edit removed are reset,
// and crafted keys (glob characters, '}', ':', escapes) reset no other client.
func TestResetTable(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunReset(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

func TestGlobEscape(t *testing.T) {
	for in, want := range map[string]string{"a": "a", `a*b?[c]\d`: `a\*b\?\[c\]\\d`, "": ""} {
		if got := globEscape(in); got != want {
			t.Errorf("globEscape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestEngineResetForgetsRemovedLimits resets a client through the engine on Redis after a
// policy edit removed one of its tier's limits: when a later edit re-adds the limit, the
// client's next request is decided as its first by every limit (issue 35).
func TestEngineResetForgetsRemovedLimits(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	source := func(limits ...v1alpha1.Limit) *policy.Set {
		t.Helper()
		p, err := policy.Compile(&v1alpha1.RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: strings.ToLower(t.Name())},
			Spec:       v1alpha1.RateLimitPolicySpec{DefaultTier: "paid", Tiers: []v1alpha1.Tier{testsupport.StackedTier("paid", limits...)}},
		})
		if err != nil {
			t.Fatal(err)
		}
		set, err := policy.NewSet(p)
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	burst, daily := testsupport.TokenBucketLimit("burst", 2, 1, time.Hour), testsupport.SlidingWindowLimit("daily", 5, time.Hour)
	stacked, edited := source(burst, daily), source(daily)
	id := v1alpha1.NewPolicyID(strings.ToLower(t.Name()), "api")
	e := engine.New(engine.Options{NewStore: func(id v1alpha1.PolicyID) limiter.Store { return c.Store(id.String()) }})
	allow := func() engine.Result {
		t.Helper()
		r, err := e.Decide(t.Context(), id, "alice", 1)
		if err != nil || r.StoreError != nil {
			t.Fatalf("decision: %+v, %v", r, err)
		}
		return r
	}
	e.Swap(stacked)
	allow()
	allow() // burst is empty
	e.Swap(edited)
	allow()
	if err := e.Reset(t.Context(), id, "alice"); err != nil {
		t.Fatal(err)
	}
	e.Swap(stacked)
	if r := allow(); !r.Allowed || len(r.Limits) != 2 || r.Limits[0].Remaining != 1 || r.Limits[1].Remaining != 4 {
		t.Fatalf("first decision after the reset and the re-added limit: %+v, want 1 and 4 remaining", r)
	}
}

// TestRemovedLimitExpires drops a limit from a client's stack (a policy edit): the key of the
// state it left keeps the expiry its last decision set, when its state is fresh again (plus
// Options.ExpirySlack), however the client keeps deciding on the stack without it.
func TestRemovedLimitExpires(t *testing.T) {
	t.Parallel()
	opts := testOptions(shared(t).Addr())
	opts.ExpirySlack = 0
	c := newClient(t, opts)
	cn, err := c.get()
	if err != nil {
		t.Fatal(err)
	}
	s := c.Store(t.Name())
	tb := tokenBucket(t, 5, 1, time.Hour)
	full := limitertest.Stack(limiter.DefaultLimitName, tb, "burst", tokenBucket(t, 2, 1, 10*time.Second))
	decideStack(t, s, "k", full, limitertest.T0, 1)
	pttl := func() int64 {
		t.Helper()
		ms, err := cn.Do(t.Context(), cn.B().Pttl().Key(LimitKey(t.Name(), "k", "burst")).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	first := pttl()
	if first <= 0 || first > 10_000 {
		t.Fatalf("the burst limit's key expires in %d ms, want within the 10 s until it is fresh", first)
	}
	for range 3 { // the edit: only the default limit is decided
		decideStack(t, s, "k", limitertest.One(tb), limitertest.T0.Add(time.Second), 1)
	}
	if ms := pttl(); ms <= 0 || ms > first {
		t.Fatalf("after decisions without it, the burst limit's key expires in %d ms, want at most the %d ms it had", ms, first)
	}
}

// TestResetOnCluster runs the reset table on a Redis Cluster of 3 masters: each step of a
// reset's scan runs on the master of the client's slot, where every key of its limits is.
func TestResetOnCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	c := newClient(t, testOptions(cluster.Addrs()...))
	limitertest.RunReset(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
	// The reset mark is on the client's slot too: the reset and the refunds that read it run
	// on its master.
	limitertest.RunResetVoidsRefunds(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

// TestResetVoidsRefunds runs the table of resets and refunds of limitertest: a reset voids the
// refunds of the charges it deleted (the reset mark), and no other client's.
func TestResetVoidsRefunds(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunResetVoidsRefunds(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

// TestResetMarkLifetime: the reset mark lives as long as the longest-lived state the reset
// deleted and limiter.RefundRecordGrace more (so as long as a reservation that charged it could
// be refunded), and a reset that deleted no state with time to live writes none.
func TestResetMarkLifetime(t *testing.T) {
	c := newClient(t, testOptions(shared(t).Addr()))
	cn, err := c.get()
	if err != nil {
		t.Fatal(err)
	}
	policy := t.Name()
	s := c.Store(policy)
	mark := Key(policy, "k") + resetSuffix
	pttl := func(k string) int64 {
		t.Helper()
		ms, err := cn.Do(t.Context(), cn.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	if err := s.Reset(t.Context(), "k", limitertest.T0); err != nil {
		t.Fatal(err)
	}
	if ms := pttl(mark); ms != -2 {
		t.Fatalf("a reset of a client without state left a mark (PTTL %d)", ms)
	}
	long := tokenBucket(t, 10, 1, time.Hour)
	short := tokenBucket(t, 10, 1, time.Second)
	st := limitertest.Stack(limiter.DefaultLimitName, short, "long", long)
	if _, err := s.Decide(t.Context(), "k", st, limitertest.T0, 5, nil); err != nil {
		t.Fatal(err)
	}
	state := pttl(LimitKey(policy, "k", "long"))
	if err := s.Reset(t.Context(), "k", limitertest.T0); err != nil {
		t.Fatal(err)
	}
	grace := limiter.RefundRecordGrace.Milliseconds()
	if ms := pttl(mark); ms < state+grace-1000 || ms > state+grace {
		t.Fatalf("the reset mark expires in %d ms, want the longest state's %d ms and the grace", ms, state)
	}
}
