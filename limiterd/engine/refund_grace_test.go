package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

// stallingStore is a memory store whose Refund, once armed, waits before it goes on: a
// refund preempted between the engine's clock read and the store's record.
type stallingStore struct {
	*limiter.Memory
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *stallingStore) Refund(ctx context.Context, req limiter.Request, now time.Time, once limiter.Once) (limiter.Decision, error) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return s.Memory.Refund(ctx, req, now, once)
}

// TestDelayedRefundAppliesOnce: a refund that read the clock while its reservation was valid,
// then stalled while the clock moved past the reservation's until and the engine swept, is
// refused once resumed if the reservation was refunded before (before the grace, the sweep
// dropped the record and the same reservation refunded again: remaining 8 -> 11 at T0+5s):
// within the grace the record is still there (ErrRefunded), past it the refund is too late
// (ErrReservationExpired).
func TestDelayedRefundAppliesOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration // how far the clock moves while the refund stalls
		want  error
	}{
		{"PastUntil", 4 * time.Second, engine.ErrRefunded},
		{"PastTheGrace", 4*time.Second + limiter.RefundRecordGrace + time.Second, engine.ErrReservationExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nowNS atomic.Int64
			nowNS.Store(limitertest.T0.UnixNano())
			clock := func() time.Time { return time.Unix(0, nowNS.Load()) }
			signer, _ := reservation.NewSigner([]byte("0123456789abcdef0123456789abcdef"))
			store := &stallingStore{Memory: limiter.NewMemory(nil), entered: make(chan struct{}), release: make(chan struct{})}
			e := engine.New(engine.Options{Clock: clock, Reservations: signer,
				NewStore: func(v1alpha1.PolicyID) limiter.Store { return store }})
			// 100 units refilling one a second: a reservation of 4 is valid for 4 s.
			e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) {
				refunds(s)
				s.Tiers[0] = tokenBucket("free", 100)
				s.Tiers[0].TokenBucket.RefillPeriod = &metav1.Duration{Duration: time.Second}
			})))
			remaining := func() int64 {
				t.Helper()
				r, err := e.Peek(ctx, "team/a", "alice")
				if err != nil {
					t.Fatal(err)
				}
				return r.Remaining
			}
			r, err := e.Decide(ctx, "team/a", "alice", 4)
			if err != nil || r.Reservation == "" {
				t.Fatalf("charge of 4: %+v %v", r, err)
			}
			if r, err := e.Decide(ctx, "team/a", "alice", 96); err != nil || !r.Allowed {
				t.Fatalf("charge of 96: %+v %v", r, err)
			}
			nowNS.Add(int64(time.Second))
			if got, err := e.Refund(ctx, r.Reservation, 0); err != nil || got.Remaining != 4 {
				t.Fatalf("first refund at T0+1s: %+v %v, want 4 remaining", got, err)
			}

			store.armed.Store(true)
			done := make(chan error, 1)
			go func() {
				_, err := e.Refund(ctx, r.Reservation, 0) // reads T0+1s, then stalls
				done <- err
			}()
			<-store.entered
			nowNS.Add(int64(tc.delay))
			e.Sweep()
			before := remaining()
			close(store.release)
			err = <-done
			if !errors.Is(err, tc.want) {
				t.Errorf("the delayed second refund: %v, want %v", err, tc.want)
			}
			if after := remaining(); after != before {
				t.Errorf("the delayed second refund refunded: %d remaining, was %d", after, before)
			}
		})
	}
}
