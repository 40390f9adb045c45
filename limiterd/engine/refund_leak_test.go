package engine_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/api/v1alpha1"
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
