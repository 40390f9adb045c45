package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

// TestRefundOnceTwoReplicasClockSkew runs two engines on one redis-server as production does
// (ServerClock, no expiry slack), one's clock ahead of the other's by less than
// limiter.RefundRecordGrace: a reservation refunded through the fast replica is refused through
// the slow one after its until has passed on the fast clock but not on the slow one. Before
// the grace the record expired at until on the fast replica's clock, and the slow one refunded
// again.
func TestRefundOnceTwoReplicasClockSkew(t *testing.T) {
	const skew = 300 * time.Millisecond
	opts := testOptions(shared(t).Addr())
	opts.Clock, opts.ExpirySlack = ServerClock, 0
	c := newClient(t, opts)
	p, set := refundPolicy(t, 200, 100, time.Second) // a unit refills in 10 ms: a reservation of 100 units is valid for 1 s
	signer, err := reservation.NewSigner([]byte(strings.Repeat("k", reservation.MinKeyBytes)))
	if err != nil {
		t.Fatal(err)
	}
	replica := func(clock func() time.Time) *engine.Engine {
		e := engine.New(engine.Options{Reservations: signer, Clock: clock,
			NewStore: func(id v1alpha1.PolicyID) limiter.Store { return c.Store(string(id)) }})
		e.Swap(set)
		return e
	}
	fast := replica(func() time.Time { return time.Now().Add(skew) })
	slow := replica(time.Now)
	ctx := context.Background()
	r, err := slow.Decide(ctx, p.ID, "alice", 100)
	issued := time.Now() // the reservation's until is at most issued+1s on the slow clock
	if err != nil || !r.Allowed || r.Reservation == "" {
		t.Fatalf("charge of 100: %+v %v", r, err)
	}
	if _, err := fast.Refund(ctx, r.Reservation, 0); err != nil {
		t.Fatalf("refund through the fast replica: %v", err)
	}
	// The until has passed on the fast clock at issued+1s-skew; on the slow one the
	// reservation is valid until about issued+1s.
	time.Sleep(time.Until(issued.Add(time.Second - skew + 100*time.Millisecond)))
	_, err = slow.Refund(ctx, r.Reservation, 0)
	if late := time.Since(issued); late >= time.Second-50*time.Millisecond {
		t.Skipf("the second refund came %v after the charge, too late to tell", late)
	}
	if !errors.Is(err, engine.ErrRefunded) {
		t.Fatalf("refund through the slow replica after until on the fast clock: %v, want ErrRefunded", err)
	}
}
