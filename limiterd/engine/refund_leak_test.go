package engine_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// TestReservationHidesTierNames: with spec.tierNames Hidden the caller learns no tier name,
// neither from the reservation (signed, not encrypted: before, it carried the tier's name in
// clear) nor from the error of a refund whose client has changed tier (which quoted it).
func TestReservationHidesTierNames(t *testing.T) {
	const secret = "secret-partner-tier"
	hidden := func(acmeTier string) func(*v1alpha1.RateLimitPolicySpec) {
		return func(s *v1alpha1.RateLimitPolicySpec) {
			refunds(s)
			s.TierNames = v1alpha1.TierNamesHidden
			s.Tiers = append(s.Tiers, tokenBucket(secret, 5))
			s.Overrides = append(s.Overrides, v1alpha1.Override{Tier: acmeTier, Clients: []string{"acme"}})
		}
	}
	e := engine.New(engine.Options{Clock: fixedClock()})
	e.Swap(set(t, compile(t, "a", hidden(secret))))
	r, err := e.Decide(ctx, "team/a", "acme", 1)
	if err != nil || r.Reservation == "" {
		t.Fatalf("Decide = %+v, %v", r, err)
	}
	raw, err := base64.RawURLEncoding.DecodeString(r.Reservation)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), secret) {
		t.Errorf("the reservation names the hidden tier: %q", raw)
	}
	// acme moves to tier free: the refund is stale, and says so without the name.
	e.Swap(set(t, compile(t, "a", hidden("free"))))
	_, err = e.Refund(ctx, r.Reservation, 0)
	if !errors.Is(err, engine.ErrReservationStale) {
		t.Fatalf("refund after a tier change: %v, want ErrReservationStale", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("the error names the hidden tier: %v", err)
	}
}

// TestRecreatedPolicyRefusesEarlierReservations: a policy removed and applied again on the memory
// store starts with no client state and no refund records; a reservation of the store before
// must not refund there, or it would refund a second time (before: it refunded once more).
func TestRecreatedPolicyRefusesEarlierReservations(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	p := compile(t, "a", refunds)
	e.Swap(set(t, p))
	r, _ := e.Decide(ctx, "team/a", "k", 2)
	if _, err := e.Refund(ctx, r.Reservation, 0); err != nil {
		t.Fatalf("first refund: %v", err)
	}
	e.Swap(set(t, compile(t, "other", nil)))
	e.Swap(set(t, p))
	if d, _ := e.Decide(ctx, "team/a", "k", 2); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("spend on the re-created policy: %+v", d)
	}
	if got, err := e.Refund(ctx, r.Reservation, 0); !errors.Is(err, engine.ErrReservationStale) {
		t.Errorf("refund of a reservation of the policy's earlier store: %+v, %v; want ErrReservationStale", got.Decision, err)
	}
	if d, _ := e.Peek(ctx, "team/a", "k"); d.Remaining != 0 {
		t.Errorf("remaining %d after the refused refund, want 0", d.Remaining)
	}
	// A policy that stays (edited, not re-created) keeps its store and its reservations.
	r, _ = e.Decide(ctx, "team/a", "k2", 1)
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { refunds(s); s.Tiers[2].DryRun = true })))
	if _, err := e.Refund(ctx, r.Reservation, 0); err != nil {
		t.Errorf("refund after an edit of the policy: %v", err)
	}
}

// TestRefundAfterSlowerRefillGivesNoMore: a reservation refunds only under the limits that
// charged it. Its bound (the units that have certainly not refilled since the charge) is
// computed from a rate; under a rate the operator lowered since, it counts fewer units as
// refilled than did refill, and the refund gives back units the client had already got again
// and spent (before: 4 units where 2 had not refilled, after the tier went from 1 per second to
// 1 per 100 s).
func TestRefundAfterSlowerRefillGivesNoMore(t *testing.T) {
	clock := testsupport.NewClock()
	e := engine.New(engine.Options{Clock: clock.Now})
	rate := func(period time.Duration) func(*v1alpha1.RateLimitPolicySpec) {
		return func(s *v1alpha1.RateLimitPolicySpec) {
			refunds(s)
			s.Tiers[0] = testsupport.TokenBucketTier("free", 10, 1, period)
		}
	}
	e.Swap(set(t, compile(t, "a", rate(time.Second))))
	r, err := e.Decide(ctx, "team/a", "k", 5)
	if err != nil || !r.Allowed || r.Reservation == "" {
		t.Fatalf("charge of 5: %+v, %v", r, err)
	}
	clock.Advance(3 * time.Second) // 3 of the 5 units have refilled: 8 left
	if r, _ := e.Decide(ctx, "team/a", "k", 8); !r.Allowed {
		t.Fatalf("spending the 8 units left: %+v", r.Decision)
	}
	e.Swap(set(t, compile(t, "a", rate(100*time.Second))))
	got, err := e.Refund(ctx, r.Reservation, 0)
	if !errors.Is(err, engine.ErrReservationStale) {
		t.Errorf("refund under a slower refill: %+v, %v; want ErrReservationStale", got.Decision, err)
	}
	if d, _ := e.Peek(ctx, "team/a", "k"); d.Remaining != 0 {
		t.Errorf("remaining %d after the refund, want 0: the client spent every unit the policy gave", d.Remaining)
	}
}
