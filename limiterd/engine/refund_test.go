package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

func refunds(s *v1alpha1.RateLimitPolicySpec) { s.Refunds = v1alpha1.RefundsEnabled }

// TestReservations checks which decisions carry a reservation: admitted ones of a cost above 0,
// of a limited tier, of a policy that enables refunds, decided by the store.
func TestReservations(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	e.Swap(set(t, compile(t, "on", refunds), compile(t, "off", nil)))
	for _, tt := range []struct {
		policy v1alpha1.PolicyID
		key    string
		cost   int64
		want   bool
	}{
		{"team/on", "k", 1, true},
		{"team/on", "k", 0, false},     // a peek charges nothing
		{"team/on", "k", 1, true},      // the second unit of 2
		{"team/on", "k", 1, false},     // rejected
		{"team/on", "boss", 1, false},  // Unlimited: nothing to refund
		{"team/on", "try-1", 1, true},  // a dry-run tier that admits charges
		{"team/on", "try-1", 1, false}, // a dry-run tier's rejection charged nothing
		{"team/off", "k", 1, false},    // refunds disabled
	} {
		r, err := e.Decide(ctx, tt.policy, tt.key, tt.cost)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Reservation != ""; got != tt.want {
			t.Errorf("Decide(%s, %s, %d): reservation %q, want one: %v", tt.policy, tt.key, tt.cost, r.Reservation, tt.want)
		}
	}
	// A batch answers reservations through the same code.
	items := []engine.BatchItem{{Policy: "team/on", Key: "b", Cost: 2}, {Policy: "team/on", Key: "b", Cost: 1}, {Policy: "team/off", Key: "b", Cost: 1}}
	out := make([]engine.BatchResult, len(items))
	if err := e.DecideBatch(ctx, items, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Reservation == "" || out[1].Reservation != "" || out[2].Reservation != "" {
		t.Errorf("batch reservations: %q %q %q; want only the first", out[0].Reservation, out[1].Reservation, out[2].Reservation)
	}
	if _, err := e.Refund(ctx, out[0].Reservation, 0); err != nil {
		t.Errorf("refund of a batch item's reservation: %v", err)
	}
}

// TestRefundRules checks that a refund returns at most its reservation's cost, once, while it
// can matter, only to the client, policy and tier that were charged.
func TestRefundRules(t *testing.T) {
	now := limitertest.T0
	clock := func() time.Time { return now }
	key := []byte("0123456789abcdef0123456789abcdef")
	signer, _ := reservation.NewSigner(key)
	e := engine.New(engine.Options{Clock: clock, Reservations: signer})
	e.Swap(set(t, compile(t, "a", refunds), compile(t, "off", nil)))
	spend := func(key string, cost int64) string {
		t.Helper()
		r, err := e.Decide(ctx, "team/a", key, cost)
		if err != nil || !r.Allowed || r.Reservation == "" {
			t.Fatalf("Decide(%s, %d) = %+v, %v", key, cost, r, err)
		}
		return r.Reservation
	}
	remaining := func(key string) int64 {
		t.Helper()
		r, err := e.Peek(ctx, "team/a", key)
		if err != nil {
			t.Fatal(err)
		}
		return r.Remaining
	}

	rsv := spend("alice", 2)
	if _, err := e.Refund(ctx, rsv, 3); !errors.Is(err, engine.ErrInvalidAmount) {
		t.Errorf("a refund past its cost: %v", err)
	}
	if _, err := e.Refund(ctx, rsv, -1); !errors.Is(err, engine.ErrInvalidAmount) {
		t.Errorf("a negative refund: %v", err)
	}
	if remaining("alice") != 0 {
		t.Fatalf("refused refunds refunded")
	}
	r, err := e.Refund(ctx, rsv, 1)
	if err != nil || r.Remaining != 1 {
		t.Fatalf("refund of 1 of 2: %+v %v", r, err)
	}
	if _, err := e.Refund(ctx, rsv, 1); !errors.Is(err, engine.ErrRefunded) {
		t.Errorf("a second refund of one reservation: %v", err)
	}
	if remaining("alice") != 1 {
		t.Fatalf("a repeated refund refunded")
	}

	// Another engine with another key (another deployment): forged.
	other := engine.New(engine.Options{Clock: clock})
	other.Swap(set(t, compile(t, "a", refunds)))
	otherRsv, _ := other.Decide(ctx, "team/a", "bob", 1)
	spend("bob", 2)
	if _, err := e.Refund(ctx, otherRsv.Reservation, 0); !errors.Is(err, engine.ErrForgedReservation) {
		t.Errorf("a reservation signed under another key: %v", err)
	}
	for _, bad := range []string{"", "x", "not a reservation!"} {
		if _, err := e.Refund(ctx, bad, 0); !errors.Is(err, engine.ErrInvalidReservation) {
			t.Errorf("Refund(%q): %v", bad, err)
		}
	}
	if remaining("bob") != 0 {
		t.Fatalf("a forged refund refunded bob")
	}

	// A reservation of a policy that does not enable refunds (one enabled then disabled).
	carol := spend("carol", 2)
	e.Swap(set(t, compile(t, "a", nil)))
	if _, err := e.Refund(ctx, carol, 0); !errors.Is(err, engine.ErrRefundsDisabled) {
		t.Errorf("refund on a policy without refunds: %v", err)
	}
	// The client moved to another tier.
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) {
		refunds(s)
		s.Overrides = append(s.Overrides, v1alpha1.Override{Tier: "shadow", Clients: []string{"carol"}})
	})))
	if _, err := e.Refund(ctx, carol, 0); !errors.Is(err, engine.ErrReservationStale) {
		t.Errorf("refund after the client changed tier: %v", err)
	}
	e.Swap(set(t, compile(t, "a", refunds)))
	if remaining("carol") != 0 {
		t.Fatalf("a refused refund refunded carol")
	}

	// Expired: a token bucket of 2 refilling 1/h; 2 units charged of a full bucket have refilled
	// 2h later. Until then, what has not refilled comes back to the nanosecond: a nanosecond
	// before, the bucket holds 1 and the refund fills it, as if the charge had never been.
	dave := spend("dave", 2)
	now = now.Add(2 * time.Hour)
	if _, err := e.Refund(ctx, dave, 0); !errors.Is(err, engine.ErrReservationExpired) {
		t.Errorf("refund after both units have refilled: %v", err)
	}
	now = now.Add(-time.Nanosecond)
	if r, err := e.Refund(ctx, dave, 0); err != nil || r.Remaining != 2 {
		t.Errorf("refund a nanosecond before both units have refilled: %+v, %v", r, err)
	}
}

// TestRefundStoreFailure checks that a store failure during a refund says its outcome is
// unknown whatever the failure mode, refunds no fallback, and that a retry is safe.
func TestRefundStoreFailure(t *testing.T) {
	for _, mode := range []v1alpha1.FailureMode{v1alpha1.FailureModeOpen, v1alpha1.FailureModeClosed, v1alpha1.FailureModeLocal} {
		// A shared store (not a limiter.LocalStore) that goes down after the decision.
		store := &struct{ limiter.Store }{limiter.NewMemory(nil)}
		e := engine.New(engine.Options{Clock: fixedClock(), NewStore: func(v1alpha1.PolicyID) limiter.Store { return store }})
		e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { refunds(s); s.FailureMode = mode })))
		r, _ := e.Decide(ctx, "team/a", "k", 2)
		store.Store = failingStore{}
		if _, err := e.Refund(ctx, r.Reservation, 0); !errors.Is(err, engine.ErrRefundUncertain) {
			t.Errorf("%s: refund with the store down: %v", mode, err)
		}
	}
}

// BenchmarkDecideReservation measures what a reservation adds to a decision: refunds off
// (nothing) and on (an HMAC and the token).
func BenchmarkDecideReservation(b *testing.B) {
	for _, bc := range []struct {
		name   string
		mutate func(*v1alpha1.RateLimitPolicySpec)
	}{{"off", nil}, {"on", refunds}} {
		b.Run(bc.name, func(b *testing.B) {
			e := engine.New(engine.Options{})
			e.Swap(set(b, compile(b, "a", func(s *v1alpha1.RateLimitPolicySpec) {
				s.Tiers[0] = tokenBucket("free", 1e9)
				s.Tiers[0].TokenBucket.RefillRate = 1e9
				s.Tiers[0].TokenBucket.RefillPeriod.Duration = time.Second
				if bc.mutate != nil {
					bc.mutate(s)
				}
			})))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Decide(ctx, "team/a", "client-42", 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// fullRecordsStore refuses every refund as a memory store whose refund records are full does.
type fullRecordsStore struct{ limiter.Store }

func (fullRecordsStore) Refund(context.Context, limiter.Request, time.Time, limiter.Once) (limiter.Decision, error) {
	return limiter.Decision{}, limiter.ErrTooManyRefunds
}

// TestRefundRecordsFull: a refund the store refuses because its records are full made nothing,
// and says so (ErrTooManyRefunds), rather than that its outcome is unknown (before:
// ErrRefundUncertain, "the refund may not have been made"), and counts no store error.
func TestRefundRecordsFull(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock(),
		NewStore: func(v1alpha1.PolicyID) limiter.Store { return fullRecordsStore{limiter.NewMemory(nil)} }})
	e.Swap(set(t, compile(t, "a", refunds)))
	r, _ := e.Decide(ctx, "team/a", "k", 2)
	_, err := e.Refund(ctx, r.Reservation, 0)
	if !errors.Is(err, engine.ErrTooManyRefunds) || errors.Is(err, engine.ErrRefundUncertain) {
		t.Errorf("refund on full records: %v, want ErrTooManyRefunds", err)
	}
}
