package limiter_test

import (
	"fmt"
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// TestRefundBoundMatchesTheHistoryWithoutTheCharge drives a token bucket through random
// interleavings of charges, refunds (of any amount of any charge, through RefundInterval and
// RefundBy as the stores apply them) and time, and holds every refund against an oracle of the
// history in which the charge had been smaller by the amount: what the refund takes off the
// debt is never more than the least debt the bucket had since the charge (just before each
// later admitted charge, just after each later refund, and at the refund), nor more than the
// amount; it is at least the stated bound (the amount, at most the charge less what refilled
// since); and when nothing came between on a bucket that was full at the charge, it is exactly
// that least debt: the whole charge comes back. Debts are counted in exact ticks of 1/rate ns.
func TestRefundBoundMatchesTheHistoryWithoutTheCharge(t *testing.T) {
	for _, p := range []struct {
		capacity, rate int64
		period         time.Duration
	}{
		{5, 2, time.Second},  // a token every 0.5 s exactly
		{7, 3, time.Second},  // a token every 333,333,333 1/3 ns
		{100, 1, time.Hour},  // the bucket
		{10, 7, time.Minute}, // fractions again
	} {
		t.Run(fmt.Sprintf("%d-%d-%v", p.capacity, p.rate, p.period), func(t *testing.T) {
			b := mustTB(t, p.capacity, p.rate, p.period)
			period := int64(p.period) // ticks per token
			rng := testseed.Rand(t, 7)
			type held struct {
				at        time.Time
				cost      int64
				low       int64 // the least debt since the charge, in ticks
				full      bool  // the bucket was full at the charge
				untouched bool  // nothing admitted or refunded since
				done      bool
			}
			debt := func(s *limiter.State, now time.Time) int64 {
				tat, frac := s.TAT()
				d := new(big.Int).Mul(big.NewInt(tat-now.UnixNano()), big.NewInt(p.rate))
				d.Add(d, new(big.Int).SetUint64(frac))
				if tat == 0 || d.Sign() < 0 {
					return 0
				}
				return d.Int64()
			}
			var (
				s     limiter.State
				now   = limitertest.T0
				rsv   []*held
				exact int // refunds checked to be exact
				back  int // refunds that gave something back
			)
			step := int64(p.period) / p.rate * 3 / 2 // up to 1.5 tokens' refill between events
			for range 5000 {
				switch rng.IntN(24) {
				case 0: // a full refill: the next charge finds the bucket full
					now = now.Add(b.Window())
				case 1, 2, 3, 4, 5, 6, 7:
					now = now.Add(time.Duration(rng.Int64N(step)))
				}
				if len(rsv) > 0 && rng.IntN(2) == 0 {
					i := len(rsv) - 1 - rng.IntN(min(len(rsv), 4)) // mostly recent charges
					r := rsv[i]
					if r.done {
						continue
					}
					r.done = true
					amount := 1 + rng.Int64N(r.cost)
					before := debt(&s, now)
					ns, frac := b.RefundInterval(amount, limiter.Once{Issued: r.at, Cost: r.cost}, now)
					b.RefundBy(&s, now, ns, frac)
					after := debt(&s, now)
					took := before - after
					exactly := min(amount*period, r.low, before) // the oracle
					bound := ns*p.rate + int64(frac)
					if took > exactly {
						t.Fatalf("refund of %d of a charge of %d made %v before took %d ticks off the debt; the history without them allows %d",
							amount, r.cost, now.Sub(r.at), took, exactly)
					}
					if took != min(bound, before) {
						t.Fatalf("refund of %d of %d, %v after: took %d ticks, its bound is %d of a debt of %d", amount, r.cost, now.Sub(r.at), took, bound, before)
					}
					if stated := r.cost*period - int64(now.Sub(r.at))*p.rate; took < min(amount*period, max(stated, 0), before) {
						t.Fatalf("refund of %d of %d, %v after: took %d ticks, less than the stated bound %d", amount, r.cost, now.Sub(r.at), took, stated)
					}
					if r.untouched && r.full {
						if took != exactly {
							t.Fatalf("refund of %d of %d, %v after, nothing between on a full bucket: took %d ticks, want %d", amount, r.cost, now.Sub(r.at), took, exactly)
						}
						exact++
					}
					if took > 0 {
						back++
					}
					for _, o := range rsv {
						o.low, o.untouched = min(o.low, after), false
					}
					continue
				}
				cost := 1 + rng.Int64N(min(p.capacity, 4))
				before := debt(&s, now)
				if d := b.Decide(&s, now, cost); d.Allowed {
					for _, o := range rsv {
						o.low, o.untouched = min(o.low, before), false
					}
					rsv = append(rsv, &held{at: now, cost: cost, low: math.MaxInt64, full: before == 0, untouched: true})
				}
			}
			t.Logf("%d charges, %d refunds gave back, %d exact", len(rsv), back, exact)
			if back < len(rsv)/5 || exact < 20 {
				t.Errorf("%d refunds gave back, %d checked exact, of %d charges: too few to check the bound", back, exact, len(rsv))
			}
		})
	}
}
