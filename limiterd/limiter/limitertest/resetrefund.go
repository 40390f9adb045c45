package limitertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// RunResetVoidsRefunds holds a store made by newStore to the contract between Reset and Refund:
// a reset erases the charges made before it, so a refund of one of them (Once.Issued at or
// before the reset's instant) fails with limiter.ErrReset, refunds nothing and records nothing,
// for a token bucket and for a stack, even after the client charged again (the state the reset
// deleted was recreated); a charge made after the reset refunds as usual; a refund made before
// the reset still answers ErrRefunded when retried; and a reset voids no other client's
// refunds, for every pair of CraftedKeys (a client never reset refunds exactly as before).
func RunResetVoidsRefunds(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	ctx := context.Background()
	tb := must(limiter.NewTokenBucket(10, 1, time.Hour))
	burst := must(limiter.NewTokenBucket(12, 1, time.Minute))
	until := T0.Add(time.Hour)
	for _, c := range []struct {
		name  string
		stack *limiter.Stack
	}{{"TokenBucket", One(tb)}, {"Stack", Stack(limiter.DefaultLimitName, tb, "burst", burst)}} {
		t.Run(c.name, func(t *testing.T) {
			store := newStore(t)
			decide := func(at time.Duration, cost int64) limiter.Decision {
				t.Helper()
				d, err := store.Decide(ctx, "client", c.stack, T0.Add(at), cost, nil)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			refund := func(at time.Duration, id byte, issued time.Duration, cost int64) (limiter.Decision, error) {
				req := limiter.Request{Key: "client", Stack: c.stack, Cost: cost, Limits: make([]limiter.Decision, c.stack.Len())}
				return store.Refund(ctx, req, T0.Add(at), limiter.Once{ID: [16]byte{id}, Until: until, Issued: T0.Add(issued)})
			}
			// The attack: spend the allowance, have the client reset, spend it again,
			// then refund the charge from before the reset.
			if d := decide(0, 10); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("spend 10: %+v", d)
			}
			if _, err := refund(time.Second, 1, 0, 2); err != nil { // refunded before the reset
				t.Fatal(err)
			}
			if err := store.Reset(ctx, "client", T0.Add(2*time.Second)); err != nil {
				t.Fatal(err)
			}
			if d := decide(3*time.Second, 10); !d.Allowed || d.Remaining != 0 {
				t.Fatalf("spend 10 after the reset: %+v", d)
			}
			for _, issued := range []time.Duration{0, 2 * time.Second} { // before the reset, at its instant
				for range 2 { // voided, not recorded: a retry is voided again
					if d, err := refund(4*time.Second, 2, issued, 9); !errors.Is(err, limiter.ErrReset) {
						t.Fatalf("refund of a charge at T0+%v, before the reset at T0+2s: %+v %v, want ErrReset", issued, d, err)
					}
				}
			}
			if d := decide(4*time.Second, 0); d.Allowed || d.Remaining != 0 {
				t.Fatalf("after the voided refunds: %+v, want the allowance spent (0 remaining)", d)
			}
			if _, err := refund(4*time.Second, 1, 0, 2); !errors.Is(err, limiter.ErrRefunded) {
				t.Fatalf("a refund made before the reset, retried: %v, want ErrRefunded", err)
			}
			// The charge made after the reset refunds as usual.
			if d, err := refund(4*time.Second, 3, 3*time.Second, 5); err != nil || d.Remaining != 5 {
				t.Fatalf("refund of 5 of the charge after the reset: %+v %v, want 5 remaining", d, err)
			}
		})
	}

	t.Run("a reset voids no other client's refunds", func(t *testing.T) {
		st := One(tb)
		for i, victim := range CraftedKeys {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				store := newStore(t)
				for _, key := range CraftedKeys {
					if _, err := store.Decide(ctx, key, st, T0, 4, nil); err != nil {
						t.Fatal(err)
					}
				}
				if err := store.Reset(ctx, victim, T0.Add(time.Second)); err != nil {
					t.Fatal(err)
				}
				for j, key := range CraftedKeys {
					if _, err := store.Decide(ctx, key, st, T0.Add(2*time.Second), 4, nil); err != nil {
						t.Fatal(err)
					}
					req := limiter.Request{Key: key, Stack: st, Cost: 3}
					d, err := store.Refund(ctx, req, T0.Add(3*time.Second), limiter.Once{ID: [16]byte{byte(i), byte(j), 1}, Until: until, Issued: T0})
					switch {
					case key == victim && !errors.Is(err, limiter.ErrReset):
						t.Fatalf("refund of %q's charge before its reset: %+v %v, want ErrReset", key, d, err)
					case key != victim && (err != nil || d.Remaining != 5):
						t.Fatalf("after the reset of %q, refund of 3 of %q's charge: %+v %v, want 5 remaining", victim, key, d, err)
					}
				}
			})
		}
	})
}
