package limitertest

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// ClockJumpLimits are the strategies RunClockJumps tries, each with a refill or window short
// and long against the jumps.
func ClockJumpLimits() map[string]limiter.RateLimiter {
	return map[string]limiter.RateLimiter{
		"tb 10 refilling 1 a second": must(limiter.NewTokenBucket(10, 1, time.Second)),
		"tb 5 refilling 1 an hour":   must(limiter.NewTokenBucket(5, 1, time.Hour)),
		"sw 10 a second":             must(limiter.NewSlidingWindow(10, time.Second)),
		"sw 10 an hour":              must(limiter.NewSlidingWindow(10, time.Hour)),
		"qt 10 a day":                must(limiter.NewQuota(10, limiter.PeriodDay, time.UTC)),
	}
}

// clockStep returns the next instant of a clock that mostly runs forward in small steps, and
// now and then is stepped back (by seconds, by hours, to an instant it showed before) or jumps
// far forward (days, a year).
func clockStep(r *rand.Rand, now time.Time, shown []time.Time) time.Time {
	switch r.IntN(40) {
	case 0, 1, 2:
		return now.Add(-time.Duration(1+r.IntN(10)) * time.Second)
	case 3:
		return now.Add(-time.Duration(1+r.IntN(5)) * time.Hour)
	case 4:
		return shown[r.IntN(len(shown))]
	case 5:
		return now.Add(time.Duration(1+r.IntN(3)) * 24 * time.Hour)
	case 6:
		return now.AddDate(1, 0, 0)
	case 7:
		return now // the same instant
	}
	return now.Add(time.Duration(r.Int64N(int64(400 * time.Millisecond))))
}

// RunClockJumps checks the rule for a clock that jumps, on one client of a store of newStore at
// a time, for random sequences of instants from seed (clockStep) and costs (1 to the limit, and
// now and then one the limit never admits): time never moves back for a client's state. An
// admission at an instant earlier than the client's latest admission is counted as made at that
// latest admission's instant; measured on that clock (tau, the running maximum of the instants
// of the admissions), no window holds more than the limit allows:
//
//   - a token bucket: the admissions from i to j hold at most capacity + the refill of
//     tau_j - tau_i;
//   - a sliding window: the admissions with tau in [tau_i, tau_i+window) hold at most the limit;
//   - a quota: the admissions with tau in one period hold at most the limit.
//
// The client's state is kept throughout (no sweep, no reset, no refund): a state that has
// decayed and is dropped is a client never seen, decided on whatever the clock shows.
func RunClockJumps(t *testing.T, newStore func(t *testing.T) limiter.Store, seed uint64) {
	for name, rl := range ClockJumpLimits() {
		t.Run(name, func(t *testing.T) {
			store := newStore(t)
			st := One(rl)
			limit := rl.Limit()
			for run := range 60 {
				r := rand.New(rand.NewPCG(seed+uint64(run), 34))
				key := fmt.Sprint("jumps-", run)
				now := T0
				shown := []time.Time{now}
				var (
					costs []int64     // of the admissions, in order
					tau   []time.Time // the running maximum of their instants
					at    []time.Time // the instants they were decided at
					log   []string    // every decision, for the failure message
				)
				for range 300 {
					now = clockStep(r, now, shown)
					shown = append(shown, now)
					cost := 1 + r.Int64N(max(1, limit/3))
					if r.IntN(20) == 0 {
						cost = limit + 1
					}
					d, err := store.Decide(context.Background(), key, st, now, cost, make([]limiter.Decision, 1))
					if err != nil {
						t.Fatalf("run %d: %v", run, err)
					}
					log = append(log, fmt.Sprintf("%v cost %d: %t", now.Sub(T0), cost, d.Allowed))
					if !d.Allowed {
						continue
					}
					if cost > limit {
						t.Fatalf("run %d: cost %d above the limit admitted at %v", run, cost, now.Sub(T0))
					}
					latest := now
					if n := len(tau); n > 0 && tau[n-1].After(latest) {
						latest = tau[n-1]
					}
					costs, tau, at = append(costs, cost), append(tau, latest), append(at, now)
					if msg := clockJumpViolation(rl, costs, tau); msg != "" {
						t.Fatalf("seed %d run %d: %s\ndecisions (instants since T0):\n%v", seed, run, msg, log)
					}
				}
			}
		})
	}
}

// clockJumpViolation checks the newest admission of costs (at tau[len-1] on the clock of the
// client's latest admission) against the earlier ones, and describes a window that holds more
// than rl allows, or returns "".
func clockJumpViolation(rl limiter.RateLimiter, costs []int64, tau []time.Time) string {
	j := len(costs) - 1
	var sum int64
	switch rl := rl.(type) {
	case *limiter.TokenBucket:
		capacity, rate, period := rl.Params()
		for i := j; i >= 0; i-- {
			sum += costs[i]
			// floor(d*rate/period), exactly, without overflowing (rate*period fits an int64
			// for the limits of ClockJumpLimits).
			d := int64(tau[j].Sub(tau[i]))
			refill := d/int64(period)*rate + d%int64(period)*rate/int64(period)
			if sum > capacity+refill {
				return fmt.Sprintf("admissions %d to %d hold %d units over %v of the client's clock: capacity %d and the refill allow %d",
					i, j, sum, tau[j].Sub(tau[i]), capacity, capacity+refill)
			}
		}
	case *limiter.SlidingWindow:
		limit, window := rl.Params()
		for i := j; i >= 0 && tau[j].Sub(tau[i]) < window; i-- {
			sum += costs[i]
		}
		if sum > limit {
			return fmt.Sprintf("the window of %v up to the newest admission holds %d units, limit %d", window, sum, limit)
		}
	case *limiter.Quota:
		limit, _, _ := rl.Params()
		day := tau[j].Truncate(24 * time.Hour)
		for i := j; i >= 0 && !tau[i].Before(day); i-- {
			sum += costs[i]
		}
		if sum > limit {
			return fmt.Sprintf("the day of %v holds %d units, limit %d", day, sum, limit)
		}
	}
	return ""
}

// FarInstants are instants a clock may jump to that lie near or past the ends of what an int64
// of Unix nanoseconds holds (1677-09-21 to 2262-04-11), where now.UnixNano() wraps and a state's
// instants (now plus a refill, a window or a period) would overflow.
func FarInstants() map[string]time.Time {
	return map[string]time.Time{
		"2262, 30 minutes before int64 ns end": time.Unix(0, math.MaxInt64-int64(30*time.Minute)),
		"2262, a day before int64 ns end":      time.Unix(0, math.MaxInt64-int64(24*time.Hour)),
		"2262-04-12, past int64 ns":            time.Date(2262, 4, 12, 0, 0, 0, 0, time.UTC),
		"3000":                                 time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC),
		"1677-09-22, near int64 ns start":      time.Unix(0, math.MinInt64+int64(24*time.Hour)),
		"1600, before int64 ns":                time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC),
	}
}

// RunFarInstants checks that a clock jumping to an instant of FarInstants admits no more than
// the limit: 100 one-unit requests a millisecond apart from there are admitted at most
// limit + 1 times (a token bucket's refill over 99 ms is below one unit for every limit of
// ClockJumpLimits), and the same from an instant a second later, on the same client.
func RunFarInstants(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	for name, rl := range ClockJumpLimits() {
		t.Run(name, func(t *testing.T) {
			store := newStore(t)
			st := One(rl)
			for at, base := range FarInstants() {
				admitted := int64(0)
				for i := range 200 {
					now := base.Add(time.Duration(i%100) * time.Millisecond)
					if i >= 100 {
						now = now.Add(time.Second) // a sliding window of a second lets another limit through
					}
					d, err := store.Decide(context.Background(), at, st, now, 1, make([]limiter.Decision, 1))
					if err != nil {
						t.Fatalf("%s: request %d: %v", at, i, err)
					}
					if d.Allowed {
						admitted++
					}
				}
				// Over 1.1 s: a bucket refilling 1 a second adds at most 2, a window of a second
				// lets a second limit through.
				if bound := 2*rl.Limit() + 2; admitted > bound || admitted == 0 {
					t.Errorf("%s: %d of 200 one-unit requests over 1.1 s admitted, want 1 to %d", at, admitted, bound)
				}
			}
		})
	}
}
