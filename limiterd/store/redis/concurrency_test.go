package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// leaseRuns numbers the runs of the lease tests: each on policies of its own, since the shared
// redis-server keeps the leases and lease counters of a previous run (go test -count) at the
// same instants.
var leaseRuns atomic.Int64

// leaseStore returns a store of c on a policy of its own for this run.
func leaseStore(t *testing.T, c *Client) *Store {
	return c.Store(fmt.Sprintf("%s#%d", t.Name(), leaseRuns.Add(1)))
}

// TestLeases runs the lease table (limitertest.RunLeases) on Redis: acquisitions, releases,
// extensions, expiries, replays and resets, alone and stacked with a rate limit, answered as the
// memory store answers them.
func TestLeases(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunLeases(t, func(t *testing.T) limiter.Store { return leaseStore(t, c) })
}

// heldLease is a lease that TestLeasesMatchMemory took: on the client key, issued at issued, of
// places, named mem in the memory store and red in Redis (each store counts its own seqs).
type heldLease struct {
	key      string
	issued   time.Time
	mem, red uint64
	places   int64
}

// leaseStack returns a random stack with a concurrency limit, sometimes a second one, and up to
// the stack's size of rate limits, named from one pool: a name that held a concurrency limit in
// one stack may hold a rate limit in the next, and the other way round (a conversion).
func leaseStack(r *rand.Rand) *limiter.Stack {
	timeouts := []time.Duration{time.Millisecond, 40 * time.Millisecond, time.Second, 10 * time.Second}
	cc := func() limiter.RateLimiter {
		c, err := limiter.NewConcurrency(1+r.Int64N(5), timeouts[r.IntN(len(timeouts))])
		if err != nil {
			panic(err)
		}
		return c
	}
	limits := []limiter.RateLimiter{cc()}
	if r.IntN(3) == 0 {
		limits = append(limits, cc())
	}
	for len(limits) < limiter.MaxStack && r.IntN(2) == 0 {
		if rl := randomStrategy(r); rl.Algorithm() != limiter.AlgorithmUnlimited {
			limits = append(limits, rl)
		}
	}
	r.Shuffle(len(limits), func(i, j int) { limits[i], limits[j] = limits[j], limits[i] })
	names := []string{limiter.DefaultLimitName, "a", "b", "c"}
	r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	var args []any
	for i, rl := range limits {
		args = append(args, names[i], rl)
	}
	return limitertest.Stack(args...)
}

// TestLeasesMatchMemory runs random acquisitions, peeks, releases (replays and expired leases
// included), extensions, refunds, resets and clock steps (backwards too, and past the lease
// timeouts) on stacks holding a concurrency limit, on a few clients, against Redis and against
// limiter.Memory: every answer must be the same, each limit's too, and the places each release
// or extension freed or moved; only the seqs that name the leases differ (each store counts its
// own), so each lease is kept under both.
func TestLeasesMatchMemory(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	base := testseed.Seed(t)
	for seed := base; seed < base+seeds; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			compareLeasesWithMemory(t, leaseStore(t, c), rand.New(rand.NewPCG(seed, 13)), 600, true)
		})
	}
}

// compareLeasesWithMemory makes steps random calls on store and on a memory store, on stacks that
// hold a concurrency limit (swapped for others now and then with swaps), and fails at the first
// answer that differs.
func compareLeasesWithMemory(t *testing.T, store limiter.Store, r *rand.Rand, steps int, swaps bool) {
	t.Helper()
	ctx := t.Context()
	mem := limiter.NewMemory(nil)
	st := leaseStack(r)
	now := limitertest.T0.Add(time.Duration(r.Int64N(int64(time.Hour))))
	keys := []string{"a", "b{}"}
	var (
		leases    []heldLease
		lastReset time.Time
		swapped   bool
	)
	for i := range steps {
		if swaps && r.IntN(40) == 0 {
			st = leaseStack(r) // the leases held are named on the new stack's limits
			swapped = true
		}
		switch r.IntN(10) {
		case 0:
			now = now.Add(-time.Duration(r.Int64N(int64(500 * time.Millisecond))))
		case 1:
			now = now.Add(time.Duration(r.Int64N(int64(20 * time.Second))))
		case 2, 3, 4:
		default:
			now = now.Add(time.Duration(r.Int64N(int64(30 * time.Millisecond))))
		}
		// Never back to a reset's instant or before: a lease issued then is void in Redis, which
		// marks the reset while a deleted key lived (its expiry slack included), and not in memory
		// if the client held nothing (a mark's span, which is not this slice's).
		if !now.After(lastReset) {
			now = lastReset.Add(1)
		}
		key := keys[r.IntN(len(keys))]
		limit := int64(1)
		for j := range st.Len() {
			if st.Limiter(j).Algorithm() == limiter.AlgorithmConcurrency {
				limit = max(limit, st.Limiter(j).Limit())
			}
		}
		cost := []int64{1, 1, 1, 2, limit, limit + 1}[r.IntN(6)]
		want, got := make([]limiter.Decision, st.Len()), make([]limiter.Decision, st.Len())
		wantFreed, gotFreed := make([]int64, st.Len()), make([]int64, st.Len())
		var (
			wantD, gotD     limiter.Decision
			wantErr, gotErr error
			op              string
			lease           *heldLease
		)
		switch k := r.IntN(20); {
		case k < 3:
			op = "peek"
			wantD, wantErr = mem.Decide(ctx, key, st, now, 0, want)
			gotD, gotErr = store.Decide(ctx, key, st, now, 0, got)
		case k < 9 && len(leases) > 0:
			lease = &leases[r.IntN(len(leases))]
			once := limiter.Once{Op: limiter.OpRelease, Issued: lease.issued, Lease: lease.mem}
			op = "release"
			if k >= 6 {
				op, once.Op = "extend", limiter.OpExtend
			}
			key = lease.key
			wantD, wantErr = mem.Refund(ctx, limiter.Request{Key: key, Stack: st, Cost: lease.places, Limits: want, Refunded: wantFreed}, now, once)
			once.Lease = lease.red
			gotD, gotErr = store.Refund(ctx, limiter.Request{Key: key, Stack: st, Cost: lease.places, Limits: got, Refunded: gotFreed}, now, once)
		case k == 9 && swapped:
			// No refund once a limit may hold another algorithm's state: limiter.Memory's
			// sliding window refunds the units it charged for a concurrency limit's leases
			// (SlidingWindow.Refund converts in place), where every other conversion, and
			// Redis, refund nothing on another algorithm's state.
			continue
		case k == 9:
			// A refund of a charge made after every reset: the stores mark a reset for different
			// spans (Redis while a key lives, its expiry slack included), so a charge made
			// before may be void in one and not in the other.
			op = "refund"
			once := limiter.Once{Issued: now, Until: now.Add(time.Hour)}
			if !once.Issued.After(lastReset) {
				once.Issued = lastReset.Add(1)
			}
			binary.BigEndian.PutUint64(once.ID[:], uint64(i))
			if wantD, wantErr = mem.Refund(ctx, limiter.Request{Key: key, Stack: st, Cost: cost, Limits: want}, now, once); errors.Is(wantErr, limiter.ErrRefundTooLate) {
				continue // see refundTooLateForMemory
			}
			gotD, gotErr = store.Refund(ctx, limiter.Request{Key: key, Stack: st, Cost: cost, Limits: got}, now, once)
		case k == 11:
			// A batch: the stack twice on key (its leases taken in order), once on the other key.
			op = "batch"
			other := keys[0]
			if key == other {
				other = keys[1]
			}
			reqs := []limiter.Request{
				{Key: key, Stack: st, Cost: cost, Limits: got},
				{Key: other, Stack: st, Cost: 1, Limits: make([]limiter.Decision, st.Len())},
				{Key: key, Stack: st, Cost: 1, Limits: make([]limiter.Decision, st.Len())},
			}
			outs := make([]limiter.Answer, len(reqs))
			store.DecideBatch(ctx, reqs, now, outs)
			for j, rq := range reqs {
				w := want
				if j > 0 {
					w = make([]limiter.Decision, st.Len())
				}
				d, err := mem.Decide(ctx, rq.Key, st, now, rq.Cost, w)
				if j == 0 {
					wantD, wantErr, gotD, gotErr = d, err, outs[0].Decision, outs[0].Err
					continue
				}
				if err != nil || outs[j].Err != nil {
					t.Fatalf("step %d: batch item %d: redis %v, memory %v", i, j, outs[j].Err, err)
				}
				if (d.Lease == 0) != (outs[j].Decision.Lease == 0) {
					t.Fatalf("step %d: batch item %d: redis names lease %d, memory %d", i, j, outs[j].Decision.Lease, d.Lease)
				}
				if d.Lease != 0 {
					leases = append(leases, heldLease{key: rq.Key, issued: now, mem: d.Lease, red: outs[j].Decision.Lease, places: 1})
				}
				for m := range w {
					rq.Limits[m].Lease, w[m].Lease = 0, 0
					if rq.Limits[m] != w[m] {
						t.Fatalf("step %d: batch item %d, limit %q:\n redis  %+v\n memory %+v", i, j, st.Name(m), rq.Limits[m], w[m])
					}
				}
			}
		case k == 10 && r.IntN(3) == 0:
			op = "reset"
			wantErr, gotErr = mem.Reset(ctx, key, now), store.Reset(ctx, key, now)
			if now.After(lastReset) {
				lastReset = now
			}
		default:
			op = "acquire"
			wantD, wantErr = mem.Decide(ctx, key, st, now, cost, want)
			gotD, gotErr = store.Decide(ctx, key, st, now, cost, got)
		}
		where := fmt.Sprintf("step %d: %s %q of %d at %v", i, op, key, cost, now.Sub(limitertest.T0))
		if gotErr != nil || wantErr != nil {
			// A lease released (or extended) before a reset of its client: Redis marks a reset
			// while a deleted key lived, its expiry slack included, memory while a state held
			// something; both refuse the lease again and change nothing, one as reset.
			if (op == "release" || op == "extend") && errors.Is(gotErr, limiter.ErrReset) && errors.Is(wantErr, limiter.ErrRefunded) && !lease.issued.After(lastReset) {
				continue
			}
			if !sameLeaseError(gotErr, wantErr) {
				t.Fatalf("%s: redis %v, memory %v", where, gotErr, wantErr)
			}
			continue
		}
		if (gotD.Lease == 0) != (wantD.Lease == 0) {
			t.Fatalf("%s: redis names lease %d, memory %d", where, gotD.Lease, wantD.Lease)
		}
		if wantD.Lease != 0 {
			switch op {
			case "acquire", "batch":
				leases = append(leases, heldLease{key: key, issued: now, mem: wantD.Lease, red: gotD.Lease, places: cost})
			case "extend":
				leases = append(leases, heldLease{key: key, issued: now, mem: wantD.Lease, red: gotD.Lease, places: lease.places})
			}
		}
		for j := range want {
			if (got[j].Lease == 0) != (want[j].Lease == 0) {
				t.Fatalf("%s, limit %q: redis names lease %d, memory %d", where, st.Name(j), got[j].Lease, want[j].Lease)
			}
			got[j].Lease, want[j].Lease = 0, 0
			if got[j] != want[j] {
				t.Fatalf("%s, limit %q by %s:\n redis  %+v\n memory %+v", where, st.Name(j), fingerprint(st.Limiter(j)), got[j], want[j])
			}
			if gotFreed[j] != wantFreed[j] {
				t.Fatalf("%s, limit %q: redis freed or moved %d places, memory %d", where, st.Name(j), gotFreed[j], wantFreed[j])
			}
		}
		gotD.Lease, wantD.Lease = 0, 0
		if gotD != wantD {
			t.Fatalf("%s: the stack answered %+v, memory %+v", where, gotD, wantD)
		}
	}
}

// sameLeaseError reports whether two stores failed alike: with the same error of Store.Refund.
func sameLeaseError(a, b error) bool {
	for _, e := range []error{limiter.ErrRefunded, limiter.ErrLeaseExpired, limiter.ErrReset, limiter.ErrNoLease, limiter.ErrInvalidCost} {
		if errors.Is(a, e) || errors.Is(b, e) {
			return errors.Is(a, e) && errors.Is(b, e)
		}
	}
	return false
}

// TestLeasesTwoReplicas: callers on two replicas (two Clients, one Redis) take and release places
// of one client's concurrency limit, stacked with a rate limit, at once: never more than the limit
// are held (each caller counts its lease as held from its admission until before its release),
// and once every lease is released every place is free again.
func TestLeasesTwoReplicas(t *testing.T) {
	t.Parallel()
	addr := shared(t).Addr()
	policy := fmt.Sprintf("%s#%d", t.Name(), leaseRuns.Add(1))
	replicas := []*Store{newClient(t, testOptions(addr)).Store(policy), newClient(t, testOptions(addr)).Store(policy)}
	const limit, callers, rounds = 3, 8, 40
	cc, err := limiter.NewConcurrency(limit, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	st := limitertest.Stack("rate", tokenBucket(t, 1_000_000, 1_000_000, time.Second), "inflight", cc)
	var (
		held, peak, admitted atomic.Int64
		wg                   sync.WaitGroup
		failed               atomic.Value
	)
	fail := func(err error) { failed.CompareAndSwap(nil, err) }
	for g := range callers {
		wg.Go(func() {
			ctx := context.Background()
			for i := range rounds {
				s := replicas[(g+i)%2]
				now := time.Now()
				d, err := s.Decide(ctx, "shared", st, now, 1, nil)
				if err != nil {
					fail(err)
					return
				}
				if !d.Allowed {
					continue
				}
				admitted.Add(1)
				n := held.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Millisecond) // held a while: the others overlap it
				held.Add(-1)
				// Released on the other replica, half the time.
				if i%2 == 0 {
					s = replicas[(g+i+1)%2]
				}
				once := limiter.Once{Op: limiter.OpRelease, Issued: now, Lease: d.Lease}
				if _, err := s.Refund(ctx, limiter.Request{Key: "shared", Stack: st, Cost: 1}, time.Now(), once); err != nil {
					fail(fmt.Errorf("release: %w", err))
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	if p := peak.Load(); p > limit || p < 1 {
		t.Fatalf("%d places held at once, want 1 to %d", p, limit)
	}
	if admitted.Load() < callers {
		t.Fatalf("%d admissions for %d callers of %d rounds", admitted.Load(), callers, rounds)
	}
	d, err := replicas[0].Decide(t.Context(), "shared", st, time.Now(), 0, nil)
	if err != nil || d.Remaining != limit {
		t.Fatalf("after every release: %+v, %v; want %d places free", d, err, limit)
	}
}

// TestRejectCacheKeepsNoLeaseRejection: a replica with a reject cache does not remember a
// rejection by a concurrency limit, which a release on another replica cures before its retry
// time (the earliest lease's expiry), and which no message tells the cache of.
func TestRejectCacheKeepsNoLeaseRejection(t *testing.T) {
	t.Parallel()
	addr := shared(t).Addr()
	opts := testOptions(addr)
	opts.RejectCache = 100
	cached := newClient(t, opts)
	policy := fmt.Sprintf("%s#%d", t.Name(), leaseRuns.Add(1))
	a, b := cached.Store(policy), newClient(t, testOptions(addr)).Store(policy)
	now := limitertest.T0
	// The cache serves once the client is subscribed to the resets (invalidate.go).
	for deadline := time.Now().Add(10 * time.Second); !cached.trust.subscribed.Load() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// The cache serves this replica: a token bucket's rejection is answered from it.
	rate := tokenBucket(t, 1, 1, time.Hour)
	for range 3 {
		decide(t, a, "rate", rate, now, 1)
	}
	if cached.cacheHits.Load() == 0 {
		t.Fatal("the reject cache answered no rejection of a token bucket")
	}
	cc, err := limiter.NewConcurrency(1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	held := decide(t, a, "inflight", cc, now, 1)
	if !held.Allowed || held.Lease == 0 {
		t.Fatalf("first acquisition: %+v", held)
	}
	for range 2 {
		if d := decide(t, a, "inflight", cc, now, 1); d.Allowed || d.RetryAfter != time.Hour {
			t.Fatalf("second acquisition: %+v, want rejected until the lease expires", d)
		}
	}
	once := limiter.Once{Op: limiter.OpRelease, Issued: now, Lease: held.Lease}
	if _, err := b.Refund(t.Context(), limiter.Request{Key: "inflight", Stack: limitertest.One(cc), Cost: 1}, now.Add(time.Second), once); err != nil {
		t.Fatalf("release on the other replica: %v", err)
	}
	if d := decide(t, a, "inflight", cc, now.Add(2*time.Second), 1); !d.Allowed {
		t.Fatalf("after the release on the other replica: %+v, want admitted", d)
	}
}

// TestLeasesOnServerClock: on the server's clock a lease expires a lease timeout after the
// server's instant, not after the caller's (the engine's Once.Issued), so a release or an
// extension finds it by its seq alone: through replicas whose clocks are off by seconds, each
// lease releases once, an extension names a new lease that releases once, and every place comes
// back.
func TestLeasesOnServerClock(t *testing.T) {
	t.Parallel()
	addr := shared(t).Addr()
	policy := fmt.Sprintf("%s#%d", t.Name(), leaseRuns.Add(1))
	opts := Options{Addrs: []string{addr}, Timeout: 10 * time.Second}
	a, b := newClient(t, opts).Store(policy), newClient(t, opts).Store(policy)
	cc, err := limiter.NewConcurrency(2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	st := limitertest.One(cc)
	ctx := t.Context()
	behind := time.Now().Add(-3 * time.Second) // replica a's clock; b's is ahead
	release := func(s *Store, op limiter.OnceOp, issued time.Time, lease uint64) (limiter.Decision, error) {
		return s.Refund(ctx, limiter.Request{Key: "k", Stack: st, Cost: 1}, time.Now().Add(3*time.Second),
			limiter.Once{Op: op, Issued: issued, Lease: lease})
	}
	var held []limiter.Decision
	for range 2 {
		d, err := a.Decide(ctx, "k", st, behind, 1, nil)
		if err != nil || !d.Allowed || d.Lease == 0 {
			t.Fatalf("acquisition: %+v, %v", d, err)
		}
		held = append(held, d)
	}
	if d, err := b.Decide(ctx, "k", st, time.Now(), 1, nil); err != nil || d.Allowed {
		t.Fatalf("third acquisition: %+v, %v; want rejected", d, err)
	}
	if _, err := release(b, limiter.OpRelease, behind, held[0].Lease); err != nil {
		t.Fatalf("release through the replica ahead: %v", err)
	}
	if _, err := release(b, limiter.OpRelease, behind, held[0].Lease); !errors.Is(err, limiter.ErrRefunded) {
		t.Fatalf("second release: %v, want ErrRefunded", err)
	}
	ext, err := release(b, limiter.OpExtend, behind, held[1].Lease)
	if err != nil || ext.Lease == 0 || ext.Lease == held[1].Lease {
		t.Fatalf("extension: %+v, %v; want a new lease", ext, err)
	}
	if _, err := release(a, limiter.OpRelease, behind, held[1].Lease); !errors.Is(err, limiter.ErrRefunded) {
		t.Fatalf("release of the extended lease: %v, want ErrRefunded", err)
	}
	if _, err := release(a, limiter.OpRelease, time.Now(), ext.Lease); err != nil {
		t.Fatalf("release of the extension's lease: %v", err)
	}
	if d, err := a.Decide(ctx, "k", st, behind, 0, nil); err != nil || d.Remaining != 2 {
		t.Fatalf("after every release: %+v, %v; want 2 places free", d, err)
	}
}
