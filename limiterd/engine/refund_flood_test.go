package engine_test

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// TestRefundFloodFromOneKeyLeavesOthersTheirRefunds is issue 34's flood of refund records: one
// client charges a unit and refunds it, again and again (each refund gives the unit back, so it
// never runs out), leaving one record a refund. Before, its records filled the memory store's
// table for the whole policy (limiter.MaxRefundRecords, in about 13 s over HTTP) and every
// other client's refund was refused (503) until they expired. A client now holds fewer records
// than are free (limiter.MaxRefundRecords), so alone at most half: its own refunds are refused
// past that, and another client's refund succeeds. Nothing is given twice: a refused refund
// refunds nothing, and a refunded reservation stays refunded.
//
// The flood's records are written through the policy's store (a refund of the engine costs
// over 100 µs under -race on a shared machine: 30 s for the flood); the refunds around it go
// through the engine.
func TestRefundFloodFromOneKeyLeavesOthersTheirRefunds(t *testing.T) {
	var store limiter.Store
	e := engine.New(engine.Options{Clock: fixedClock(), NewStore: func(v1alpha1.PolicyID) limiter.Store {
		store = limiter.NewMemory(nil)
		return store
	}})
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) {
		refunds(s)
		s.Tiers[0] = testsupport.TokenBucketTier("free", 10, 1, time.Hour)
	})))

	r, err := e.Decide(ctx, "team/a", "flood", 1)
	if err != nil || !r.Allowed || r.Reservation == "" {
		t.Fatalf("flood: decide: %+v, %v", r, err)
	}
	first := r.Reservation
	if _, err := e.Refund(ctx, first, 0); err != nil {
		t.Fatalf("flood: first refund: %v", err)
	}
	refunded := 1
	now := limitertest.T0
	req := limiter.Request{Key: "flood", Stack: r.Tier.Stack, Cost: 1}
	for ; refunded <= limiter.MaxRefundRecords; refunded++ {
		var id [16]byte
		binary.BigEndian.PutUint64(id[8:], uint64(refunded))
		id[0] = 0xff // no reservation's: those are random
		_, err := store.Refund(ctx, req, now, limiter.Once{ID: id, Until: now.Add(time.Hour), Issued: now, Cost: 1})
		if errors.Is(err, limiter.ErrTooManyRefunds) {
			break
		} else if err != nil {
			t.Fatalf("flood, after %d refunds: %v", refunded, err)
		}
	}
	t.Logf("the flooding client made %d refunds before its refunds were refused", refunded)

	// Another client's refund is made, and gives its units back.
	r, err = e.Decide(ctx, "team/a", "victim", 10)
	if err != nil || !r.Allowed {
		t.Fatalf("victim: decide: %+v, %v", r, err)
	}
	if _, err := e.Refund(ctx, r.Reservation, 0); err != nil {
		t.Fatalf("victim's refund after one client's flood of %d refunds: %v, want it made", refunded, err)
	}
	if r, _ := e.Decide(ctx, "team/a", "victim", 10); !r.Allowed {
		t.Errorf("victim: the refunded units are not spendable")
	}

	if refunded > limiter.MaxRefundRecords/2 {
		t.Errorf("one client made %d refunds at one instant, over its share, half of %d records", refunded, limiter.MaxRefundRecords)
	}
	// The flood's first reservation is still recorded: refunding it again refunds nothing.
	if _, err := e.Refund(ctx, first, 0); !errors.Is(err, engine.ErrRefunded) {
		t.Errorf("second refund of the flood's first reservation: %v, want ErrRefunded", err)
	}
	// The flooding client's refused refund gave nothing back: of its bucket of 10, 9 are left.
	r, _ = e.Decide(ctx, "team/a", "flood", 1)
	if _, err := e.Refund(ctx, r.Reservation, 0); !errors.Is(err, engine.ErrTooManyRefunds) {
		t.Fatalf("the flooding client's refund past its share: %v, want ErrTooManyRefunds", err)
	}
	if r, _ := e.Decide(ctx, "team/a", "flood", 9); !r.Allowed {
		t.Errorf("flood: 9 units not admitted after a refused refund")
	}
	if r, _ := e.Decide(ctx, "team/a", "flood", 1); r.Allowed {
		t.Errorf("flood: an 11th unit admitted: the refused refund gave its unit back")
	}
}
