package limitertest

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// RunRefundCharge checks, on stores from newStore, a refund that names its charge
// (limiter.Once.Cost and Issued): each token bucket gets back the amount, at most what of the
// charge it has not refilled since, exactly (not in whole tokens). A unit charged and refunded
// milliseconds later is spendable again, all of a charge of 10 comes back, a partial refund
// returns the amount, a charge on a bucket already in debt and followed by other charges
// returns what has not refilled, one that has refilled returns nothing, and on a stack each
// limit gets back its own share. Every store answers the same numbers.
func RunRefundCharge(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	hourly := must(limiter.NewTokenBucket(100, 1, time.Hour)) // the bucket: a token an hour
	burst := must(limiter.NewTokenBucket(10, 10, time.Second))
	daily := must(limiter.NewTokenBucket(1000, 1000, 24*time.Hour))
	stack, err := limiter.NewStack([]string{"burst", "daily"}, []limiter.RateLimiter{burst, daily})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ids uint64
	store := newStore(t)
	decide := func(key string, st *limiter.Stack, at time.Time, cost int64, remaining int64) {
		t.Helper()
		d, err := store.Decide(ctx, key, st, at, cost, nil)
		if err != nil || !d.Allowed || d.Remaining != remaining {
			t.Fatalf("%s: decide %d at T0+%v: %+v %v, want admitted, %d remaining", key, cost, at.Sub(T0), d, err, remaining)
		}
	}
	refund := func(key string, st *limiter.Stack, at time.Time, amount int64, issued time.Time, cost int64, remaining ...int64) {
		t.Helper()
		ids++
		var id [16]byte
		binary.BigEndian.PutUint64(id[8:], ids)
		limits := make([]limiter.Decision, st.Len())
		d, err := store.Refund(ctx, limiter.Request{Key: key, Stack: st, Cost: amount, Limits: limits}, at,
			limiter.Once{ID: id, Until: issued.Add(24 * time.Hour), Issued: issued, Cost: cost})
		if err != nil {
			t.Fatalf("%s: refund of %d of a charge of %d at T0+%v: %v", key, amount, cost, at.Sub(T0), err)
		}
		for i, want := range remaining {
			if limits[i].Remaining != want {
				t.Fatalf("%s: refund of %d of a charge of %d at T0+%v: limit %d answers %+v, want %d remaining (all: %+v)",
					key, amount, cost, at.Sub(T0), i, limits[i], want, d)
			}
		}
	}
	one := One(hourly)

	// One unit charged, refunded 3 ms later: it comes back, and the full bucket is spendable.
	decide("one", one, T0, 1, 99)
	refund("one", one, T0.Add(3*time.Millisecond), 1, T0, 1, 100)
	decide("one", one, T0.Add(3*time.Millisecond), 100, 0)

	// Ten charged, all refunded 5 ms later: all ten come back.
	decide("ten", one, T0, 10, 90)
	refund("ten", one, T0.Add(5*time.Millisecond), 10, T0, 10, 100)

	// Four of ten: four come back.
	decide("part", one, T0, 10, 90)
	refund("part", one, T0.Add(5*time.Millisecond), 4, T0, 10, 94)

	// A charge of 10 on a bucket in debt, another charge after it, refunded half an hour on:
	// half a token of it has refilled, 9.5 come back (debt 64 -> 54.5 tokens: 45 remaining).
	decide("busy", one, T0, 50, 50)
	decide("busy", one, T0.Add(30*time.Minute), 10, 40)
	decide("busy", one, T0.Add(45*time.Minute), 5, 35)
	refund("busy", one, T0.Add(time.Hour), 10, T0.Add(30*time.Minute), 10, 45)

	// Two charged, the bucket emptied an hour later: one of the two has refilled, the other
	// comes back; two hours on, both have refilled and nothing comes back.
	decide("refilled", one, T0, 2, 98)
	decide("refilled", one, T0.Add(time.Hour), 98, 1)
	refund("refilled", one, T0.Add(time.Hour), 2, T0, 2, 2)
	refund("refilled", one, T0.Add(2*time.Hour), 2, T0, 2, 3)

	// A stack: half a second after 10 charged, the burst limit has refilled half of them and
	// gets the other half back (full again), the daily limit gets back all but half a second's
	// refill (full again). Later than the refunds above: a store refuses a refund far older
	// than the newest it has seen (limiter.ErrRefundTooLate).
	at := T0.Add(3 * time.Hour)
	decide("stack", stack, at, 10, 0)
	refund("stack", stack, at.Add(500*time.Millisecond), 10, at, 10, 10, 1000)
}
