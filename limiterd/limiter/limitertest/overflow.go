package limitertest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// OverflowLimits returns strategies at the corners of the bounds NewTokenBucket, NewSlidingWindow
// and NewQuota allow, where a product of a cost and a rate or period is largest: the largest
// capacity with the fastest and with the slowest refill (a full refill of almost
// MaxRefillWindow), a bucket whose full refill is below a nanosecond, the largest windows and
// quotas.
func OverflowLimits() map[string]limiter.RateLimiter {
	// The slowest refill of the largest bucket: capacity*period/rate just within a year.
	slowest := int64(math.Ceil(float64(limiter.MaxCapacity) * float64(limiter.MaxPeriod) / float64(limiter.MaxRefillWindow)))
	return map[string]limiter.RateLimiter{
		"tb max capacity, max rate, max period": must(limiter.NewTokenBucket(limiter.MaxCapacity, limiter.MaxCapacity, limiter.MaxPeriod)),
		"tb max capacity, max rate, min period": must(limiter.NewTokenBucket(limiter.MaxCapacity, limiter.MaxCapacity, limiter.MinPeriod)),
		"tb max capacity, slowest refill":       must(limiter.NewTokenBucket(limiter.MaxCapacity, slowest, limiter.MaxPeriod)),
		"tb max capacity, rate 1, min period":   must(limiter.NewTokenBucket(limiter.MaxCapacity, 1, limiter.MinPeriod)),
		"tb capacity 1, sub-ns refill":          must(limiter.NewTokenBucket(1, limiter.MaxCapacity, limiter.MinPeriod)),
		"tb capacity 3, max rate, max period":   must(limiter.NewTokenBucket(3, limiter.MaxCapacity, limiter.MaxPeriod)),
		"sw max limit, max window":              must(limiter.NewSlidingWindow(limiter.MaxWindowLimit, limiter.MaxPeriod)),
		"sw max limit, min window":              must(limiter.NewSlidingWindow(limiter.MaxWindowLimit, limiter.MinPeriod)),
		"qt max limit, year":                    must(limiter.NewQuota(limiter.MaxQuotaLimit, limiter.PeriodYear, time.UTC)),
		"qt max limit, day, Kiritimati":         must(limiter.NewQuota(limiter.MaxQuotaLimit, limiter.PeriodDay, must(time.LoadLocation("Pacific/Kiritimati")))),
	}
}

// hugeCosts are costs no limit admits: above every bound, around the limits of int64 and of the
// doubles the Redis scripts compute in (2^53), and around 2^32 (the width of State's fraction).
var hugeCosts = []int64{
	math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 2, math.MaxInt64/2 + 1, 1 << 62, 1<<53 + 1, 1 << 53,
	1<<32 + 1, limiter.MaxCapacity + 1, 2*limiter.MaxCapacity + 1,
}

// RunOverflow checks that no arithmetic of a decision overflows, from the outside: on every
// strategy of OverflowLimits, costs far beyond the limit (up to math.MaxInt64) are rejected and
// change nothing, a limit's worth is admitted exactly once, refunds of huge amounts give back no
// more than was charged, and a batch whose costs sum beyond int64 admits no more than the limit.
// Negative costs (refunds of less than 1) are refused with ErrInvalidCost. Nothing panics. Each step is decided by a store of newStore at instants from T0 (a store on
// the caller's clock).
func RunOverflow(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	ctx := context.Background()
	for name, rl := range OverflowLimits() {
		t.Run(name, func(t *testing.T) {
			store := newStore(t)
			st := One(rl)
			limit := rl.Limit()
			now := T0
			decide := func(key string, cost int64) limiter.Decision {
				t.Helper()
				d, err := store.Decide(ctx, key, st, now, cost, make([]limiter.Decision, 1))
				if err != nil {
					t.Fatalf("%s: decide %d: %v", key, cost, err)
				}
				return d
			}
			// A fresh client: every huge cost is rejected, with no retry time (never
			// admitted), and leaves the client fresh.
			for _, c := range hugeCosts {
				if c <= limit {
					continue
				}
				if d := decide("fresh", c); d.Allowed || d.RetryAfter != 0 || d.Remaining != limit {
					t.Errorf("fresh client, cost %d: %+v, want rejected, no retry, %d remaining", c, d, limit)
				}
			}
			if d := decide("fresh", limit); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("fresh client, cost %d (the limit) after the huge costs: %+v, want admitted, 0 remaining", limit, d)
			}
			for _, c := range append([]int64{1}, hugeCosts...) {
				if d := decide("fresh", c); d.Allowed {
					t.Errorf("after the limit's worth, cost %d: %+v, want rejected", c, d)
				}
			}

			// Refunds of huge amounts give back what was charged, no more: the client is
			// admitted one limit's worth again, not one unit beyond.
			for i, c := range hugeCosts {
				key := fmt.Sprint("refund-", i)
				if d := decide(key, limit); !d.Allowed {
					t.Fatalf("%s: cost %d (the limit): %+v, want admitted", key, limit, d)
				}
				d, err := Refund(store, key, st, now, c, make([]limiter.Decision, 1))
				if err != nil {
					t.Fatalf("%s: refund %d: %v", key, c, err)
				}
				if d.Remaining != limit {
					t.Errorf("%s: refund of %d after a charge of %d: %+v, want %d remaining", key, c, limit, d, limit)
				}
				if d := decide(key, limit); !d.Allowed {
					t.Errorf("%s: cost %d after the refund: %+v, want admitted", key, limit, d)
				}
				if d := decide(key, 1); d.Allowed {
					t.Errorf("%s: one more after the refund and a limit's worth: %+v, want rejected", key, d)
				}
			}

			// Batches whose costs sum beyond int64: as the items one by one.
			batches := [][]int64{
				{math.MaxInt64, math.MaxInt64, limit, 1, math.MaxInt64},
				{math.MaxInt64/2 + 1, math.MaxInt64/2 + 1, limit/2 + 1, limit/2 + 1, 1},
				{limit, math.MaxInt64 - limit + 1, 1 << 63 / 4 * 3, 1},
			}
			for i, costs := range batches {
				key := fmt.Sprint("batch-", i)
				reqs := make([]limiter.Request, len(costs))
				for j, c := range costs {
					reqs[j] = limiter.Request{Key: key, Stack: st, Cost: c, Limits: make([]limiter.Decision, 1)}
				}
				out := make([]limiter.Answer, len(reqs))
				store.DecideBatch(ctx, reqs, now, out)
				var admitted int64
				for j, a := range out {
					if a.Err != nil {
						t.Fatalf("%s: item %d (cost %d): %v", key, j, costs[j], a.Err)
					}
					if a.Allowed {
						if admitted += costs[j]; admitted > limit || admitted < 0 {
							t.Errorf("%s: item %d (cost %d) admitted: %d units of %d", key, j, costs[j], admitted, limit)
						}
					}
				}
				if d := decide(key, 1); d.Allowed && admitted == limit {
					t.Errorf("%s: one more after the batch admitted %d: %+v, want rejected", key, admitted, d)
				}
			}

			// Negative costs, through the store's Go API (the engine and the servers refuse them
			// before): refused with ErrInvalidCost, changing nothing. Before the check, a token
			// bucket panicked on them (uint64(cost) overflowed a 128-bit quotient) and a sliding
			// window or a quota admitted them, giving usage back (remaining above the limit).
			negative := []int64{-1, -limit, math.MinInt64}
			key := "negative"
			if d := decide(key, limit); !d.Allowed {
				t.Fatalf("%s: cost %d (the limit): %+v, want admitted", key, limit, d)
			}
			for _, c := range negative {
				if d, err := store.Decide(ctx, key, st, now, c, make([]limiter.Decision, 1)); !errors.Is(err, limiter.ErrInvalidCost) {
					t.Errorf("%s: decide %d: %+v, %v; want ErrInvalidCost", key, c, d, err)
				}
				if d, err := Refund(store, key, st, now, c, make([]limiter.Decision, 1)); !errors.Is(err, limiter.ErrInvalidCost) {
					t.Errorf("%s: refund %d: %+v, %v; want ErrInvalidCost", key, c, d, err)
				}
				reqs := []limiter.Request{{Key: key, Stack: st, Cost: c}, {Key: key, Stack: st, Cost: 1}}
				out := make([]limiter.Answer, len(reqs))
				store.DecideBatch(ctx, reqs, now, out)
				if !errors.Is(out[0].Err, limiter.ErrInvalidCost) || out[1].Err != nil || out[1].Allowed {
					t.Errorf("%s: batch of %d and 1: %+v; want ErrInvalidCost, then a rejection", key, c, out)
				}
			}
			if d, err := Refund(store, key, st, now, 0, make([]limiter.Decision, 1)); !errors.Is(err, limiter.ErrInvalidCost) {
				t.Errorf("%s: refund 0: %+v, %v; want ErrInvalidCost", key, d, err)
			}
			if d := decide(key, 1); d.Allowed || d.Remaining != 0 {
				t.Errorf("%s: one more after the negative costs: %+v, want rejected, 0 remaining", key, d)
			}

			// A late instant: a limit's worth, and nothing beyond, long after the others (the
			// same arithmetic with an instant far from T0).
			now = T0.AddDate(200, 0, 0)
			if d := decide("late", limit); !d.Allowed {
				t.Fatalf("late: cost %d: %+v, want admitted", limit, d)
			}
			for _, c := range append([]int64{1}, hugeCosts...) {
				if d := decide("late", c); d.Allowed {
					t.Errorf("late, after the limit's worth, cost %d: %+v, want rejected", c, d)
				}
			}
		})
	}
}
