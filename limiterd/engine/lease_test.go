package engine_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

const leaseTimeout = time.Minute

// leasing returns the policy team/<name> whose default tier "free" is a stack of a token bucket
// "rate" of capacity tokens (refilling 1 an hour) and a concurrency limit "inflight" of places
// leased for leaseTimeout. The policy API's form of a concurrency limit is another change's:
// the stack is built here in Go, on a tier compiled with two limits of those names.
func leasing(t testing.TB, name string, capacity, places int64) *policy.Policy {
	t.Helper()
	p := compile(t, name, func(s *v1alpha1.RateLimitPolicySpec) {
		s.Tiers[0] = testsupport.StackedTier("free",
			testsupport.TokenBucketLimit("rate", capacity, 1, time.Hour), testsupport.TokenBucketLimit("inflight", places, 1, time.Hour))
	})
	tb, err := limiter.NewTokenBucket(capacity, 1, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := limiter.NewConcurrency(places, leaseTimeout)
	if err != nil {
		t.Fatal(err)
	}
	st, err := limiter.NewStack([]string{"rate", "inflight"}, []limiter.RateLimiter{tb, c})
	if err != nil {
		t.Fatal(err)
	}
	p.Tiers[0].Stack = st
	return p
}

// leaseEngine returns an engine on a clock of its own serving leasing(name, 100, places).
func leaseEngine(t testing.TB, places int64) (*engine.Engine, *testsupport.Clock) {
	t.Helper()
	clock := testsupport.NewClock()
	e := engine.New(engine.Options{Clock: clock.Now})
	e.Swap(set(t, leasing(t, "a", 100, places)))
	return e, clock
}

// acquire decides one request of key under team/a and returns its lease's token ("" when
// rejected); a rejection with a lease, or an admission without one, fails the test.
func acquire(t *testing.T, e *engine.Engine, key string) string {
	t.Helper()
	r, err := e.Decide(ctx, "team/a", key, 1)
	switch {
	case err != nil:
		t.Fatal(err)
	case r.Allowed != (r.LeaseToken != ""):
		t.Fatalf("allowed %v with lease %q", r.Allowed, r.LeaseToken)
	}
	return r.LeaseToken
}

// held returns the places key holds under team/a, as a peek sees them.
func held(t *testing.T, e *engine.Engine, key string, places int64) int64 {
	t.Helper()
	r, err := e.Peek(ctx, "team/a", key)
	if err != nil {
		t.Fatal(err)
	}
	return places - r.Limits[1].Remaining
}

// TestLeaseAcquireRelease: a concurrency limit of 2 admits two requests in flight, each with a
// lease of its own, and rejects the third; a release frees exactly one place, once.
func TestLeaseAcquireRelease(t *testing.T) {
	e, clock := leaseEngine(t, 2)
	first, second := acquire(t, e, "alice"), acquire(t, e, "alice")
	if first == "" || second == "" || first == second {
		t.Fatalf("two admissions: leases %q and %q, want two", first, second)
	}
	if tok := acquire(t, e, "alice"); tok != "" {
		t.Fatal("a third request in flight admitted over the limit of 2")
	}
	r, err := e.Decide(ctx, "team/a", "alice", 1)
	if err != nil || r.Allowed || r.LeaseExpiry != (time.Time{}) {
		t.Fatalf("a rejection: %+v %v", r, err)
	}
	r, err = e.Release(ctx, first, false)
	if err != nil || r.Released != 1 || r.Extended != 0 || r.LeaseToken != "" || r.Limits[1].Remaining != 1 {
		t.Fatalf("release: %+v %v; want one place released", r, err)
	}
	if got := held(t, e, "alice", 2); got != 1 {
		t.Fatalf("after a release, %d places held, want 1", got)
	}
	third := acquire(t, e, "alice")
	if third == "" {
		t.Fatal("the released place is not free")
	}
	if acquire(t, e, "alice") != "" {
		t.Fatal("a release freed more than one place")
	}
	// Twice: refused, and frees nothing (the place went to the third lease).
	if _, err := e.Release(ctx, first, false); !errors.Is(err, engine.ErrLeaseReleased) {
		t.Fatalf("second release: %v, want ErrLeaseReleased", err)
	}
	if _, err := e.Release(ctx, first, true); !errors.Is(err, engine.ErrLeaseReleased) {
		t.Fatalf("extension of a released lease: %v, want ErrLeaseReleased", err)
	}
	if got := held(t, e, "alice", 2); got != 2 {
		t.Fatalf("after a release refused, %d places held, want 2", got)
	}
	// Another client's lease is its own: bob's release frees none of alice's places.
	clock.Advance(time.Second)
	bob := acquire(t, e, "bob")
	if _, err := e.Release(ctx, bob, false); err != nil {
		t.Fatal(err)
	}
	if got := held(t, e, "alice", 2); got != 2 {
		t.Fatalf("bob's release freed alice's places: %d held, want 2", got)
	}
}

// rewrite returns token with its decoded bytes changed by edit (never its base64 text: a
// flip of the last character may change only padding bits, which decode to the same bytes).
func rewrite(t *testing.T, token string, edit func(raw []byte)) string {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		t.Fatal(err)
	}
	edit(raw)
	return base64.RawURLEncoding.EncodeToString(raw)
}

// TestLeaseForged: a lease whose bytes were altered — another policy, client or seq written in, a
// longer timeout, one bit anywhere — or signed under another key is refused as forged and frees
// nothing; text that is no lease (a refund's reservation included) is refused as invalid.
func TestLeaseForged(t *testing.T) {
	clock := testsupport.NewClock()
	e := engine.New(engine.Options{Clock: clock.Now})
	e.Swap(set(t, leasing(t, "a", 100, 1), leasing(t, "b", 100, 1)))
	tok := acquire(t, e, "alice")
	if bob := acquire(t, e, "bobby"); bob == "" {
		t.Fatal("bobby holds no place")
	}
	if r, _ := e.Decide(ctx, "team/b", "alice", 1); !r.Allowed || r.LeaseToken == "" {
		t.Fatal("alice holds no place of team/b")
	}
	replace := func(old, new string) func([]byte) {
		return func(raw []byte) {
			i := bytes.Index(raw, []byte(old))
			if i < 0 {
				t.Fatalf("%q is not in the token", old)
			}
			copy(raw[i:], new)
		}
	}
	forged := map[string]string{
		"another policy": rewrite(t, tok, replace("team/a", "team/b")),
		"another client": rewrite(t, tok, replace("alice", "bobby")),
		"another seq":    rewrite(t, tok, func(raw []byte) { raw[32] ^= 1 }),
		"a later expiry": rewrite(t, tok, func(raw []byte) {
			until := binary.BigEndian.Uint64(raw[9:])
			binary.BigEndian.PutUint64(raw[9:], until+uint64(24*time.Hour))
		}),
		"its first bit": rewrite(t, tok, func(raw []byte) { raw[1] ^= 0x80 }),
		"its last bit":  rewrite(t, tok, func(raw []byte) { raw[len(raw)-1] ^= 1 }),
	}
	other := engine.New(engine.Options{Clock: clock.Now, Reservations: reservation.RandomSigner()})
	other.Swap(set(t, leasing(t, "a", 100, 1)))
	otherTok, err := other.Decide(ctx, "team/a", "alice", 1)
	if err != nil || otherTok.LeaseToken == "" {
		t.Fatalf("another key's lease: %+v %v", otherTok, err)
	}
	forged["another key"] = otherTok.LeaseToken
	for name, f := range forged {
		for _, extend := range []bool{false, true} {
			if _, err := e.Release(ctx, f, extend); !errors.Is(err, engine.ErrForgedLease) {
				t.Errorf("%s (extend %v): %v, want ErrForgedLease", name, extend, err)
			}
		}
	}
	for name, s := range map[string]string{"empty": "", "not base64": "%%%", "short": tok[:20]} {
		if _, err := e.Release(ctx, s, false); !errors.Is(err, engine.ErrInvalidLease) {
			t.Errorf("%s: %v, want ErrInvalidLease", name, err)
		}
	}
	for _, k := range []string{"alice", "bobby"} {
		if got := held(t, e, k, 1); got != 1 {
			t.Errorf("after forgeries, %s holds %d places, want 1", k, got)
		}
	}
	if r, _ := e.Decide(ctx, "team/b", "alice", 1); r.Allowed {
		t.Error("a forgery freed alice's place of team/b")
	}
	// The genuine lease still releases.
	if r, err := e.Release(ctx, tok, false); err != nil || r.Released != 1 {
		t.Fatalf("the genuine lease: %+v %v", r, err)
	}
}

// TestLeaseIsNoReservation: a refund's reservation does not release a lease, nor a lease refund.
func TestLeaseIsNoReservation(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	e.Swap(set(t, compile(t, "r", refunds), leasing(t, "a", 100, 1)))
	r, err := e.Decide(ctx, "team/r", "alice", 1)
	if err != nil || r.Reservation == "" || r.LeaseToken != "" {
		t.Fatalf("a refund policy's decision: %+v %v; want a reservation and no lease", r, err)
	}
	if _, err := e.Release(ctx, r.Reservation, false); !errors.Is(err, engine.ErrInvalidLease) {
		t.Errorf("a reservation released: %v, want ErrInvalidLease", err)
	}
	tok := acquire(t, e, "alice")
	if _, err := e.Refund(ctx, tok, 0); !errors.Is(err, engine.ErrInvalidReservation) {
		t.Errorf("a lease refunded: %v, want ErrInvalidReservation", err)
	}
}

// TestLeaseExpires: a lease not released frees its place at its timeout, and is refused after.
func TestLeaseExpires(t *testing.T) {
	e, clock := leaseEngine(t, 1)
	tok := acquire(t, e, "alice")
	clock.Advance(leaseTimeout - 1)
	if acquire(t, e, "alice") != "" {
		t.Fatal("a place freed before its lease's timeout")
	}
	clock.Advance(1)
	for _, extend := range []bool{false, true} {
		if _, err := e.Release(ctx, tok, extend); !errors.Is(err, engine.ErrLeaseExpired) {
			t.Fatalf("an expired lease (extend %v): %v, want ErrLeaseExpired", extend, err)
		}
	}
	if acquire(t, e, "alice") == "" {
		t.Fatal("an expired lease still holds its place")
	}
}

// TestLeaseExtend: an extension keeps the place under a new lease expiring a lease timeout from
// the extension (the tier's timeout: the caller names none), and spends the old lease.
func TestLeaseExtend(t *testing.T) {
	e, clock := leaseEngine(t, 1)
	r, err := e.Decide(ctx, "team/a", "alice", 1)
	if err != nil || r.LeaseToken == "" || !r.LeaseExpiry.Equal(clock.Now().Add(leaseTimeout)) {
		t.Fatalf("admission: %+v %v; want a lease expiring in %v", r, err, leaseTimeout)
	}
	old := r.LeaseToken
	clock.Advance(leaseTimeout / 2)
	r, err = e.Release(ctx, old, true)
	switch {
	case err != nil:
		t.Fatal(err)
	case r.LeaseToken == "" || r.LeaseToken == old || r.Extended != 1 || r.Released != 0:
		t.Fatalf("extension: %+v; want a new lease of one place", r)
	case !r.LeaseExpiry.Equal(clock.Now().Add(leaseTimeout)):
		t.Fatalf("extended lease expires at %v, want %v", r.LeaseExpiry, clock.Now().Add(leaseTimeout))
	}
	extended := r.LeaseToken
	if _, err := e.Release(ctx, old, false); !errors.Is(err, engine.ErrLeaseReleased) {
		t.Fatalf("the extended lease's old token: %v, want ErrLeaseReleased", err)
	}
	// Past the first lease's expiry, the place is still held.
	clock.Advance(leaseTimeout / 2)
	if acquire(t, e, "alice") != "" {
		t.Fatal("the place freed at the old lease's expiry")
	}
	// And freed at the new one's.
	clock.Advance(leaseTimeout / 2)
	if acquire(t, e, "alice") == "" {
		t.Fatal("the extended lease holds its place past its own expiry")
	}
	if _, err := e.Release(ctx, extended, false); !errors.Is(err, engine.ErrLeaseExpired) {
		t.Fatalf("an expired extended lease: %v, want ErrLeaseExpired", err)
	}
}

// TestRateRejectionTakesNoLease: in a stack, a request the rate limit rejects takes no place and
// carries no lease.
func TestRateRejectionTakesNoLease(t *testing.T) {
	clock := testsupport.NewClock()
	e := engine.New(engine.Options{Clock: clock.Now})
	e.Swap(set(t, leasing(t, "a", 1, 5)))
	if acquire(t, e, "alice") == "" {
		t.Fatal("the first request rejected")
	}
	r, err := e.Decide(ctx, "team/a", "alice", 1)
	if err != nil || r.Allowed || r.LeaseToken != "" || r.Binding != 0 {
		t.Fatalf("a request the rate rejects: %+v %v", r, err)
	}
	if got := held(t, e, "alice", 5); got != 1 {
		t.Fatalf("%d places held after the rate's rejection, want 1", got)
	}
}

// TestUnknownLease: a lease of a policy removed, or of a policy's earlier incarnation, names no
// lease the engine holds; a lease whose client changed tier neither.
func TestUnknownLease(t *testing.T) {
	e, _ := leaseEngine(t, 1)
	tok := acquire(t, e, "alice")
	e.Swap(set(t, compile(t, "other", nil)))
	if _, err := e.Release(ctx, tok, false); !errors.Is(err, engine.ErrUnknownPolicy) {
		t.Fatalf("the policy removed: %v, want ErrUnknownPolicy", err)
	}
	e.Swap(set(t, leasing(t, "a", 100, 1)))
	if _, err := e.Release(ctx, tok, false); !errors.Is(err, engine.ErrUnknownLease) {
		t.Fatalf("the policy re-created: %v, want ErrUnknownLease", err)
	}
	tok = acquire(t, e, "alice")
	moved := leasing(t, "a", 100, 1)
	moved.Tiers[0].Stack = moved.Tiers[1].Stack // alice's tier is a token bucket now
	e.Swap(set(t, moved))
	if _, err := e.Release(ctx, tok, false); !errors.Is(err, engine.ErrUnknownLease) {
		t.Fatalf("the tier lost its concurrency limit: %v, want ErrUnknownLease", err)
	}
}

// TestLeaseAfterReset: a reset drops the client's leases; their tokens answer ErrLeaseExpired
// (their places are free) and free nothing of the leases taken after it.
func TestLeaseAfterReset(t *testing.T) {
	e, clock := leaseEngine(t, 1)
	tok := acquire(t, e, "alice")
	clock.Advance(time.Second)
	if err := e.Reset(ctx, "team/a", "alice"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if acquire(t, e, "alice") == "" {
		t.Fatal("the reset left the place held")
	}
	if _, err := e.Release(ctx, tok, false); !errors.Is(err, engine.ErrLeaseExpired) {
		t.Fatalf("a lease of before the reset: %v, want ErrLeaseExpired", err)
	}
	if got := held(t, e, "alice", 1); got != 1 {
		t.Fatalf("a lease of before the reset freed a place: %d held, want 1", got)
	}
}
