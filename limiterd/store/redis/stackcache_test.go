package redis

import (
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// decideStack decides cost units of st for key on s, with every limit's decision.
func decideStack(t *testing.T, s *Store, key string, st *limiter.Stack, now time.Time, cost int64) (limiter.Decision, []limiter.Decision) {
	t.Helper()
	out := make([]limiter.Decision, st.Len())
	d, err := s.Decide(t.Context(), key, st, now, cost, out)
	if err != nil {
		t.Fatal(err)
	}
	return d, out
}

// TestRejectCacheServesStacks: a stacked tier gets the reject cache a tier of one limit gets. A
// rejected stack is answered from the cache, each limit as Redis would answer it then, until
// its rejecting limit's retry time; a peek, another stack or a cost the cache did not see is
// asked of Redis; a refund forgets the client; after the retry time the stack admits exactly
// what its limits allow.
func TestRejectCacheServesStacks(t *testing.T) {
	t.Parallel()
	opts := testOptions(shared(t).Addr())
	opts.RejectCache = 100
	c := newClient(t, opts)
	s := c.Store(t.Name())
	uncached := newClient(t, testOptions(shared(t).Addr())).Store(t.Name()) // Redis's own answers
	st := limitertest.Stack("burst", tokenBucket(t, 2, 2, time.Minute), "daily", slidingWindow(t, 100, time.Hour))
	now := limitertest.T0
	for i := range 2 {
		if d, _ := decideStack(t, s, "k", st, now, 1); !d.Allowed {
			t.Fatalf("decision %d rejected: %+v", i, d)
		}
	}
	d, _ := decideStack(t, s, "k", st, now, 1)
	if d.Allowed || d.RetryAfter != 30*time.Second {
		t.Fatalf("third decision %+v, want rejected for 30s by burst", d)
	}

	later := now.Add(10 * time.Second)
	hits := c.RejectCacheStats().Hits
	got, gotLimits := decideStack(t, s, "k", st, later, 1)
	if c.RejectCacheStats().Hits != hits+1 {
		t.Fatalf("the stack's second rejection %+v was not answered from the cache", got)
	}
	want, wantLimits := decideStack(t, uncached, "k", st, later, 1)
	if got != want {
		t.Errorf("cached %+v, Redis answers %+v", got, want)
	}
	for i := range wantLimits {
		if gotLimits[i] != wantLimits[i] {
			t.Errorf("limit %q: cached %+v, Redis answers %+v", st.Name(i), gotLimits[i], wantLimits[i])
		}
	}
	if _, err := s.Decide(t.Context(), "k", st, later, 1, nil); err != nil { // out may be nil
		t.Fatal(err)
	}

	hits = c.RejectCacheStats().Hits
	if d, _ := decideStack(t, s, "k", st, later, 0); d.Allowed || c.RejectCacheStats().Hits != hits {
		t.Errorf("peek %+v: answered from the cache (hits %d -> %d)", d, hits, c.RejectCacheStats().Hits)
	}
	other := limitertest.Stack("burst", tokenBucket(t, 2, 2, time.Minute), "daily", slidingWindow(t, 50, time.Hour))
	if d, _ := decideStack(t, s, "k", other, later, 1); d.Allowed || c.RejectCacheStats().Hits != hits {
		t.Errorf("another stack %+v: answered from the cache (hits %d -> %d)", d, hits, c.RejectCacheStats().Hits)
	}
	if d, _ := decideStack(t, s, "k", st, later, 2); d.Allowed || c.RejectCacheStats().Hits != hits {
		t.Errorf("another cost %+v: answered from the cache (hits %d -> %d)", d, hits, c.RejectCacheStats().Hits)
	}

	// A refund lets the client in before the cached retry time: the cache forgets it.
	if _, err := s.Refund(t.Context(), limiter.Request{Key: "k", Stack: st, Cost: 1}, later, limiter.Once{ID: [16]byte{1}, Until: later.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if d, _ := decideStack(t, s, "k", st, later, 1); !d.Allowed || c.RejectCacheStats().Hits != hits {
		t.Fatalf("after a refund: %+v (hits %d -> %d), want admitted by Redis", d, hits, c.RejectCacheStats().Hits)
	}
	if d, _ := decideStack(t, s, "k", st, later, 1); d.Allowed {
		t.Fatalf("the refunded unit admitted twice: %+v", d)
	}

	// From the retry time on, Redis decides: one more unit, then a rejection again.
	retry := later.Add(30 * time.Second)
	hits = c.RejectCacheStats().Hits
	if d, _ := decideStack(t, s, "k", st, retry, 1); !d.Allowed {
		t.Fatalf("at the retry time: %+v, want admitted", d)
	}
	if d, _ := decideStack(t, s, "k", st, retry, 1); d.Allowed {
		t.Fatalf("over-admitted at the retry time: %+v", d)
	}
	if c.RejectCacheStats().Hits != hits {
		t.Errorf("answered from the cache at or after the retry time")
	}
}

// TestRejectCacheStackHoldsUntilFirstRetry: when several limits reject, the cached rejection
// holds until the first of their retry times, so that no limit is answered as rejected from the
// cache once Redis would answer that it admits.
func TestRejectCacheStackHoldsUntilFirstRetry(t *testing.T) {
	t.Parallel()
	opts := testOptions(shared(t).Addr())
	opts.RejectCache = 100
	c := newClient(t, opts)
	s := c.Store(t.Name())
	st := limitertest.Stack("short", tokenBucket(t, 1, 1, 10*time.Second), "long", tokenBucket(t, 1, 1, 100*time.Second))
	now := limitertest.T0
	if d, _ := decideStack(t, s, "k", st, now, 1); !d.Allowed {
		t.Fatalf("first decision rejected: %+v", d)
	}
	if d, _ := decideStack(t, s, "k", st, now, 1); d.Allowed || d.RetryAfter != 100*time.Second {
		t.Fatalf("second decision %+v, want rejected for 100s", d)
	}
	hits := c.RejectCacheStats().Hits
	if d, _ := decideStack(t, s, "k", st, now.Add(9*time.Second), 1); d.Allowed || c.RejectCacheStats().Hits != hits+1 {
		t.Fatalf("before the first retry time: %+v, want a cached rejection", d)
	}
	d, limits := decideStack(t, s, "k", st, now.Add(10*time.Second), 1)
	if d.Allowed || d.RetryAfter != 90*time.Second || !limits[0].Allowed || limits[1].Allowed {
		t.Fatalf("at short's retry time: %+v %+v, want rejected by long only", d, limits)
	}
	if c.RejectCacheStats().Hits != hits+1 {
		t.Errorf("answered from the cache at short's retry time")
	}
}

// TestRejectCacheServesStackedBatches: DecideBatch answers a stacked request from the cache as
// Decide does, and caches the stacked rejections it decides, even for a request that asks for no
// limit's decision.
func TestRejectCacheServesStackedBatches(t *testing.T) {
	t.Parallel()
	opts := testOptions(shared(t).Addr())
	opts.RejectCache = 100
	c := newClient(t, opts)
	s := c.Store(t.Name())
	st := limitertest.Stack("burst", tokenBucket(t, 1, 1, time.Minute), "daily", slidingWindow(t, 100, time.Hour))
	now := limitertest.T0
	reqs := []limiter.Request{{Key: "k", Stack: st, Cost: 1}, {Key: "k", Stack: st, Cost: 1}}
	out := make([]limiter.Answer, len(reqs))
	s.DecideBatch(t.Context(), reqs, now, out)
	if out[0].Err != nil || out[1].Err != nil || !out[0].Allowed || out[1].Allowed {
		t.Fatalf("first batch %+v, want admitted then rejected", out)
	}
	hits := c.RejectCacheStats().Hits
	limits := make([]limiter.Decision, st.Len())
	reqs = []limiter.Request{{Key: "k", Stack: st, Cost: 1, Limits: limits}}
	s.DecideBatch(t.Context(), reqs, now.Add(time.Second), out[:1])
	if out[0].Err != nil || out[0].Allowed || c.RejectCacheStats().Hits != hits+1 {
		t.Fatalf("second batch %+v (hits %d -> %d), want a cached rejection", out[0], hits, c.RejectCacheStats().Hits)
	}
	if limits[0].Allowed || limits[0].RetryAfter != 59*time.Second || !limits[1].Allowed || limits[1].Remaining != 99 {
		t.Errorf("limits answered from the cache: %+v", limits)
	}
}

// TestRejectionKeepsAnotherAlgorithmsState: a rejected decision writes nothing, for a tier of one
// limit as for a stack: the state that another algorithm left under the limit's key stays (and
// counts again if the algorithm comes back); an admission replaces it, charged its used units.
func TestRejectionKeepsAnotherAlgorithmsState(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	s := c.Store(t.Name())
	now := limitertest.T0
	sw := limitertest.One(slidingWindow(t, 3, time.Hour))
	tb := limitertest.One(tokenBucket(t, 2, 1, time.Hour))
	if d, _ := decideStack(t, s, "k", sw, now, 2); !d.Allowed {
		t.Fatalf("window: %+v", d)
	}
	// A cost above the new bucket's capacity is rejected by the fresh bucket: the window's log stays.
	if d, _ := decideStack(t, s, "k", tb, now, 3); d.Allowed {
		t.Fatalf("bucket admitted a cost above its capacity: %+v", d)
	}
	if typ := do(t, c, "TYPE", s.key("k")); typ != "list" {
		t.Fatalf("after the rejection the key holds a %s, want the window's list", typ)
	}
	if d, _ := decideStack(t, s, "k", sw, now, 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("window back: %+v, want its 2 units still counted", d)
	}
	// Over a bucket's state, the window rejects a cost above its limit and keeps the state.
	if d, _ := decideStack(t, s, "b", tb, now, 1); !d.Allowed {
		t.Fatalf("bucket: %+v", d)
	}
	if d, _ := decideStack(t, s, "b", sw, now, 4); d.Allowed {
		t.Fatalf("window admitted a cost above its limit: %+v", d)
	}
	if d, _ := decideStack(t, s, "b", tb, now, 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("bucket back: %+v, want its unit still counted", d)
	}
	// The bucket is charged the units the window holds (a conversion never gives usage back):
	// 3 units are a debt beyond its capacity of 2, rejected, and the log stays.
	if d, _ := decideStack(t, s, "k", tb, now, 1); d.Allowed || d.Remaining != 0 {
		t.Fatalf("bucket over a window of 3 units: %+v, want them charged (rejected)", d)
	}
	if typ := do(t, c, "TYPE", s.key("k")); typ != "list" {
		t.Fatalf("after the rejection the key holds a %s, want the window's list", typ)
	}
	// An admission replaces another algorithm's state, charged its units: 1 unit of the window
	// and 1 admitted empty the bucket of 2.
	if d, _ := decideStack(t, s, "r", sw, now, 1); !d.Allowed {
		t.Fatalf("window: %+v", d)
	}
	if d, _ := decideStack(t, s, "r", tb, now, 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("bucket over a window of 1 unit: %+v, want it admitted with that unit charged", d)
	}
	if typ := do(t, c, "TYPE", s.key("r")); typ != "string" {
		t.Fatalf("after the admission the key holds a %s, want the bucket's string", typ)
	}
}
