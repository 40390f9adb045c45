package limitertest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// RunRefundOnce checks Store.Refund on stores from newStore: for a token bucket, a sliding
// window and a stack of both, a refund applies once per ID (a repeat answers ErrRefunded and
// refunds nothing, also past its Until within limiter.RefundRecordGrace), other IDs still
// refund, a token bucket whose state other parameters wrote is converted and refunded once,
// and concurrent refunds of one ID refund exactly once.
func RunRefundOnce(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	tb := must(limiter.NewTokenBucket(5, 1, time.Hour))
	sw := must(limiter.NewSlidingWindow(5, time.Hour))
	st, err := limiter.NewStack([]string{"burst", "daily"}, []limiter.RateLimiter{tb, must(limiter.NewSlidingWindow(8, time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	until := T0.Add(time.Hour)
	for _, c := range []struct {
		name  string
		stack *limiter.Stack
	}{{"TokenBucket", One(tb)}, {"SlidingWindow", One(sw)}, {"Stack", st}} {
		t.Run(c.name, func(t *testing.T) {
			store := newStore(t)
			ctx := context.Background()
			req := func(key string, cost int64) limiter.Request {
				return limiter.Request{Key: key, Stack: c.stack, Cost: cost, Limits: make([]limiter.Decision, c.stack.Len())}
			}
			decide := func(key string, cost int64) limiter.Decision {
				t.Helper()
				d, err := store.Decide(ctx, key, c.stack, T0, cost, nil)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			if d := decide("a", 4); !d.Allowed || d.Remaining != 1 {
				t.Fatalf("spend 4: %+v", d)
			}
			id := [16]byte{1}
			d, err := store.Refund(ctx, req("a", 2), T0, limiter.Once{ID: id, Until: until})
			if err != nil || d.Remaining != 3 {
				t.Fatalf("refund of 2: %+v %v, want 3 remaining", d, err)
			}
			for range 3 {
				if _, err := store.Refund(ctx, req("a", 2), T0, limiter.Once{ID: id, Until: until}); !errors.Is(err, limiter.ErrRefunded) {
					t.Fatalf("the same refund again: %v, want ErrRefunded", err)
				}
			}
			if d := decide("a", 0); d.Remaining != 3 {
				t.Fatalf("after repeated refunds: %d remaining, want 3", d.Remaining)
			}
			if d, err := store.Refund(ctx, req("a", 1), T0, limiter.Once{ID: [16]byte{2}, Until: until}); err != nil || d.Remaining != 4 {
				t.Fatalf("another refund: %+v %v, want 4 remaining", d, err)
			}

			// Concurrent refunds of one ID: exactly one applies.
			decide("b", 5)
			var wg sync.WaitGroup
			var ok atomic.Int64
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := store.Refund(ctx, req("b", 1), T0, limiter.Once{ID: [16]byte{3}, Until: until})
					switch {
					case err == nil:
						ok.Add(1)
					case !errors.Is(err, limiter.ErrRefunded):
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			if ok.Load() != 1 {
				t.Fatalf("%d of 16 concurrent refunds of one ID applied, want 1", ok.Load())
			}
			if d := decide("b", 0); d.Remaining != 1 {
				t.Fatalf("after concurrent refunds: %d remaining, want 1", d.Remaining)
			}

			// The record outlives its Until by the grace (replicas' clock skew, a refund's
			// delay): a repeat judged valid on a clock behind is still refused. (Last: a
			// Memory store refuses refunds far behind this instant as too late.)
			if _, err := store.Refund(ctx, req("a", 2), until.Add(limiter.RefundRecordGrace/2), limiter.Once{ID: id, Until: until}); !errors.Is(err, limiter.ErrRefunded) {
				t.Fatalf("the same refund past its until, within the grace: %v, want ErrRefunded", err)
			}
		})
	}
	t.Run("TokenBucketConverted", func(t *testing.T) {
		store := newStore(t)
		ctx := context.Background()
		if _, err := store.Decide(ctx, "c", One(tb), T0, 5, nil); err != nil {
			t.Fatal(err)
		}
		wider := One(must(limiter.NewTokenBucket(6, 1, time.Hour))) // other parameters: the state is converted
		once := limiter.Once{ID: [16]byte{4}, Until: until}
		d, err := store.Refund(ctx, limiter.Request{Key: "c", Stack: wider, Cost: 2}, T0, once)
		if err != nil || d.Remaining != 3 {
			t.Fatalf("refund of 2 on a converted bucket: %+v %v, want 3 remaining", d, err)
		}
		if _, err := store.Refund(ctx, limiter.Request{Key: "c", Stack: wider, Cost: 2}, T0, once); !errors.Is(err, limiter.ErrRefunded) {
			t.Fatalf("again: %v, want ErrRefunded", err)
		}
		if d, _ := store.Decide(ctx, "c", wider, T0, 0, nil); d.Remaining != 3 {
			t.Fatalf("after the repeat: %d remaining, want 3", d.Remaining)
		}
	})
}
