package limiter

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
)

// TestLeaseSetMatchesSortedMultiset drives a client's leases (leaseSet) through random
// additions (in order, at an expiry already held, and before the newest, as after a clock
// step back), removals (of held leases, of seqs already removed, of a held seq under another
// expiry, of unknown expiries; from either end and the middle, across the ring's wrap) and
// trims, against a plain list of leases sorted by expiry then by addition: its entries, its
// places and its count agree after every step.
func TestLeaseSetMatchesSortedMultiset(t *testing.T) {
	rng := testseed.Rand(t, 0)
	for range 200 {
		var (
			l     leaseSet
			model []leaseEntry // sorted by expiry, then in the order added
			seqs  []leaseEntry // every lease added, removed or not
			clock int64
			seq   uint64
		)
		find := func(expiry int64, seq uint64) int {
			return slices.IndexFunc(model, func(e leaseEntry) bool { return e.expiry == expiry && e.seq == seq })
		}
		for range 300 {
			switch op := rng.IntN(10); {
			case op < 5: // add
				expiry := clock + 100 + rng.Int64N(20) - 10 // now and then before the newest
				if len(model) > 0 && rng.IntN(4) == 0 {
					expiry = model[rng.IntN(len(model))].expiry // an expiry already held
				}
				seq++
				e := leaseEntry{expiry: expiry, places: 1 + rng.Int64N(3), seq: seq}
				l.add(e.expiry, e.places, e.seq)
				i := len(model)
				for i > 0 && model[i-1].expiry > expiry {
					i--
				}
				model = slices.Insert(model, i, e)
				seqs = append(seqs, e)
			case op < 8: // remove
				e := leaseEntry{expiry: clock + rng.Int64N(120), seq: seq + 1}
				if len(seqs) > 0 && rng.IntN(4) != 0 {
					e = seqs[rng.IntN(len(seqs))] // maybe removed or expired already
					if rng.IntN(5) == 0 {
						e.expiry++ // a held seq under another expiry
					}
				}
				want := int64(0)
				if i := find(e.expiry, e.seq); i >= 0 {
					want = model[i].places
					model = slices.Delete(model, i, i+1)
				}
				if got := l.remove(e.expiry, e.seq); got != want {
					t.Fatalf("remove(%d, %d) took %d, want %d", e.expiry, e.seq, got, want)
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
// byte budget as they grow (24 bytes an entry of the ring's capacity, with the client's map
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
	want := func(entries int64) int64 { return int64(len(key)) + windowClientBytes + 24*entries }
	// 8 leases of 2 places, two at each of 4 instants: a ring of 8 entries, one a lease.
	var leases [8]uint64
	for i := range 8 {
		d, _ := m.Decide(ctx, key, st, t0.Add(time.Duration(i/2)), 2, nil)
		if !d.Allowed || d.Lease == 0 {
			t.Fatalf("lease %d refused: %+v", i, d)
		}
		leases[i] = d.Lease
	}
	if got := budget.Bytes(); got != want(8) {
		t.Fatalf("8 leases: %d bytes accounted, want %d", got, want(8))
	}
	// Extending them and taking 8 more: 16 entries.
	for i := range 8 {
		once := Once{Op: OpExtend, ID: [16]byte{byte(i + 1)}, Issued: t0.Add(time.Duration(i / 2)), Lease: leases[i]}
		if _, err := m.Refund(ctx, Request{Key: key, Stack: st, Cost: 2}, t0.Add(time.Second+time.Duration(i)), once); err != nil {
			t.Fatal(err)
		}
		if d, _ := m.Decide(ctx, key, st, t0.Add(time.Second+time.Duration(i)), 1, nil); !d.Allowed {
			t.Fatalf("lease %d refused: %+v", 8+i, d)
		}
	}
	if got := budget.Bytes(); got != want(16) {
		t.Fatalf("after 8 extensions and 8 leases: %d bytes accounted, want %d", got, want(16))
	}
	if d, _ := m.Decide(ctx, key, st, t0.Add(2*time.Second), 1, nil); !d.Allowed || d.Remaining != 100-25 {
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

// TestReleaseNamesALease checks that a release or an extension must name its lease by its seq
// (Once.Lease), ErrNoLease without one, and that a store holding no lease (one that never
// decided, or a client without state) refuses the release of any (ErrRefunded), freeing
// nothing.
func TestReleaseNamesALease(t *testing.T) {
	c, err := NewConcurrency(2, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	st := one(c)
	ctx := context.Background()
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, op := range []OnceOp{OpRelease, OpExtend} {
		m := NewMemory(nil)
		once := Once{Op: op, ID: [16]byte{1}, Issued: t0, Lease: 1 << 62}
		if _, err := m.Refund(ctx, Request{Key: "a", Stack: st, Cost: 1}, t0, once); !errors.Is(err, ErrRefunded) {
			t.Errorf("%v by a store that never decided: %v, want ErrRefunded", op, err)
		}
		d, _ := m.Decide(ctx, "a", st, t0, 1, nil)
		if !d.Allowed || d.Lease == 0 {
			t.Fatalf("acquire: %+v, want a lease", d)
		}
		once.Lease = 0
		if _, err := m.Refund(ctx, Request{Key: "a", Stack: st, Cost: 1}, t0, once); !errors.Is(err, ErrNoLease) {
			t.Errorf("%v without a seq: %v, want ErrNoLease", op, err)
		}
		once.Lease = d.Lease
		if _, err := m.Refund(ctx, Request{Key: "b", Stack: st, Cost: 1}, t0, once); !errors.Is(err, ErrRefunded) {
			t.Errorf("%v of a's lease by b: %v, want ErrRefunded", op, err)
		}
		if p, _ := m.Decide(ctx, "a", st, t0, 0, nil); p.Remaining != 1 {
			t.Errorf("%v: %d places free after the refusals, want 1", op, p.Remaining)
		}
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
