package limiter_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

func TestMemoryConformance(t *testing.T) {
	limitertest.Run(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
}

func TestMemoryConcurrentDecisionsOnOneKey(t *testing.T) {
	limitertest.RunConcurrent(t, limiter.NewMemory(nil), 16, 200, 300)
}

func TestMemoryConcurrentDecisionsOnOneKeyAsTheClockMoves(t *testing.T) {
	limitertest.RunConcurrentMovingClock(t, limiter.NewMemory(nil), 16, 200, 300)
}

// TestMemoryKeepsTheStrategiesItsClientsNeed: a store keeps the strategies that wrote its
// clients' states in use, so a client's usage carries over exactly whatever the garbage
// collector does, and lets them go with the last of those states. Before, the intern table kept
// every strategy for good.
func TestMemoryKeepsTheStrategiesItsClientsNeed(t *testing.T) {
	ctx := t.Context()
	const n = 1000
	for _, forget := range []struct {
		name string
		do   func(*limiter.Memory)
	}{
		{"sweep", func(m *limiter.Memory) { m.Sweep(limitertest.T0.Add(time.Hour)) }},
		{"close", func(m *limiter.Memory) { m.Close() }},
	} {
		t.Run(forget.name, func(t *testing.T) {
			m := limiter.NewMemory(nil)
			peak := func() int { // n token buckets and n sliding windows, one client each
				for i := range int64(n) {
					m.Decide(ctx, fmt.Sprint("b", i), limitertest.One(mustTB(t, i+2, 3, 19*time.Millisecond)), limitertest.T0, 2, nil)
					m.Decide(ctx, fmt.Sprint("w", i), limitertest.One(mustSW(t, i+2, 23*time.Millisecond)), limitertest.T0, 2, nil)
				}
				return limiter.Strategies()
			}()
			for range 3 {
				runtime.GC()
			}
			func() { // each client used 2; under a limit of 2 it has nothing left
				tb, sw := mustTB(t, 2, 3, 19*time.Millisecond), mustSW(t, 2, 23*time.Millisecond)
				for i := range n {
					if d, _ := m.Decide(ctx, fmt.Sprint("b", i), limitertest.One(tb), limitertest.T0, 0, nil); d.Allowed {
						t.Fatalf("token-bucket client %d lost its usage: %+v", i, d)
					}
					if d, _ := m.Decide(ctx, fmt.Sprint("w", i), limitertest.One(sw), limitertest.T0, 0, nil); d.Allowed {
						t.Fatalf("sliding-window client %d lost its usage: %+v", i, d)
					}
				}
			}()
			forget.do(m)
			collected(t, "the strategies of the forgotten clients to be freed", func() bool {
				return limiter.Strategies() <= peak-2*n
			})
		})
	}
}

func mustTB(t testing.TB, capacity, rate int64, period time.Duration) *limiter.TokenBucket {
	t.Helper()
	b, err := limiter.NewTokenBucket(capacity, rate, period)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustSW(t testing.TB, limit int64, window time.Duration) *limiter.SlidingWindow {
	t.Helper()
	w, err := limiter.NewSlidingWindow(limit, window)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestMemorySweepDropsOnlyFreshClients(t *testing.T) {
	ctx := t.Context()
	budget := limiter.NewBudget(0, 0)
	m := limiter.NewMemory(budget)
	tb := mustTB(t, 2, 1, time.Second)
	sw := mustSW(t, 2, time.Second)
	t0 := limitertest.T0
	m.Decide(ctx, "tb-idle", limitertest.One(tb), t0, 1, nil)
	m.Decide(ctx, "tb-busy", limitertest.One(tb), t0.Add(time.Second), 2, nil)
	m.Decide(ctx, "sw-idle", limitertest.One(sw), t0, 1, nil)
	m.Decide(ctx, "sw-busy", limitertest.One(sw), t0.Add(time.Second), 1, nil)
	if got := budget.Tracked(); got != 4 {
		t.Fatalf("tracked = %d, want 4", got)
	}
	m.Sweep(t0.Add(1500 * time.Millisecond)) // tb-idle refilled, sw-idle window empty
	if got := m.Len(); got != 2 {
		t.Fatalf("after sweep, %d clients kept, want 2", got)
	}
	if budget.Tracked() != 2 || budget.Dropped() != 2 || budget.Evictions() != 0 {
		t.Fatalf("tracked %d dropped %d evictions %d, want 2 2 0", budget.Tracked(), budget.Dropped(), budget.Evictions())
	}
	// The busy clients kept their usage.
	if d, _ := m.Decide(ctx, "tb-busy", limitertest.One(tb), t0.Add(1500*time.Millisecond), 1, nil); d.Allowed {
		t.Fatalf("tb-busy admitted after sweep: its state was lost")
	}
	if d, _ := m.Decide(ctx, "sw-busy", limitertest.One(sw), t0.Add(1500*time.Millisecond), 2, nil); d.Allowed {
		t.Fatalf("sw-busy admitted 2 after sweep: its state was lost")
	}
}

func TestMemoryBudgetEvictsClosestToFresh(t *testing.T) {
	ctx := t.Context()
	const max = 1000
	budget := limiter.NewBudget(max, 0)
	m := limiter.NewMemory(budget)
	tb := mustTB(t, 10, 1, time.Second)
	t0 := limitertest.T0
	// A flood of distinct keys, each using one token: every one still has usage.
	for i := 0; i < 5*max; i++ {
		m.Decide(ctx, fmt.Sprintf("flood-%d", i), limitertest.One(tb), t0, 1, nil)
	}
	if got := budget.Tracked(); got > max+256 {
		t.Fatalf("tracked %d clients with a budget of %d", got, max)
	}
	if got := int64(m.Len()); got != budget.Tracked() {
		t.Fatalf("Len %d != Tracked %d", got, budget.Tracked())
	}
	if budget.Evictions() == 0 {
		t.Fatalf("evictions of clients with usage were not counted")
	}
}

func TestMemoryEvictionPrefersFreshState(t *testing.T) {
	ctx := t.Context()
	budget := limiter.NewBudget(1, 0)
	m := limiter.NewMemory(budget)
	tb := mustTB(t, 10, 1, time.Second)
	t0 := limitertest.T0
	m.Decide(ctx, "old", limitertest.One(tb), t0, 1, nil)
	// Ten seconds later "old" has refilled: evicting it loses nothing.
	m.Decide(ctx, "new", limitertest.One(tb), t0.Add(10*time.Second), 1, nil)
	if budget.Evictions() != 0 {
		t.Fatalf("evicting a fresh client counted as lost usage")
	}
}

func TestMemoryResetAndPeek(t *testing.T) {
	ctx := t.Context()
	m := limiter.NewMemory(nil)
	tb := mustTB(t, 2, 1, time.Minute)
	t0 := limitertest.T0
	m.Decide(ctx, "k", limitertest.One(tb), t0, 2, nil)
	p, _ := m.Decide(ctx, "k", limitertest.One(tb), t0, 0, nil)
	if p.Allowed || p.Remaining != 0 || p.RetryAfter != time.Minute {
		t.Fatalf("peek of an empty bucket = %+v", p)
	}
	p2, _ := m.Decide(ctx, "k", limitertest.One(tb), t0, 0, nil)
	if p2 != p {
		t.Fatalf("peek changed the state: %+v then %+v", p, p2)
	}
	if p, _ := m.Decide(ctx, "unknown", limitertest.One(tb), t0, 0, nil); !p.Allowed || p.Remaining != 2 || m.Len() != 1 {
		t.Fatalf("peek of an unknown client = %+v, len %d", p, m.Len())
	}
	if err := m.Reset(ctx, "k", t0); err != nil {
		t.Fatal(err)
	}
	if d, _ := m.Decide(ctx, "k", limitertest.One(tb), t0, 2, nil); !d.Allowed {
		t.Fatalf("decision after reset rejected: %+v", d)
	}
}

// TestMemoryRefundKeepsNoNewClient checks that a refund for a client the store does not track
// (nothing to refund) creates no state, for either algorithm, and that a refund of a tracked
// client keeps the budget's bytes as they were.
func TestMemoryRefundKeepsNoNewClient(t *testing.T) {
	ctx := t.Context()
	budget := limiter.NewBudget(0, 0)
	m := limiter.NewMemory(budget)
	t0 := limitertest.T0
	for _, rl := range []limiter.RateLimiter{mustTB(t, 2, 1, time.Minute), mustSW(t, 2, time.Minute)} {
		if d, _ := limitertest.Refund(m, "unknown-"+rl.Algorithm().String(), limitertest.One(rl), t0, 1, nil); !d.Allowed || d.Remaining != 2 || m.Len() != 0 {
			t.Fatalf("%s: refund of an unknown client = %+v, len %d", rl.Algorithm(), d, m.Len())
		}
	}
	sw := mustSW(t, 4, time.Minute)
	for i := range 3 {
		m.Decide(ctx, "k", limitertest.One(sw), t0.Add(time.Duration(i)), 1, nil)
	}
	bytes := budget.Bytes()
	if d, _ := limitertest.Refund(m, "k", limitertest.One(sw), t0.Add(3), 2, nil); d.Remaining != 3 || budget.Bytes() != bytes || m.Len() != 1 {
		t.Fatalf("refund of 2 of 3 units: %+v, %d bytes (was %d), len %d", d, budget.Bytes(), bytes, m.Len())
	}
}

func TestMemoryCloseReturnsItsClients(t *testing.T) {
	ctx := t.Context()
	budget := limiter.NewBudget(10, 0)
	m := limiter.NewMemory(budget)
	tb := mustTB(t, 2, 1, time.Hour)
	sw := mustSW(t, 2, time.Hour)
	t0 := limitertest.T0
	for i := 0; i < 5; i++ {
		m.Decide(ctx, fmt.Sprintf("tb-%d", i), limitertest.One(tb), t0, 1, nil)
		m.Decide(ctx, fmt.Sprintf("sw-%d", i), limitertest.One(sw), t0, 1, nil)
	}
	if budget.Tracked() != 10 {
		t.Fatalf("tracked %d, want 10", budget.Tracked())
	}
	m.Close()
	if budget.Tracked() != 0 || m.Len() != 0 {
		t.Fatalf("after Close: tracked %d, len %d, want 0 0", budget.Tracked(), m.Len())
	}
	// A decision that raced with the removal is answered, as for a new client, but kept nowhere.
	if d, _ := m.Decide(ctx, "late", limitertest.One(tb), t0, 1, nil); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("decision after Close = %+v", d)
	}
	if budget.Tracked() != 0 || m.Len() != 0 {
		t.Fatalf("a decision after Close was tracked: tracked %d, len %d", budget.Tracked(), m.Len())
	}
}

func TestMemoryEvictsFromTheLargestStore(t *testing.T) {
	ctx := t.Context()
	budget := limiter.NewBudget(100, 0)
	small, large := limiter.NewMemory(budget), limiter.NewMemory(budget)
	tb := mustTB(t, 10, 1, time.Hour)
	t0 := limitertest.T0
	for i := 0; i < 30; i++ {
		small.Decide(ctx, fmt.Sprintf("s-%d", i), limitertest.One(tb), t0, 1, nil)
	}
	for i := 0; i < 500; i++ { // a flood on the other store
		large.Decide(ctx, fmt.Sprintf("l-%d", i), limitertest.One(tb), t0, 1, nil)
	}
	for i := 30; i < 40; i++ { // the small store grows under the bound's pressure
		small.Decide(ctx, fmt.Sprintf("s-%d", i), limitertest.One(tb), t0, 1, nil)
	}
	if small.Len() != 40 || large.Len() != 60 || budget.Tracked() != 100 {
		t.Fatalf("small %d large %d tracked %d, want 40 60 100", small.Len(), large.Len(), budget.Tracked())
	}
	if budget.Evictions() != 440 {
		t.Fatalf("evictions %d, want 440 (every client evicted had usage)", budget.Evictions())
	}
}

// TestMemoryByteBudgetHoldsForALongKey checks the byte bound after each decision when a new
// client's key is much longer than those of the clients evicted to make room: the store evicts
// as many clients as the bound needs, not a fixed number.
func TestMemoryByteBudgetHoldsForALongKey(t *testing.T) {
	ctx := t.Context()
	tb := mustTB(t, 10, 1, time.Hour)
	t0 := limitertest.T0
	// Measure what one short-key client costs, then bound the budget at 100 of them.
	probe := limiter.NewBudget(0, 0)
	limiter.NewMemory(probe).Decide(ctx, "k-000", limitertest.One(tb), t0, 1, nil)
	maxBytes := 100 * probe.Bytes()
	budget := limiter.NewBudget(0, maxBytes)
	m := limiter.NewMemory(budget)
	for i := range 100 {
		m.Decide(ctx, fmt.Sprintf("k-%03d", i), limitertest.One(tb), t0, 1, nil)
	}
	for i := range 20 {
		long := fmt.Sprintf("%d-%s", i, strings.Repeat("x", 1000))
		m.Decide(ctx, long, limitertest.One(tb), t0, 1, nil)
		if got := budget.Bytes(); got > maxBytes {
			t.Fatalf("after long key %d: %d bytes tracked, over the bound of %d", i, got, maxBytes)
		}
	}
	if got := int64(m.Len()); got != budget.Tracked() {
		t.Fatalf("Len %d != Tracked %d", got, budget.Tracked())
	}
}

func TestMemoryRefundOnce(t *testing.T) {
	limitertest.RunRefundOnce(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
}

// TestMemoryRefundCharge runs the table of refunds bounded by their charge on the memory store.
func TestMemoryRefundCharge(t *testing.T) {
	limitertest.RunRefundCharge(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
}

// TestMemoryReset runs the reset table. Two clients share a shard in one store of 256, so the
// table runs on many stores; TestIsStackKeyOfIsExact covers every pair of keys on one shard.
func TestMemoryReset(t *testing.T) {
	for range 32 {
		limitertest.RunReset(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
	}
}

// TestMemorySkew: while versions of a policy disagree (replicas alternating on one key, a
// limit's flap), a client gets at most the more generous version's allowance (issue 34).
func TestMemorySkew(t *testing.T) {
	limitertest.RunSkew(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
}

// TestMemoryResetVoidsRefunds: a reset voids the refunds of the charges it erased.
func TestMemoryResetVoidsRefunds(t *testing.T) {
	limitertest.RunResetVoidsRefunds(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
}

// TestMemoryOverflow runs the overflow table of limitertest on the memory store.
func TestMemoryOverflow(t *testing.T) {
	limitertest.RunOverflow(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
}

// TestMemoryClockJumps: a clock stepped back (seconds, hours) or jumping forward (days, a
// year) never lets a client's state admit more than the limit on the clock of its latest
// admission (limitertest.RunClockJumps).
func TestMemoryClockJumps(t *testing.T) {
	limitertest.RunClockJumps(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) }, testseed.Seed(t))
}

// TestMemoryFarInstants: a clock that jumps to the ends of what Unix nanoseconds hold, or past
// them, admits no more than the limit.
func TestMemoryFarInstants(t *testing.T) {
	limitertest.RunFarInstants(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
}
