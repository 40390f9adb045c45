package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

// Errors of Release; none of them releases or extends anything.
var (
	// ErrInvalidLease: the text is no lease (a refund's reservation is none either).
	ErrInvalidLease = errors.New("invalid lease")
	// ErrForgedLease: the lease's signature does not match: forged, altered (another policy,
	// client, tier, instant or seq written in), or issued under another key.
	ErrForgedLease = errors.New("lease not issued by this service")
	// ErrLeaseExpired: the lease's timeout passed, or the client was reset since: its places
	// are free again.
	ErrLeaseExpired = errors.New("lease expired")
	// ErrLeaseReleased: the lease was released or extended before (an extension's holder has
	// the new lease); nothing more is.
	ErrLeaseReleased = errors.New("lease already released or extended")
	// ErrUnknownLease: the lease, well signed, names no lease the loaded policies hold: its
	// client is no longer in the tier that took it, the tier's lease timeout changed, or the
	// policy was removed and re-created, or this replica restarted, since (their leases went
	// with the state).
	ErrUnknownLease = errors.New("lease unknown to the policies served")
	// ErrReleaseUncertain: the store failed (or timed out) during a release or an extension:
	// it may have been made or not. A release may be retried (it answers ErrLeaseReleased if
	// the first was made); an extension made whose answer was lost leaves the new lease with
	// no holder, to expire at its timeout.
	ErrReleaseUncertain = errors.New("the store failed: the release or extension may not have been made")
)

// lease gives an admitted decision of cost places the token of the lease it took, when the store
// decided it (no failure mode) on a tier with a concurrency limit. It costs nothing otherwise.
// A failure mode's Local fallback takes places on its own store, which no token names: they
// are held until the lease timeout.
func (e *Engine) lease(b *bound, r *Result, key string, now time.Time, cost int64) {
	if r.Decision.Lease == 0 || cost < 1 || r.Outcome != Allowed || r.StoreError != nil {
		return
	}
	r.LeaseExpiry = r.Tier.Stack.LeaseExpiry(now)
	c := reservation.Claim{Policy: string(r.Policy.ID), Key: key, Tier: b.tierTags[r.Tier.Index], Cost: cost, At: now,
		Until: r.LeaseExpiry}
	// Cannot fail: names are bounded, cost >= 1, the timeout > 0, the seq is not 0.
	r.LeaseToken, _ = e.signer.IssueLease(&c, r.Decision.Lease)
}

// Release ends the lease that token names (Result.LeaseToken), freeing the places it holds on
// its tier's concurrency limits at once; with extend it extends it instead: the places stay
// held, until a lease timeout from now, under a new lease whose token the answer carries
// (Result.LeaseToken, Result.LeaseExpiry), and the old token is spent. The policy's tier sets
// the timeout; the caller cannot choose it. Neither touches a rate limit of the tier. The
// answer is what a peek sees after it, with the places released (Result.Released) or kept
// (Result.Extended).
//
// A lease releases or extends once, only while it has not expired, and only the policy,
// client and tier it names: the token is signed (package reservation) and the lease's entry in
// its client's state is its record (limiter.Concurrency). Release fails, changing nothing,
// with ErrInvalidLease (malformed), ErrForgedLease (signed under another key, or altered),
// ErrLeaseExpired (the lease timed out, or its client was reset since), ErrUnknownPolicy (the
// policy is no longer loaded), ErrUnknownLease (the client's tier, or its lease timeout, is no
// longer the one that took it, or the policy's store is another incarnation), ErrLeaseReleased
// (released or extended before), or ErrReleaseUncertain (the store failed).
//
// The Observer records each call's outcome (ReleaseOutcome) on the tier the lease names, or
// with no policy and tier when it names none loaded.
func (e *Engine) Release(ctx context.Context, token string, extend bool) (Result, error) {
	obs := e.unresolved
	r, err := e.release(ctx, token, extend, &obs)
	obs.Release(releaseOutcome(err, extend))
	return r, err
}

// releaseOutcome returns the outcome of a Release that answered err.
func releaseOutcome(err error, extend bool) ReleaseOutcome {
	switch {
	case err == nil && extend:
		return LeaseExtended
	case err == nil:
		return LeaseReleased
	case errors.Is(err, ErrLeaseReleased):
		return LeaseAlreadyReleased
	case errors.Is(err, ErrLeaseExpired):
		return LeaseExpired
	case errors.Is(err, ErrUnknownLease), errors.Is(err, ErrUnknownPolicy):
		return LeaseUnknown
	case errors.Is(err, ErrForgedLease):
		return LeaseForged
	case errors.Is(err, ErrInvalidLease):
		return LeaseInvalid
	}
	return LeaseUncertain
}

// release is Release; it sets *obs to the observer of the tier the lease names, once found.
func (e *Engine) release(ctx context.Context, token string, extend bool, obs *LeaseObserver) (Result, error) {
	now := e.opts.Clock()
	l, err := e.signer.ParseLease(token, now)
	switch {
	case errors.Is(err, reservation.ErrExpired):
		if b, ferr := e.find(v1alpha1.PolicyID(l.Policy)); ferr == nil {
			if tier := b.chargedTier(l.Key, l.Tier); tier != nil && b.leases[tier.Index] != nil {
				*obs = b.leases[tier.Index] // a late release: counted on its tier
			}
		}
		return Result{}, fmt.Errorf("%w: %w", ErrLeaseExpired, err)
	case errors.Is(err, reservation.ErrForged):
		return Result{}, fmt.Errorf("%w: %w", ErrForgedLease, err)
	case err != nil:
		return Result{}, fmt.Errorf("%w: %w", ErrInvalidLease, err)
	}
	b, err := e.find(v1alpha1.PolicyID(l.Policy))
	if err != nil {
		return Result{}, err
	}
	tier := b.chargedTier(l.Key, l.Tier)
	if tier == nil || tier.Stack == nil || !tier.Stack.HasLeases() {
		// Say nothing of the tier: its name may be hidden (spec.tierNames).
		return Result{}, fmt.Errorf("%w: the client is no longer in the tier that took it, the tier's lease timeout changed, or the policy was re-created since", ErrUnknownLease)
	}
	if o := b.leases[tier.Index]; o != nil {
		*obs = o
	}
	op := limiter.OpRelease
	if extend {
		op = limiter.OpExtend
	}
	r := Result{Policy: b.policy, Tier: tier}
	r.Limits = limitDecisions(tier)
	var places [limiter.MaxStack]int64
	req := limiter.Request{Key: l.Key, Stack: tier.Stack, Cost: l.Cost, Limits: r.Limits, Refunded: places[:]}
	r.Decision, err = b.store.Refund(ctx, req, now, limiter.Once{Op: op, Issued: l.At, Lease: l.Seq})
	switch {
	case errors.Is(err, limiter.ErrRefunded):
		return Result{}, ErrLeaseReleased
	case errors.Is(err, limiter.ErrLeaseExpired):
		return Result{}, fmt.Errorf("%w at %s", ErrLeaseExpired, l.Until.UTC().Format(time.RFC3339Nano))
	case errors.Is(err, limiter.ErrReset):
		return Result{}, fmt.Errorf("%w: the client was reset since the lease was taken", ErrLeaseExpired)
	case errors.Is(err, limiter.ErrNoLease):
		return Result{}, fmt.Errorf("%w: %w", ErrUnknownLease, err) // unreachable: checked above
	case err != nil:
		b.obs.StoreError()
		return Result{}, fmt.Errorf("%w: %w", ErrReleaseUncertain, err)
	}
	r.bind()
	r.Outcome = outcome(&r)
	moved := int64(0)
	for _, p := range places[:tier.Stack.Len()] {
		moved = max(moved, p)
	}
	if !extend {
		r.Released = moved
		r.Decision.Lease = 0
		return r, nil
	}
	r.Extended = moved
	if r.Decision.Lease == 0 { // a store that extended must name the new lease
		return Result{}, fmt.Errorf("%w: the store named no extended lease", ErrReleaseUncertain)
	}
	r.LeaseExpiry = tier.Stack.LeaseExpiry(now)
	c := reservation.Claim{Policy: l.Policy, Key: l.Key, Tier: l.Tier, Cost: l.Cost, At: now, Until: r.LeaseExpiry}
	if r.LeaseToken, err = e.signer.IssueLease(&c, r.Decision.Lease); err != nil {
		return Result{}, fmt.Errorf("issue the extended lease: %w", err) // unreachable: as lease
	}
	return r, nil
}
