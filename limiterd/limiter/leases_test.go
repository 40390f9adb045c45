package limiter

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
)

// TestLeaseSetMatchesSortedMultiset drives a client's leases (leaseSet) through random
// additions (in order, at an expiry already held, and before the newest, as after a clock
// step back), removals (whole entries, part of one, unknown expiries, from either end and the
// middle, across the ring's wrap) and trims, against a plain sorted list of expiries: its
// places, its order and its count of entries agree after every step.
func TestLeaseSetMatchesSortedMultiset(t *testing.T) {
	rng := testseed.Rand(t, 0)
	for range 200 {
		var (
			l     leaseSet
			model []leaseEntry // sorted by expiry, no empty entry
			clock int64
		)
		find := func(expiry int64) int {
			return slices.IndexFunc(model, func(e leaseEntry) bool { return e.expiry == expiry })
		}
		for range 300 {
			switch op := rng.IntN(10); {
			case op < 5: // add
				expiry := clock + 100 + rng.Int64N(20) - 10 // now and then before the newest
				if len(model) > 0 && rng.IntN(4) == 0 {
					expiry = model[rng.IntN(len(model))].expiry // an expiry already held
				}
				places := 1 + rng.Int64N(3)
				l.add(expiry, places)
				if i := find(expiry); i >= 0 {
					model[i].places += places
				} else {
					i, _ := slices.BinarySearchFunc(model, expiry, func(e leaseEntry, x int64) int { return int(e.expiry - x) })
					model = slices.Insert(model, i, leaseEntry{expiry, places})
				}
			case op < 8: // remove
				expiry := clock + rng.Int64N(120)
				if len(model) > 0 && rng.IntN(4) != 0 {
					expiry = model[rng.IntN(len(model))].expiry
				}
				places := 1 + rng.Int64N(4)
				want := int64(0)
				if i := find(expiry); i >= 0 {
					want = min(places, model[i].places)
					if model[i].places -= want; model[i].places == 0 {
						model = slices.Delete(model, i, i+1)
					}
				}
				if got := l.remove(expiry, places); got != want {
					t.Fatalf("remove(%d, %d) took %d, want %d", expiry, places, got, want)
				}
			default: // time passes, the expired entries go
				clock += rng.Int64N(30)
				l.trim(clock)
				model = slices.DeleteFunc(model, func(e leaseEntry) bool { return e.expiry <= clock })
			}
			var got []leaseEntry
			held := int64(0)
			for i := range l.n {
				got = append(got, *l.at(i))
			}
			for _, e := range model {
				held += e.places
			}
			if !slices.Equal(got, model) || l.held != held {
				t.Fatalf("leases %v (held %d), want %v (held %d)", got, l.held, model, held)
			}
			if live, _ := l.live(clock); live != held-expiredPlaces(model, clock) {
				t.Fatalf("live(%d) = %d, want %d", clock, live, held-expiredPlaces(model, clock))
			}
		}
	}
}

func expiredPlaces(model []leaseEntry, t int64) int64 {
	n := int64(0)
	for _, e := range model {
		if e.expiry <= t {
			n += e.places
		}
	}
	return n
}

// TestLeasesCountAgainstTheBudget checks that a concurrency client's lease entries count in the
// byte budget as they grow (16 bytes an entry of the ring's capacity, with the client's map
// entry and key), through decisions and extensions, and leave it when the client is swept.
func TestLeasesCountAgainstTheBudget(t *testing.T) {
	c, err := NewConcurrency(100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	budget := NewBudget(0, 0)
	m := NewMemory(budget)
	st := one(c)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	const key = "client"
	want := func(entries int64) int64 { return int64(len(key)) + windowClientBytes + 16*entries }
	// 8 leases of 2 places at distinct instants: a ring of 8 entries.
	for i := range 8 {
		if d, _ := m.Decide(ctx, key, st, t0.Add(time.Duration(i)), 2, nil); !d.Allowed {
			t.Fatalf("lease %d refused", i)
		}
	}
	if got := budget.Bytes(); got != want(8) {
		t.Fatalf("8 leases: %d bytes accounted, want %d", got, want(8))
	}
	// Extending one place of each to a new instant leaves the other where it was: 16 entries.
	for i := range 8 {
		once := Once{Op: OpExtend, ID: [16]byte{byte(i + 1)}, Issued: t0.Add(time.Duration(i))}
		if _, err := m.Refund(ctx, Request{Key: key, Stack: st, Cost: 1}, t0.Add(time.Second+time.Duration(i)), once); err != nil {
			t.Fatal(err)
		}
	}
	if got := budget.Bytes(); got != want(16) {
		t.Fatalf("after 8 extensions: %d bytes accounted, want %d", got, want(16))
	}
	if d, _ := m.Decide(ctx, key, st, t0.Add(2*time.Second), 1, nil); !d.Allowed || d.Remaining != 100-17 {
		t.Fatalf("a 17th entry: %+v", d)
	}
	if got := budget.Bytes(); got != want(32) {
		t.Fatalf("17 entries: %d bytes accounted, want %d", got, want(32))
	}
	m.Sweep(t0.Add(time.Minute + 3*time.Second)) // every lease has expired
	if budget.Bytes() != 0 || budget.Tracked() != 0 {
		t.Fatalf("after the sweep: %d bytes, %d clients, want none", budget.Bytes(), budget.Tracked())
	}
}

// TestConcurrencyBounds checks the bounds of NewConcurrency's parameters (limiter.go).
func TestConcurrencyBounds(t *testing.T) {
	for _, c := range []struct {
		limit   int64
		timeout time.Duration
		ok      bool
	}{
		{1, MinPeriod, true}, {MaxConcurrencyLimit, MaxPeriod, true},
		{0, time.Second, false}, {MaxConcurrencyLimit + 1, time.Second, false},
		{1, MinPeriod - 1, false}, {1, MaxPeriod + 1, false},
	} {
		if _, err := NewConcurrency(c.limit, c.timeout); (err == nil) != c.ok {
			t.Errorf("NewConcurrency(%d, %v): %v, want ok %t", c.limit, c.timeout, err, c.ok)
		}
	}
	a, _ := NewConcurrency(3, time.Second)
	b, _ := NewConcurrency(3, time.Second)
	if a != b || a.ID() == 0 {
		t.Errorf("equal parameters: %p (ID %d) and %p, want one interned strategy", a, a.ID(), b)
	}
}
