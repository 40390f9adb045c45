package redis

import (
	"context"
	"errors"
	"strconv"
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
//
// The replicas' clocks are the test's, set to the instants the story needs, so that however
// late a call lands the slow replica judges the reservation valid. Only the record's expiry runs
// on real time (Redis's): without the grace it would expire margin after the first refund, and
// the test waits twice that; with it, the record outlives the wait unless the machine stalls
// for the grace itself, which fails the test rather than skipping it.
func TestRefundOnceTwoReplicasClockSkew(t *testing.T) {
	const (
		skew   = 300 * time.Millisecond // the fast replica's clock ahead of the slow one's
		margin = 50 * time.Millisecond  // how long before its until the fast replica refunds
	)
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
	charged := time.Now()
	slowNow := charged // the slow replica's clock; the fast one reads skew more
	slow := replica(func() time.Time { return slowNow })
	fast := replica(func() time.Time { return slowNow.Add(skew) })
	ctx := context.Background()
	// A key of its own: with -count the server's clock, not the test's, decides the bucket.
	key := "alice-" + strconv.FormatInt(charged.UnixNano(), 10)
	r, err := slow.Decide(ctx, p.ID, key, 100) // valid until charged+1s on either clock
	if err != nil || !r.Allowed || r.Reservation == "" {
		t.Fatalf("charge of 100: %+v %v", r, err)
	}
	slowNow = charged.Add(time.Second - skew - margin) // the fast clock reads until-margin
	first := time.Now()
	if _, err := fast.Refund(ctx, r.Reservation, 0); err != nil {
		t.Fatalf("refund through the fast replica: %v", err)
	}
	time.Sleep(2 * margin)            // a record kept only until the fast replica's until has expired
	slowNow = slowNow.Add(2 * margin) // until has passed on the fast clock; margin is left on the slow one
	_, err = slow.Refund(ctx, r.Reservation, 0)
	if late := time.Since(first); late >= limiter.RefundRecordGrace+margin {
		t.Fatalf("the second refund came %v after the first, when even a record kept the grace may have expired: "+
			"the machine stalled too long to tell (%v)", late, err)
	}
	if !errors.Is(err, engine.ErrRefunded) {
		t.Fatalf("refund through the slow replica after until on the fast clock: %v, want ErrRefunded", err)
	}
}
