package limiter

import (
	"context"
	"testing"
	"time"
)

// TestLeaseStatsCountEachLeaseOnce follows LeaseStats through a stack of a rate limit and two
// concurrency limits: a lease counts once (not once per concurrency limit), a rejection takes
// none, a release and a reset end leases without counting them expired, and a lease dropped
// after its expiry, by a decision, a sweep or a reset, counts as expired.
func TestLeaseStatsCountEachLeaseOnce(t *testing.T) {
	tb, err := NewTokenBucket(3, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	long, err := NewConcurrency(10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	short, err := NewConcurrency(10, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := NewStack([]string{"rate", "long", "short"}, []RateLimiter{tb, long, short})
	if err != nil {
		t.Fatal(err)
	}
	stats := st.LeaseStats()
	if stats == nil {
		t.Fatal("a stack with concurrency limits has no LeaseStats")
	}
	if plain, _ := NewStack([]string{"rate"}, []RateLimiter{tb}); plain.LeaseStats() != nil {
		t.Error("a stack without a concurrency limit has LeaseStats")
	}
	m := NewMemory(NewBudget(0, 0))
	ctx := context.Background()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	out := make([]Decision, 3)
	want := func(what string, held int64, expired uint64) {
		t.Helper()
		if stats.Held() != held || stats.Expired() != expired {
			t.Errorf("%s: held %d expired %d, want %d and %d", what, stats.Held(), stats.Expired(), held, expired)
		}
	}
	acquire := func(key string, at time.Time) Decision {
		t.Helper()
		d, err := m.Decide(ctx, key, st, at, 1, out)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	a := acquire("a", t0)
	acquire("b", t0)
	want("two leases", 2, 0)
	once := Once{Op: OpRelease, ID: [16]byte{1}, Issued: t0, Lease: a.Lease}
	if _, err := m.Refund(ctx, Request{Key: "a", Stack: st, Cost: 1, Limits: out}, t0, once); err != nil {
		t.Fatal(err)
	}
	want("a released", 1, 0)
	acquire("a", t0)
	acquire("a", t0)
	if d := acquire("a", t0); d.Allowed || d.Lease != 0 {
		t.Fatalf("a's fourth request passed its rate of 3: %+v", d)
	}
	want("two more of a, one rejected by the rate", 3, 0)
	if d, _ := m.Decide(ctx, "e", st, t0, 4, out); d.Allowed {
		t.Fatalf("a new client's cost of 4 passed its rate of 3: %+v", d)
	}
	want("a new client rejected by the rate", 3, 0)

	// At 30s the leases have expired, by the shortest timeout (the lease's). b's next decision
	// drops b's; a reset of a drops a's two, expired; a reset of a live lease is no expiry.
	t1 := t0.Add(30 * time.Second)
	acquire("b", t1)
	want("b decided after its lease expired", 3, 1)
	if err := m.Reset(ctx, "a", t1); err != nil {
		t.Fatal(err)
	}
	want("a reset after its leases expired", 1, 3)
	if err := m.Reset(ctx, "b", t1); err != nil {
		t.Fatal(err)
	}
	want("b reset while its lease is live", 0, 3)

	// A sweep drops a client whose leases all expired, and trims one that still holds one.
	acquire("c", t1)
	acquire("d", t1)
	acquire("d", t1.Add(20*time.Second))
	want("c and d", 3, 3)
	m.Sweep(t1.Add(40 * time.Second)) // c's lease and d's first have expired, d's second not
	want("swept", 1, 5)
}

// TestShareLeaseStats checks that a stack compiled again counts where the one it replaces
// did, and that a lease taken under the old one is counted once under the new.
func TestShareLeaseStats(t *testing.T) {
	c, err := NewConcurrency(5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	before, after := one(c), one(c)
	m := NewMemory(NewBudget(0, 0))
	ctx := context.Background()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	if d, _ := m.Decide(ctx, "a", before, t0, 1, nil); !d.Allowed {
		t.Fatal("refused")
	}
	after.ShareLeaseStats(before)
	if after.LeaseStats() != before.LeaseStats() {
		t.Fatal("ShareLeaseStats kept the stack's own counts")
	}
	if d, _ := m.Decide(ctx, "a", after, t0, 1, nil); !d.Allowed {
		t.Fatal("refused")
	}
	if got := after.LeaseStats().Held(); got != 2 {
		t.Errorf("held %d, want 2", got)
	}
	// A stack whose leases count on another limit (a concurrency limit of a shorter timeout
	// added) keeps counts of its own: the old limit's entries end on the old counts.
	shorter, err := NewConcurrency(5, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	edited, err := NewStack([]string{DefaultLimitName, "short"}, []RateLimiter{c, shorter})
	if err != nil {
		t.Fatal(err)
	}
	if edited.ShareLeaseStats(before); edited.LeaseStats() == before.LeaseStats() {
		t.Error("a stack counting on another limit shares the counts")
	}
	// A stack counting elsewhere (another tier) moves the client's leases to its counts.
	other := one(c)
	if d, _ := m.Decide(ctx, "a", other, t0, 1, nil); !d.Allowed {
		t.Fatal("refused")
	}
	if before.LeaseStats().Held() != 0 || other.LeaseStats().Held() != 3 {
		t.Errorf("held %d and %d after the client's tier changed, want 0 and 3", before.LeaseStats().Held(), other.LeaseStats().Held())
	}
}

// TestLeaseStatsOfAClosedStore: a store closed (its policy removed, or a Local failure mode's
// fallback no longer used) ends the leases it held, none as expired, so that a tier that
// stays, counting on other stores, holds none of them.
func TestLeaseStatsOfAClosedStore(t *testing.T) {
	c, err := NewConcurrency(5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	st := one(c)
	m := NewMemory(NewBudget(0, 0))
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, key := range []string{"a", "a", "b"} {
		if d, _ := m.Decide(context.Background(), key, st, t0, 1, nil); !d.Allowed {
			t.Fatal("refused")
		}
	}
	if got := st.LeaseStats().Held(); got != 3 {
		t.Fatalf("held %d, want 3", got)
	}
	m.Close()
	if held, expired := st.LeaseStats().Held(), st.LeaseStats().Expired(); held != 0 || expired != 0 {
		t.Errorf("after Close: held %d expired %d, want 0 and 0", held, expired)
	}
}
