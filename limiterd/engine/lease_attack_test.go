package engine_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// TestLeaseOfDigestedKey: a client whose key is stored as its digest (longer than
// MaxClientKeyBytes, or starting with engine.DigestPrefix) holds leases as any other: its lease
// is found through chargedTier's digested path, releases its own places once, and frees none
// of another digested client's, not even of one whose key differs in its last byte only, or
// of the client whose stored key the "sha256:" form spells.
func TestLeaseOfDigestedKey(t *testing.T) {
	e, _ := leaseEngine(t, 1)
	long := strings.Repeat("k", v1alpha1.MaxClientKeyBytes)
	alice, bob := long+"a", long+"b"
	spelled := engine.ClientKey(alice) // a caller's key that spells alice's stored key
	toks := map[string]string{}
	for _, k := range []string{alice, bob, spelled} {
		if toks[k] = acquire(t, e, k); toks[k] == "" {
			t.Fatalf("%.8s...: the first request rejected", k[len(k)-8:])
		}
		if acquire(t, e, k) != "" {
			t.Fatalf("%.8s...: a second request in flight admitted over the limit of 1", k[len(k)-8:])
		}
	}
	if _, err := e.Release(ctx, toks[alice], false); err != nil {
		t.Fatalf("alice's release: %v", err)
	}
	for _, k := range []string{bob, spelled} {
		if got := held(t, e, k, 1); got != 1 {
			t.Fatalf("alice's release freed a place of %.8s...: %d held, want 1", k[len(k)-8:], got)
		}
	}
	if _, err := e.Release(ctx, toks[alice], false); !errors.Is(err, engine.ErrLeaseReleased) {
		t.Fatalf("alice's second release: %v, want ErrLeaseReleased", err)
	}
	if acquire(t, e, alice) == "" {
		t.Fatal("alice's released place is not free")
	}
	if acquire(t, e, alice) != "" {
		t.Fatal("alice's release freed more than her one place")
	}
}

// TestLeaseRaces: callers admitted under a concurrency limit release and extend their leases
// while others race them with the same tokens (twice released, released and extended at once)
// and new requests are decided beside them. Whatever the interleaving, each token is spent
// once, and the requests in flight — counted from admission to release by the callers
// themselves — never exceed the limit. On the test clock every lease is issued at one instant,
// so their entries share one expiry and only their seq tells them apart: a release that
// matched an entry by its expiry alone would free another lease's place and over-admit.
func TestLeaseRaces(t *testing.T) {
	const places, workers, rounds = 3, 8, 300
	e, _ := leaseEngine(t, places)
	var (
		inFlight, most, spent atomic.Int64
		wg                    sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				r, err := e.Decide(ctx, "team/a", "alice", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if !r.Allowed {
					continue
				}
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				tok := r.LeaseToken
				if (w+i)%3 == 0 { // the holder extends, then ends the extended lease
					x, err := e.Release(ctx, tok, true)
					if err != nil {
						t.Errorf("extension: %v", err)
						return
					}
					tok = x.LeaseToken
				}
				// Two releases of one token race, one of them an extension half the time: one
				// wins. A place is freed only by the release, so the count drops before it.
				inFlight.Add(-1)
				var (
					race sync.WaitGroup
					won  atomic.Int64
				)
				for j := range 2 {
					race.Go(func() {
						extend := j == 1 && i%2 == 0
						x, err := e.Release(ctx, tok, extend)
						switch {
						case err == nil:
							won.Add(1)
							if extend { // the extension won: its holder ends it
								if _, err := e.Release(ctx, x.LeaseToken, false); err != nil {
									t.Errorf("release of the extended lease: %v", err)
								}
							}
						case !errors.Is(err, engine.ErrLeaseReleased):
							t.Errorf("the losing release: %v, want ErrLeaseReleased", err)
						}
					})
				}
				race.Wait()
				if won.Load() != 1 {
					t.Errorf("%d of two racing releases of one token were made, want 1", won.Load())
				}
				spent.Add(1)
			}
		})
	}
	wg.Wait()
	if got := most.Load(); got > places {
		t.Fatalf("%d requests in flight at once, over the limit of %d", got, places)
	}
	if spent.Load() == 0 {
		t.Fatal("no request was admitted")
	}
	if got := held(t, e, "alice", places); got != 0 {
		t.Fatalf("every lease released, %d places still held", got)
	}
}
