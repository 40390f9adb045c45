package limiter_test

import (
	"math/big"
	"runtime"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

func TestConstructorsRejectOutOfBounds(t *testing.T) {
	bad := []struct {
		name string
		err  error
	}{
		{"capacity 0", second(limiter.NewTokenBucket(0, 1, time.Second))},
		{"rate 0", second(limiter.NewTokenBucket(1, 0, time.Second))},
		{"capacity too large", second(limiter.NewTokenBucket(limiter.MaxCapacity+1, 1, time.Second))},
		{"period too short", second(limiter.NewTokenBucket(1, 1, time.Microsecond))},
		{"period too long", second(limiter.NewTokenBucket(1, 1, 25*time.Hour))},
		{"refill slower than a year", second(limiter.NewTokenBucket(1000, 1, 24*time.Hour))},
		{"full refill overflows 64 bits", second(limiter.NewTokenBucket(limiter.MaxCapacity, 1, 24*time.Hour))},
		// capacity*period/rate is between 2^63 and 2^64 ns: as an int64 it was negative, so it
		// passed the bound and the bucket had a negative full refill.
		{"full refill past 2^63 ns", second(limiter.NewTokenBucket(limiter.MaxCapacity, 5000, 24*time.Hour))},
		{"limit 0", second(limiter.NewSlidingWindow(0, time.Second))},
		{"limit too large", second(limiter.NewSlidingWindow(limiter.MaxWindowLimit+1, time.Second))},
		{"window too long", second(limiter.NewSlidingWindow(1, 25*time.Hour))},
	}
	for _, c := range bad {
		if c.err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func TestStrategiesAreInterned(t *testing.T) {
	a, b := mustTB(t, 5, 2, time.Second), mustTB(t, 5, 2, time.Second)
	c := mustTB(t, 5, 3, time.Second)
	if a != b || a.ID() != b.ID() {
		t.Fatalf("equal parameters gave different strategies")
	}
	if a.ID() == c.ID() || a.ID() == mustSW(t, 5, time.Second).ID() {
		t.Fatalf("different parameters share an ID")
	}
}

// TestUnusedStrategiesAreFreed: the intern table holds the strategies in use, not every
// parameter set ever compiled. Before, it kept each one for the life of the process, so every
// policy edit grew it for good.
func TestUnusedStrategiesAreFreed(t *testing.T) {
	const n = 5000
	peak := func() int { // builds 2n strategies in use only until it returns
		kept := make([]limiter.RateLimiter, 0, 2*n)
		for i := range int64(n) {
			kept = append(kept, mustTB(t, i+1, 7, 13*time.Millisecond), mustSW(t, i+1, 17*time.Millisecond))
		}
		peak := limiter.Strategies()
		runtime.KeepAlive(kept)
		return peak
	}()
	collected(t, "the unused strategies to leave the intern table", func() bool {
		return limiter.Strategies() <= peak-2*n
	})
}

// TestAStateKeepsItsStrategy: a State references the strategy that wrote it, so that its usage
// still carries over exactly to new parameters once nothing else references that strategy.
func TestAStateKeepsItsStrategy(t *testing.T) {
	var bucket, window limiter.State
	func() {
		tb, sw := mustTB(t, 10, 1, 31*time.Minute), mustSW(t, 10, 37*time.Minute)
		for range 7 {
			tb.Decide(&bucket, limitertest.T0, 1)
			sw.Decide(&window, limitertest.T0, 1)
		}
	}()
	for range 3 {
		runtime.GC()
	}
	// 7 of 10 used; the new limit of 8 leaves 1.
	for name, c := range map[string]struct {
		rl limiter.RateLimiter
		s  *limiter.State
	}{"token bucket": {mustTB(t, 8, 1, 31*time.Minute), &bucket}, "sliding window": {mustSW(t, 8, 37*time.Minute), &window}} {
		if d := c.rl.Decide(c.s, limitertest.T0, 1); !d.Allowed || d.Remaining != 0 {
			t.Errorf("%s: the last unit: %+v, want admitted with 0 remaining", name, d)
		}
		if d := c.rl.Decide(c.s, limitertest.T0, 1); d.Allowed {
			t.Errorf("%s: a unit beyond the carried-over usage admitted: %+v", name, d)
		}
	}
}

// collected runs the garbage collector until condition holds, or fails t after 10 s.
func collected(t *testing.T, what string, condition func() bool) {
	t.Helper()
	testsupport.Eventually(t, 10*time.Second, what, func() bool {
		runtime.GC()
		return condition()
	})
}

// TestTokenBucketNoDrift spends every token the moment it accrues (at the first whole
// nanosecond after), three million times, at a rate whose interval is not a whole number of
// nanoseconds: an implementation that rounded the interval would drift by a third of a
// nanosecond per token and admit or reject at the wrong nanosecond by the end.
func TestTokenBucketNoDrift(t *testing.T) {
	tb := mustTB(t, 10, 3, time.Second)
	var s limiter.State
	t0 := limitertest.T0
	if d := tb.Decide(&s, t0, 10); !d.Allowed { // empty the bucket: it never caps again
		t.Fatal(d)
	}
	accrues := func(i int64) time.Time { // first whole ns at or after token i accrues (i/3 s)
		return t0.Add(time.Duration((i*int64(time.Second) + 2) / 3))
	}
	const n = 3_000_000
	for i := int64(1); i <= n; i++ {
		if d := tb.Decide(&s, accrues(i), 1); !d.Allowed {
			t.Fatalf("token %d at t0+%v rejected: %+v", i, accrues(i).Sub(t0), d)
		}
	}
	if d := tb.Decide(&s, accrues(n+1).Add(-1), 1); d.Allowed {
		t.Fatalf("token %d admitted one nanosecond early: drift", n+1)
	}
	if d := tb.Decide(&s, accrues(n+1), 1); !d.Allowed {
		t.Fatalf("token %d rejected on time: drift", n+1)
	}
}

// TestTokenBucketMatchesExactModel compares random decisions with a model in exact rational
// arithmetic: tokens = min(capacity, tokens + elapsed*rate/period).
func TestTokenBucketMatchesExactModel(t *testing.T) {
	rng := testseed.Rand(t, 2)
	for round := 0; round < 200; round++ {
		capacity := rng.Int64N(20) + 1
		rate := rng.Int64N(7) + 1
		period := time.Duration(rng.Int64N(int64(2*time.Second))) + time.Millisecond
		tb := mustTB(t, capacity, rate, period)
		var s limiter.State
		tokens := new(big.Rat).SetInt64(capacity)
		capRat := new(big.Rat).SetInt64(capacity)
		at := limitertest.T0
		last := at
		for step := 0; step < 200; step++ {
			at = at.Add(time.Duration(rng.Int64N(int64(period))))
			cost := rng.Int64N(capacity+1) + 1
			elapsed := new(big.Rat).SetFrac64(int64(at.Sub(last))*rate, int64(period))
			tokens.Add(tokens, elapsed)
			if tokens.Cmp(capRat) > 0 {
				tokens.Set(capRat)
			}
			last = at
			want := tokens.Cmp(new(big.Rat).SetInt64(cost)) >= 0
			d := tb.Decide(&s, at, cost)
			if d.Allowed != want {
				t.Fatalf("round %d step %d (cap %d rate %d/%v cost %d, model tokens %s): allowed %v, model %v",
					round, step, capacity, rate, period, cost, tokens.FloatString(6), d.Allowed, want)
			}
			if want {
				tokens.Sub(tokens, new(big.Rat).SetInt64(cost))
			}
			floor := new(big.Int).Quo(tokens.Num(), tokens.Denom()).Int64()
			if d.Remaining != floor {
				t.Fatalf("round %d step %d: remaining %d, model %d", round, step, d.Remaining, floor)
			}
		}
	}
}

// TestSlidingWindowMatchesLog compares random decisions with the definition: a request is
// admitted iff the units admitted in (now-window, now] plus its cost are at most the limit.
func TestSlidingWindowMatchesLog(t *testing.T) {
	rng := testseed.Rand(t, 4)
	type adm struct {
		at   time.Time
		cost int64
	}
	for round := 0; round < 200; round++ {
		limit := rng.Int64N(20) + 1
		window := time.Duration(rng.Int64N(int64(time.Second))) + time.Millisecond
		sw := mustSW(t, limit, window)
		var s limiter.State
		var log []adm
		at := limitertest.T0
		for step := 0; step < 300; step++ {
			at = at.Add(time.Duration(rng.Int64N(int64(window) / 4)))
			cost := rng.Int64N(limit) + 1
			used := int64(0)
			for _, a := range log {
				if at.Sub(a.at) < window {
					used += a.cost
				}
			}
			want := used+cost <= limit
			d := sw.Decide(&s, at, cost)
			if d.Allowed != want {
				t.Fatalf("round %d step %d: allowed %v, definition %v (used %d cost %d limit %d)", round, step, d.Allowed, want, used, cost, limit)
			}
			if want {
				log = append(log, adm{at, cost})
				used += cost
			} else {
				// RetryAfter is the first instant the request would fit.
				retry := at.Add(d.RetryAfter)
				u := int64(0)
				for _, a := range log {
					if retry.Sub(a.at) < window {
						u += a.cost
					}
				}
				u2 := int64(0)
				for _, a := range log {
					if retry.Add(-1).Sub(a.at) < window {
						u2 += a.cost
					}
				}
				if u+cost > limit || u2+cost <= limit {
					t.Fatalf("round %d step %d: retry after %v is not the first instant the cost fits", round, step, d.RetryAfter)
				}
			}
			if d.Remaining != limit-used {
				t.Fatalf("round %d step %d: remaining %d, want %d", round, step, d.Remaining, limit-used)
			}
		}
	}
}

func TestSlidingWindowMemoryIsReleased(t *testing.T) {
	sw := mustSW(t, 1000, time.Second)
	var s limiter.State
	t0 := limitertest.T0
	for i := 0; i < 1000; i++ {
		sw.Decide(&s, t0.Add(time.Duration(i)*time.Millisecond), 1)
	}
	if !sw.Fresh(&s, t0.Add(2*time.Second)) {
		t.Fatalf("a window with no admission left is not fresh")
	}
	if sw.Fresh(&s, t0.Add(1998*time.Millisecond)) {
		t.Fatalf("a window still holding an admission is fresh")
	}
}

func TestPeekDoesNotConsume(t *testing.T) {
	for _, rl := range []limiter.RateLimiter{mustTB(t, 1, 1, time.Second), mustSW(t, 1, time.Second), limiter.Unlimited} {
		var s limiter.State
		for i := 0; i < 3; i++ {
			if p := rl.Peek(&s, limitertest.T0); !p.Allowed {
				t.Fatalf("%v: peek %d rejected", rl.Algorithm(), i)
			}
		}
		if d := rl.Decide(&s, limitertest.T0, 1); !d.Allowed {
			t.Fatalf("%v: first decision after peeks rejected", rl.Algorithm())
		}
	}
}

// TestTokenBucketRefundBehindTheClock: a refund whose instant lags behind a later decision (a
// request that read the clock first and reached the store last) gives back its own units only.
// Taking the bucket as empty at the refund's instant, as a decision does, gave back the later
// decisions' units too.
func TestTokenBucketRefundBehindTheClock(t *testing.T) {
	b, err := limiter.NewTokenBucket(10, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t0 := limitertest.T0
	var s limiter.State
	if d := b.Decide(&s, t0.Add(5*time.Second), 10); !d.Allowed {
		t.Fatalf("emptying the bucket at t0+5s: %+v", d)
	}
	if d := b.Refund(&s, t0, 1); d.Remaining != 0 { // at t0 the bucket is still more than empty
		t.Errorf("a refund of 1 at t0, 5s behind: %d remaining at t0, want 0", d.Remaining)
	}
	if d := b.Peek(&s, t0.Add(5*time.Second)); d.Remaining != 1 {
		t.Errorf("a refund of 1 at t0, 5s behind: %d remaining at t0+5s, want 1", d.Remaining)
	}
}
