package limiter_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// TestLeases runs the lease table (limitertest.RunLeases) on the memory store.
func TestLeases(t *testing.T) {
	limitertest.RunLeases(t, func(*testing.T) limiter.Store { return limiter.NewMemory(nil) })
}

// modelLease is a lease as the model of TestConcurrencyMatchesModel knows it.
type modelLease struct {
	id      [16]byte
	issued  time.Time
	seq     uint64 // Decision.Lease
	places  int64
	spent   bool // released or extended: it holds no place
	dropped bool // a reset dropped its places
}

// TestConcurrencyMatchesModel drives a concurrency limit, alone or stacked after a token bucket,
// through random interleavings of acquisitions (some above the limit), peeks, releases,
// extensions, replays of spent leases, releases of expired ones, resets and time passing
// (often not at all, so that leases share an instant), and holds every answer to a trivial
// model: the places held are those of the leases neither spent, dropped by a reset nor
// expired; an acquisition is admitted exactly when they leave room for it; a release frees
// exactly its lease's places, once (a replay answers ErrRefunded, an expired lease
// ErrLeaseExpired, a lease a reset dropped ErrReset). Stacked, the token bucket is held to a
// store that decides it alone, charged only with what the stack admitted: a rejection by the
// concurrency limit charges no rate, one by the rate takes no place, and neither a release nor
// an extension gives a rate unit back. Once every lease has expired, every place is free.
func TestConcurrencyMatchesModel(t *testing.T) {
	rng := testseed.Rand(t, 0)
	ctx := context.Background()
	var ids uint64
	newID := func() [16]byte {
		ids++
		var id [16]byte
		binary.BigEndian.PutUint64(id[8:], ids)
		return id
	}
	for round := range 300 {
		limit := 1 + rng.Int64N(5)
		timeout := time.Duration(10+rng.IntN(90)) * time.Millisecond
		cc, err := limiter.NewConcurrency(limit, timeout)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := limiter.NewTokenBucket(1+rng.Int64N(8), 1+rng.Int64N(5), 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		st, ci := limitertest.One(cc), 0
		stacked := round%2 == 1
		if stacked {
			st, ci = limitertest.Stack("rate", tb, "inflight", cc), 1
		}
		store, ref := limiter.NewMemory(nil), limiter.NewMemory(nil) // ref: the token bucket alone
		rate := limitertest.One(tb)
		var (
			leases    []*modelLease
			lastReset time.Time
			now       = limitertest.T0
		)
		held := func() int64 {
			n := int64(0)
			for _, l := range leases {
				if !l.spent && !l.dropped && l.issued.Add(timeout).After(now) {
					n += l.places
				}
			}
			return n
		}
		peekRate := func() limiter.Decision {
			d, _ := ref.Decide(ctx, "k", rate, now, 0, nil)
			return d
		}
		out := make([]limiter.Decision, st.Len())
		for step := range 200 {
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("round %d (limit %d, timeout %v, stacked %t), step %d at +%v: "+format,
					append([]any{round, limit, timeout, stacked, step, now.Sub(limitertest.T0)}, args...)...)
			}
			switch op := rng.IntN(20); {
			case op < 7: // acquire
				cost := 1 + rng.Int64N(3)
				if rng.IntN(10) == 0 {
					cost = limit + 1
				}
				fits := held()+cost <= limit
				d, err := store.Decide(ctx, "k", st, now, cost, out)
				if err != nil {
					fail("acquire: %v", err)
				}
				if out[ci].Allowed != fits || !d.Allowed && out[ci].Allowed && !stacked {
					fail("acquire %d with %d of %d held: %+v (limit %+v), want admitted by the limit: %t", cost, held(), limit, d, out[ci], fits)
				}
				if stacked {
					if d.Allowed != (fits && out[0].Allowed) {
						fail("acquire %d: stack %+v from %+v", cost, d, out)
					}
					if d.Allowed {
						if r, _ := ref.Decide(ctx, "k", rate, now, cost, nil); r != out[0] {
							fail("acquire %d: the rate answered %+v, alone %+v", cost, out[0], r)
						}
					} else if p := peekRate(); p.Remaining != out[0].Remaining || out[0].Allowed != (out[0].Remaining >= cost) {
						fail("rejected acquire %d: the rate answered %+v, alone it has %d remaining (charged?)", cost, out[0], p.Remaining)
					}
				}
				if d.Allowed {
					leases = append(leases, &modelLease{id: newID(), issued: now, seq: d.Lease, places: cost})
				}
			case op < 13 && len(leases) > 0: // release or extend a lease, maybe spent, expired or dropped
				l := leases[rng.IntN(len(leases))]
				extend := rng.IntN(3) == 0
				var want error
				switch {
				case !l.issued.Add(timeout).After(now):
					want = limiter.ErrLeaseExpired
				case l.spent:
					want = limiter.ErrRefunded
				case !l.issued.After(lastReset):
					want = limiter.ErrReset
				}
				// A lease spent before a reset that left a mark answers ErrReset: the reset
				// dropped its entry, which was its record.
				also := want
				if l.spent && !l.issued.After(lastReset) {
					also = limiter.ErrReset
				}
				once := limiter.Once{Op: limiter.OpRelease, ID: l.id, Issued: l.issued, Until: st.LeaseExpiry(l.issued), Cost: l.places, Lease: l.seq}
				if extend {
					once.Op = limiter.OpExtend
				}
				freed := make([]int64, st.Len())
				before := held()
				d, err := store.Refund(ctx, limiter.Request{Key: "k", Stack: st, Cost: l.places, Limits: out, Refunded: freed}, now, once)
				if !errors.Is(err, want) && !errors.Is(err, also) || want == nil && err != nil {
					fail("%v of a lease (%+v): %v, want %v", once.Op, *l, err, want)
				}
				if err != nil {
					continue
				}
				l.spent = true
				if extend {
					leases = append(leases, &modelLease{id: newID(), issued: now, seq: d.Lease, places: l.places})
				}
				if freed[ci] != l.places {
					fail("%v of a lease of %d places: %d freed or moved", once.Op, l.places, freed[ci])
				}
				if got, want := limit-out[ci].Remaining, held(); got != want || !extend && want != before-l.places {
					fail("%v: %d places held after it, want %d (%d before)", once.Op, got, want, before)
				}
				if stacked {
					if p := peekRate(); freed[0] != 0 || p.Remaining != out[0].Remaining {
						fail("%v gave the rate back %d units: %+v, alone %+v", once.Op, freed[0], out[0], p)
					}
				}
			case op < 14: // reset
				if err := store.Reset(ctx, "k", now); err != nil {
					fail("reset: %v", err)
				}
				if err := ref.Reset(ctx, "k", now); err != nil {
					fail("reset: %v", err)
				}
				for _, l := range leases {
					l.dropped = true
				}
				// A lease issued at the reset's instant, after it, is still void (issued at or
				// before the reset's mark), but only when the reset left a mark (a state with
				// usage): move on, so that no lease shares the reset's instant.
				lastReset, now = now, now.Add(time.Nanosecond)
			default: // time passes, often not at all
				if rng.IntN(3) != 0 {
					now = now.Add(time.Duration(rng.Int64N(int64(timeout / 2))))
				}
			}
			// Peek: the places held, never more than the limit, are the model's.
			if _, err := store.Decide(ctx, "k", st, now, 0, out); err != nil {
				fail("peek: %v", err)
			}
			if h := held(); h > limit || out[ci].Remaining != limit-h || out[ci].Allowed != (h < limit) {
				fail("peek: %+v, want %d of %d places held", out[ci], h, limit)
			}
		}
		// Every lease has expired: every place is free, and the client is fresh.
		now = now.Add(timeout)
		if _, err := store.Decide(ctx, "k", st, now, 0, out); err != nil || out[ci].Remaining != limit || out[ci].ResetAfter != 0 {
			t.Fatalf("round %d: once every lease expired: %+v %v, want %d places free", round, out[ci], err, limit)
		}
	}
}
