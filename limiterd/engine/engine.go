// Package engine answers limiterd's one question — should this request from client X get
// through? — for the policies currently loaded.
//
// A decision resolves the client's tier in the policy, then lets the tier's strategy decide on
// the client's state in the policy's store. The loaded policies are an immutable snapshot behind
// an atomic pointer: Swap replaces it in O(number of policies), never touching client state, and a
// decision that started on the old snapshot finishes on it. Client state outlives swaps: each
// policy ID keeps its store for as long as a policy of that ID is loaded (a policy removed and
// added again starts with no client state), and the strategies convert a client's state lazily
// when its tier's parameters changed (see package limiter). A stacked tier's limits are decided
// all or nothing, each on the client's state of its name (limiter.Stack).
//
// A client key is any string: every entry point resolves the tier on the key as given and keeps
// the client's state under ClientKey(key), the key itself, or for a key over 1,024 bytes (or in
// the digest form) "sha256:" and its SHA-256 in hex, so that a key's length never decides
// whether a request is limited.
package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/heavyhitters"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

// Outcome is how a decision ended, as counted in metrics.
type Outcome uint8

// The outcomes.
const (
	// Allowed: the request was admitted.
	Allowed Outcome = iota
	// Rejected: the request was refused.
	Rejected
	// DryRunRejected: a dry-run tier would have refused the request; it was admitted.
	DryRunRejected
)

// String returns the outcome's metric label value.
func (o Outcome) String() string {
	switch o {
	case Rejected:
		return "rejected"
	case DryRunRejected:
		return "dry_run_rejected"
	case Allowed:
		return "allowed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Errors a request can meet before any decision; none of them consumes anything.
var (
	// ErrNotReady: no policy set was loaded yet.
	ErrNotReady = errors.New("no policy is loaded yet")
	// ErrPolicyRequired: the request names no policy and several are loaded.
	ErrPolicyRequired = errors.New("several policies are loaded: name one")
	// ErrUnknownPolicy: the request names a policy that is not loaded.
	ErrUnknownPolicy = errors.New("unknown policy")
	// ErrInvalidCost: the cost is negative.
	ErrInvalidCost = errors.New("cost must not be negative")
	// ErrInvalidAmount: a refund's cost is negative or above its reservation's.
	ErrInvalidAmount = errors.New("a refund's cost must be between 1 and its reservation's cost")
	// ErrRefundUncertain: the store failed (or timed out) during a refund: the refund may have
	// been made or not. Retrying the same reservation is safe: it refunds at most once.
	ErrRefundUncertain = errors.New("the store failed: the refund may not have been made; retry it, a reservation refunds at most once")
	// ErrRefundsDisabled: the policy does not enable refunds (spec.refunds), or this engine
	// cannot verify reservations (Options.RefundsUnavailable).
	ErrRefundsDisabled = errors.New("refunds are not enabled")
	// ErrInvalidReservation: the text is no reservation.
	ErrInvalidReservation = errors.New("invalid reservation")
	// ErrForgedReservation: the reservation's signature does not match: forged, altered, or
	// issued under another key.
	ErrForgedReservation = errors.New("reservation not issued by this service")
	// ErrReservationExpired: the units the reservation charged no longer count.
	ErrReservationExpired = errors.New("reservation expired")
	// ErrReservationStale: the client's tier is not the one the reservation charged, or its
	// limits are not those that charged.
	ErrReservationStale = errors.New("reservation no longer matches the client's tier")
	// ErrRefunded: the reservation was refunded before; nothing more is.
	ErrRefunded = errors.New("reservation already refunded")
	// ErrTopClientsOff: the engine does not record its heaviest clients (Options.NoTopClients).
	ErrTopClientsOff = errors.New("the heaviest clients are not recorded on this replica")
	// ErrTooManyRefunds: the store keeps as many refund records as it may, of all clients or
	// of this client's share (limiter.ErrTooManyRefunds, limiter.MaxRefundRecords): nothing was
	// refunded; a retry succeeds once records expire.
	ErrTooManyRefunds = errors.New("too many refunds are recorded: nothing was refunded; retry later")
)

// Result is a decision with what it was made by.
type Result struct {
	// Decision is the answer. For a dry-run tier, Allowed is always true and the other fields
	// describe the decision that would have been enforced. For a stacked tier it is the stack's
	// (limiter.Combine): Limit, Remaining and ResetAfter are the binding limit's, RetryAfter the
	// wait until every limit admits the cost.
	limiter.Decision
	// Limits are the decisions of a stacked tier's limits, in the tier's order (nil for a tier
	// of one limit), and Binding the index of the limit the Decision reports (0 for a tier of
	// one limit). A limit that admitted a request another one rejected describes its state as
	// it is, still Allowed.
	Limits  []limiter.Decision
	Binding int
	// Outcome is how the decision ended.
	Outcome Outcome
	// Policy and Tier made the decision.
	Policy *policy.Policy
	Tier   *policy.Tier
	// StoreError is set when the store failed and the policy's failure mode decided instead.
	StoreError error
	// Reservation names what an admitted decision charged, for Refund: set when the policy
	// enables refunds, the cost was above 0, the tier has a limit, the request was admitted
	// (not a dry-run tier's rejection) and the store decided it (no StoreError), unless every
	// unit refills within a nanosecond (nothing could ever be refunded); "" otherwise.
	Reservation string
	// LeaseToken is the token of the lease that an admitted decision took on a tier with a
	// concurrency limit (limiter.Concurrency), to end with Release, and LeaseExpiry when the
	// lease expires unless released or extended first: set when the store decided the
	// decision (no StoreError) and admitted it (a dry-run tier's too, which takes its places);
	// "" and the zero time otherwise. Release with extend answers the extended lease's.
	LeaseToken  string
	LeaseExpiry time.Time
	// Released and Extended are set on Release's answer only: the places the lease gave up
	// (a release) or kept under the extended lease (an extension).
	Released, Extended int64
	// Refunded is set on Refund's answer only (nil otherwise): what the refund gave back to
	// each limit of the tier, in its order (one for a tier of one limit), as the store counted
	// it in the refund's atomic step (limiter.Request.Refunded): how many more units the
	// limit admits right after the refund than right before it.
	Refunded []int64
}

// Observer records decisions, typically as metrics. Tier is called when a policy is swapped in,
// never per decision, so that recording a decision needs no label lookup.
type Observer interface {
	// Policy returns the recorder for one policy as a whole.
	Policy(policyID v1alpha1.PolicyID) PolicyObserver
	// Tier returns the recorder for one tier of one policy.
	Tier(policyID v1alpha1.PolicyID, tier string) TierObserver
	// Leases returns the recorder of the releases of one tier with a concurrency limit, called
	// when a policy is swapped in; and once, with policy and tier "", for the releases whose
	// lease names no tier loaded (malformed, forged, expired, or of a policy no longer loaded).
	Leases(policyID v1alpha1.PolicyID, tier string) LeaseObserver
	// Forget is called when a swap removed a tier of a policy that stays, or a whole policy
	// (tier ""): what was recorded for it can go. Decisions that started before the swap may
	// still record on the PolicyObserver and TierObservers returned for it: what they record
	// must not bring back what was forgotten.
	Forget(policyID v1alpha1.PolicyID, tier string)
}

// PolicyObserver records what happens to one policy as a whole. It must be safe for concurrent
// use.
type PolicyObserver interface {
	// StoreError counts a failure of the policy's store.
	StoreError()
}

// TierObserver records one tier's decisions. It must be safe for concurrent use.
type TierObserver interface {
	Observe(o Outcome, elapsed time.Duration)
}

// LeaseObserver records the releases and extensions of a tier's leases (Release). It must be
// safe for concurrent use.
type LeaseObserver interface {
	Release(o ReleaseOutcome)
}

// ReleaseOutcome is what a call of Release did: released, extended, or why it refused.
type ReleaseOutcome uint8

// The outcomes of Release.
const (
	LeaseReleased        ReleaseOutcome = iota // the lease ended, its places freed
	LeaseExtended                              // the lease was extended: a new one holds its places
	LeaseAlreadyReleased                       // ErrLeaseReleased
	LeaseExpired                               // ErrLeaseExpired: its timeout passed, or its client was reset
	LeaseUnknown                               // ErrUnknownLease, ErrUnknownPolicy
	LeaseForged                                // ErrForgedLease
	LeaseInvalid                               // ErrInvalidLease
	LeaseUncertain                             // ErrReleaseUncertain: the store failed
	leaseOutcomes                              // how many there are
)

// ReleaseOutcomes lists every ReleaseOutcome, in order.
func ReleaseOutcomes() []ReleaseOutcome {
	out := make([]ReleaseOutcome, leaseOutcomes)
	for i := range out {
		out[i] = ReleaseOutcome(i)
	}
	return out
}

// String returns the outcome's word, a metric's label value: released, extended,
// already_released, expired, unknown, forged, invalid or uncertain.
func (o ReleaseOutcome) String() string {
	switch o {
	case LeaseReleased:
		return "released"
	case LeaseExtended:
		return "extended"
	case LeaseAlreadyReleased:
		return "already_released"
	case LeaseExpired:
		return "expired"
	case LeaseUnknown:
		return "unknown"
	case LeaseForged:
		return "forged"
	case LeaseInvalid:
		return "invalid"
	case LeaseUncertain, leaseOutcomes:
	}
	return "uncertain"
}

// Options configure an Engine. The zero value decides from process memory with no bound on
// tracked clients, the system clock and no observer.
type Options struct {
	// NewStore returns the store of one policy's clients. Default: a limiter.Memory on Budget.
	NewStore func(policyID v1alpha1.PolicyID) limiter.Store
	// Budget bounds the clients tracked in memory: by the default stores, and by the local
	// stores that policies with failure mode Local fall back on.
	Budget *limiter.Budget
	// Clock returns the current time. Default: time.Now.
	Clock func() time.Time
	// Observer records decisions. Default: none.
	Observer Observer
	// Reservations signs and verifies the reservations of refunds. Default: a key of this
	// process's own, right when client state is this process's too (the memory store); a store
	// shared by replicas needs a key every replica shares.
	Reservations *reservation.Signer
	// RefundsUnavailable, when set, says why this engine issues no reservation and refuses
	// every refund (ErrRefundsDisabled): for example a shared store without a shared key.
	RefundsUnavailable string
	// TopClients sizes each policy's record of its heaviest clients (TopClients; zero fields:
	// heavyhitters' defaults, the last five minutes).
	TopClients heavyhitters.Config
	// NoTopClients turns that record off: TopClients answers ErrTopClientsOff.
	NoTopClients bool
}

// Engine decides for the loaded policies. It is safe for concurrent use.
type Engine struct {
	opts Options
	// unresolved records the releases whose lease names no tier loaded.
	unresolved LeaseObserver
	signer     *reservation.Signer
	epochs     atomic.Uint64 // the last epoch given to a process-local store (bound.epoch)
	current    atomic.Pointer[snapshot]
	swapMu     sync.Mutex // serialises Swap
}

// snapshot is the loaded policies bound to their stores and observers.
type snapshot struct {
	set  *policy.Set
	byID map[v1alpha1.PolicyID]*bound
	only *bound // the policy when exactly one is loaded
}

// bound is one loaded policy with what decides for it.
type bound struct {
	policy *policy.Policy
	store  limiter.Store
	local  *limiter.Memory // failure mode Local: state while the store fails
	obs    PolicyObserver
	tiers  []TierObserver  // by Tier.Index
	leases []LeaseObserver // by Tier.Index; nil for a tier without a concurrency limit
	// epoch tells this incarnation of a process-local store (limiter.LocalStore) from those
	// before and after it, whose refund records it does not have; 0 for a shared store, whose
	// state and records outlive the policy's removal and re-creation.
	epoch uint64
	// tierTags stand for the tiers in reservations and leases, by Tier.Index: see tierTag (the
	// zero Tag for a tier that no token names: without refunds, and no concurrency limit).
	tierTags []reservation.Tag
	// top records the policy's heaviest clients (nil: Options.NoTopClients). It outlives
	// swaps as the store does.
	top *heavyhitters.Tracker
}

// NopObserver is an Observer, PolicyObserver and TierObserver that records nothing.
type NopObserver struct{}

// Policy implements Observer.
func (NopObserver) Policy(v1alpha1.PolicyID) PolicyObserver { return NopObserver{} }

// Tier implements Observer.
func (NopObserver) Tier(v1alpha1.PolicyID, string) TierObserver { return NopObserver{} }

// StoreError implements PolicyObserver.
func (NopObserver) StoreError() {}

// Leases implements Observer.
func (NopObserver) Leases(v1alpha1.PolicyID, string) LeaseObserver { return NopObserver{} }

// Release implements LeaseObserver.
func (NopObserver) Release(ReleaseOutcome) {}

// Forget implements Observer.
func (NopObserver) Forget(v1alpha1.PolicyID, string) {}

// Observe implements TierObserver.
func (NopObserver) Observe(Outcome, time.Duration) {}

// New returns an engine with no policy loaded: it answers ErrNotReady until the first Swap.
func New(opts Options) *Engine {
	if opts.Budget == nil {
		opts.Budget = limiter.NewBudget(0, 0)
	}
	if opts.NewStore == nil {
		budget := opts.Budget
		opts.NewStore = func(v1alpha1.PolicyID) limiter.Store { return limiter.NewMemory(budget) }
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Observer == nil {
		opts.Observer = NopObserver{}
	}
	signer := opts.Reservations
	if signer == nil {
		signer = reservation.RandomSigner()
	}
	e := &Engine{opts: opts, signer: signer, unresolved: opts.Observer.Leases("", "")}
	e.epochs.Store(rand.Uint64() >> 1) // distinct from another process's under a shared key
	return e
}

// Swap makes set the loaded policies, atomically. Stores of policies that stay keep their
// clients' state; those of policies that left are dropped, and their in-memory clients leave the
// budget. It costs O(policies and tiers), independent of the number of clients tracked by the
// policies that stay.
func (e *Engine) Swap(set *policy.Set) {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	old := e.current.Load()
	next := &snapshot{set: set, byID: make(map[v1alpha1.PolicyID]*bound, set.Len())}
	var unused []limiter.Store // stores of the old snapshot no policy decides on any more
	for _, p := range set.All() {
		b := &bound{policy: p, obs: e.opts.Observer.Policy(p.ID)}
		if prev, ok := old.lookup(p.ID); ok {
			b.store, b.local, b.epoch, b.top = prev.store, prev.local, prev.epoch, prev.top
		} else {
			b.store = e.opts.NewStore(p.ID)
			if !e.opts.NoTopClients {
				b.top = heavyhitters.New(e.opts.TopClients)
			}
			if _, local := b.store.(limiter.LocalStore); local {
				b.epoch = e.epochs.Add(1)
			}
		}
		switch {
		case p.FailureMode == v1alpha1.FailureModeLocal && b.local == nil:
			b.local = limiter.NewMemory(e.opts.Budget)
		case p.FailureMode != v1alpha1.FailureModeLocal && b.local != nil:
			unused, b.local = append(unused, b.local), nil
		}
		for _, t := range p.Tiers {
			b.tiers = append(b.tiers, e.opts.Observer.Tier(p.ID, t.Name))
			var leases LeaseObserver
			if t.Stack != nil && t.Stack.HasLeases() {
				leases = e.opts.Observer.Leases(p.ID, t.Name)
				if prev, ok := old.lookup(p.ID); ok {
					// The tier compiled again keeps counting the leases it took before.
					if i := slices.IndexFunc(prev.policy.Tiers, func(pt *policy.Tier) bool { return pt.Name == t.Name }); i >= 0 && prev.policy.Tiers[i].Stack != nil {
						t.Stack.ShareLeaseStats(prev.policy.Tiers[i].Stack)
					}
				}
			}
			b.leases = append(b.leases, leases)
			if p.Refunds || (t.Stack != nil && t.Stack.HasLeases()) {
				b.tierTags = append(b.tierTags, e.tierTag(p.ID, t, b.epoch))
			} else {
				b.tierTags = append(b.tierTags, reservation.Tag{}) // no token names the tier
			}
		}
		next.byID[p.ID] = b
	}
	if len(next.byID) == 1 {
		for _, b := range next.byID {
			next.only = b
		}
	}
	e.current.Store(next)
	if old != nil {
		for id, b := range old.byID {
			nb, stays := next.byID[id]
			if !stays {
				unused = append(unused, b.store)
				if b.local != nil {
					unused = append(unused, b.local)
				}
				e.opts.Observer.Forget(id, "")
				continue
			}
			for _, t := range b.policy.Tiers {
				if !slices.ContainsFunc(nb.policy.Tiers, func(n *policy.Tier) bool { return n.Name == t.Name }) {
					e.opts.Observer.Forget(id, t.Name)
				}
			}
		}
	}
	// Decisions that started on the old snapshot may still be running: a closed local store
	// answers them but keeps nothing, so the budget's count stays exact.
	for _, st := range unused {
		if ls, ok := st.(limiter.LocalStore); ok {
			ls.Close()
		}
	}
}

func (s *snapshot) lookup(id v1alpha1.PolicyID) (*bound, bool) {
	if s == nil {
		return nil, false
	}
	b, ok := s.byID[id]
	return b, ok
}

// Ready reports whether a policy set has been loaded.
func (e *Engine) Ready() bool { return e.current.Load() != nil }

// Policies returns the loaded policies (nil before the first Swap).
func (e *Engine) Policies() *policy.Set {
	if s := e.current.Load(); s != nil {
		return s.set
	}
	return nil
}

// find returns the policy a request names; "" names the only loaded policy.
func (e *Engine) find(policyID v1alpha1.PolicyID) (*bound, error) {
	return e.current.Load().find(policyID)
}

// find returns the policy a request names in the snapshot; "" names the only loaded policy.
func (s *snapshot) find(policyID v1alpha1.PolicyID) (*bound, error) {
	if s == nil {
		return nil, ErrNotReady
	}
	if policyID == "" {
		if s.only == nil {
			if len(s.byID) == 0 {
				return nil, fmt.Errorf("%w: none is loaded", ErrUnknownPolicy)
			}
			return nil, ErrPolicyRequired
		}
		return s.only, nil
	}
	b, ok := s.byID[policyID]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownPolicy, policyID)
	}
	return b, nil
}

// Decide decides whether the client key may spend cost units under the named policy ("" when
// exactly one is loaded). It returns an error, and consumes nothing, when the request cannot be
// decided (see the Err variables). A store failure is not an error: the policy's failure mode
// decides and Result.StoreError says so.
//
// A cost of 0 is a peek: the answer is what a one-unit request would get (Allowed says whether
// one unit would be admitted now, RetryAfter when it would be), and nothing is consumed. A peek
// goes through the same failure modes and dry run as a decision, and is not recorded by the
// Observer: it is no request the policy admitted or rejected.
//
// On a stacked tier the request is admitted only if every limit admits it, and then charged to
// each; a rejected one charges none (limiter.Store.Decide). Result.Limits holds each limit's
// decision. When the store fails, Closed rejects and Open admits by every limit, and Local
// decides the stack on its fallback.
//
// Decide is DecideInto with the Result returned: a caller on a hot path, which can keep the
// Result where it uses it, calls DecideInto and spares the Result's copy.
func (e *Engine) Decide(ctx context.Context, policyID v1alpha1.PolicyID, key string, cost int64) (Result, error) {
	var r Result
	err := e.DecideInto(ctx, policyID, key, cost, &r)
	return r, err
}

// DecideInto decides as Decide does and writes the Result to *r, built there in place: a
// Result is some 160 bytes, and returning it by value copied it on every decision. It
// overwrites all of *r, which may hold an earlier decision; on an error *r is the zero Result.
func (e *Engine) DecideInto(ctx context.Context, policyID v1alpha1.PolicyID, key string, cost int64, r *Result) error {
	if cost < 0 {
		*r = Result{}
		return ErrInvalidCost
	}
	b, err := e.find(policyID)
	if err != nil {
		*r = Result{}
		return err
	}
	e.decide(ctx, b, key, cost, r)
	return nil
}

// decide decides a request of b's policy, as Decide does, into *r (all of it overwritten).
func (e *Engine) decide(ctx context.Context, b *bound, key string, cost int64, r *Result) {
	start := e.opts.Clock()
	tier := b.policy.Resolve(key)
	key = ClientKey(key)
	*r = Result{Policy: b.policy, Tier: tier, Limits: limitDecisions(tier)}
	r.Decision, r.StoreError = decideOn(ctx, b.store, key, tier, start, cost, r.Limits)
	if r.StoreError != nil {
		r.Decision = e.degraded(ctx, b, key, tier, start, cost, r.Limits)
	}
	r.bind()
	r.Outcome = outcome(r)
	e.reserve(b, r, key, start, cost)
	e.lease(b, r, key, start, cost)
	if cost > 0 {
		b.record(r.Outcome, key, start)
		b.tiers[tier.Index].Observe(r.Outcome, e.opts.Clock().Sub(start))
	}
}

// record counts a decision (no peek) of the client stored as key in the policy's heaviest
// clients: Allowed as admitted; Rejected, and a dry-run tier's rejection, as rejected, since
// "who is being limited" is what a policy in dry run is rolled out to learn.
func (b *bound) record(o Outcome, key string, now time.Time) {
	if b.top == nil {
		return
	}
	d := heavyhitters.Admitted
	if o != Allowed {
		d = heavyhitters.Rejected
	}
	b.top.Record(d, key, now)
}

// TopClients returns at most n of the clients with the most decisions in direction d (admitted
// or rejected) under the named policy over the recent period (Options.TopClients: the last
// five minutes by default), as counted by this engine alone; keys are the stored ones
// (ClientKey). Peeks are not counted; batch items are, each as one decision. It fails with
// ErrTopClientsOff when the engine does not record them, and as Decide does for the policy.
func (e *Engine) TopClients(policyID v1alpha1.PolicyID, d heavyhitters.Direction, n int) (heavyhitters.Top, *policy.Policy, error) {
	b, err := e.find(policyID)
	if err != nil {
		return heavyhitters.Top{}, nil, err
	}
	if b.top == nil {
		return heavyhitters.Top{}, nil, ErrTopClientsOff
	}
	return b.top.TopN(d, e.opts.Clock(), n), b.policy, nil
}

// BatchItem is one request of a batch: what Decide takes.
type BatchItem struct {
	Policy v1alpha1.PolicyID
	Key    string
	Cost   int64
}

// BatchResult is the answer to one item of a batch: its Result, or Err (one of the Err
// variables, ErrNotReady excepted) when the item cannot be decided and consumed nothing.
type BatchResult struct {
	Result
	Err error
}

// DecideBatch decides items, on one snapshot of the loaded policies and at one instant, and
// writes the answer to items[i] to out[i]; len(out) must be len(items). Each answer is what
// Decide would answer for the item, called for every item in turn: items on one client key are
// decided in order, each on the state the previous one left, and a bad item fails alone; an
// item of cost 0 is a peek, as for Decide. The items of each policy go to its store in one call
// (limiter.Store.DecideBatch: one pass over process memory, one round trip per Redis node), so
// that a batch costs less than its items one by one. Each decision is observed as Decide observes it, with the batch's
// time divided by its items as its duration. It returns ErrNotReady, and decides nothing,
// before the first Swap.
func (e *Engine) DecideBatch(ctx context.Context, items []BatchItem, out []BatchResult) error {
	s := e.current.Load()
	if s == nil {
		return ErrNotReady
	}
	if len(items) == 0 {
		return nil
	}
	start := e.opts.Clock()
	keys := storedKeys(items) // nil: every item's key is stored as itself
	key := func(i int) string {
		if keys != nil {
			return keys[i]
		}
		return items[i].Key
	}
	// Group the items by policy, keeping their order within each group: different policies
	// share no state, so only the order within a policy matters.
	type group struct {
		b     *bound
		items []int
	}
	var groups []group
	last := -1
	stacked := 0 // the limits of the stacked items
	for i, it := range items {
		out[i] = BatchResult{}
		b, err := s.find(it.Policy)
		if err == nil && it.Cost < 0 {
			err = ErrInvalidCost
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Policy, out[i].Tier = b.policy, b.policy.Resolve(it.Key)
		if out[i].Tier.Stacked {
			stacked += out[i].Tier.NumLimits()
		}
		if last < 0 || groups[last].b != b {
			last = slices.IndexFunc(groups, func(g group) bool { return g.b == b })
			if last < 0 {
				g := group{b: b}
				if len(groups) == 0 { // the common batch names one policy
					g.items = make([]int, 0, len(items)-i)
				}
				groups = append(groups, g)
				last = len(groups) - 1
			}
		}
		groups[last].items = append(groups[last].items, i)
	}
	// The limits' decisions of the stacked items share one array.
	if stacked > 0 {
		limits := make([]limiter.Decision, stacked)
		for i := range out {
			if t := out[i].Tier; t != nil && t.Stacked {
				n := t.NumLimits()
				out[i].Limits, limits = limits[:n:n], limits[n:]
			}
		}
	}
	var (
		reqs    []limiter.Request
		answers []limiter.Answer
	)
	for _, g := range groups {
		reqs, answers = slices.Grow(reqs[:0], len(g.items)), answers[:0]
		for _, i := range g.items {
			if out[i].Tier.Stack == nil {
				out[i].Decision = unlimited
				continue
			}
			reqs = append(reqs, limiter.Request{Key: key(i), Stack: out[i].Tier.Stack, Cost: items[i].Cost, Limits: out[i].Limits})
		}
		answers = slices.Grow(answers, len(reqs))[:len(reqs)]
		g.b.store.DecideBatch(ctx, reqs, start, answers)
		j := 0
		for _, i := range g.items {
			if out[i].Tier.Stack != nil {
				out[i].Decision, out[i].StoreError = answers[j].Decision, answers[j].Err
				j++
			}
		}
	}
	decided := 0 // peeks are not observed
	for _, g := range groups {
		for _, i := range g.items {
			r := &out[i]
			if r.StoreError != nil {
				r.Decision = e.degraded(ctx, g.b, key(i), r.Tier, start, items[i].Cost, r.Limits)
			}
			r.bind()
			r.Outcome = outcome(&r.Result)
			e.reserve(g.b, &r.Result, key(i), start, items[i].Cost)
			e.lease(g.b, &r.Result, key(i), start, items[i].Cost)
			if items[i].Cost > 0 {
				g.b.record(r.Outcome, key(i), start)
				decided++
			}
		}
	}
	each := e.opts.Clock().Sub(start) / time.Duration(max(decided, 1))
	for _, g := range groups {
		for _, i := range g.items {
			if items[i].Cost > 0 {
				g.b.tiers[out[i].Tier.Index].Observe(out[i].Outcome, each)
			}
		}
	}
	return nil
}

// bind sets the index of a stacked decision's binding limit.
func (r *Result) bind() {
	if r.Limits != nil {
		_, r.Binding = limiter.Combine(r.Limits)
	}
}

// outcome sets how a decision ended, admitting a dry-run tier's rejection.
func outcome(r *Result) Outcome {
	switch {
	case r.Allowed:
		return Allowed
	case r.Tier.DryRun:
		r.Allowed = true
		return DryRunRejected
	default:
		return Rejected
	}
}

// unlimited is the decision of an Unlimited tier, which has no limits and no state.
var unlimited = limiter.Decision{Allowed: true}

// limitDecisions returns the array that receives the decisions of a stacked tier's limits (nil
// for any other tier: its one limit's decision is the answer).
func limitDecisions(tier *policy.Tier) []limiter.Decision {
	if !tier.Stacked {
		return nil
	}
	return make([]limiter.Decision, tier.NumLimits())
}

// decideOn asks st for tier's decision on cost units for key (cost 0: a peek); limits, unless
// nil, receives the decision of each limit.
func decideOn(ctx context.Context, st limiter.Store, key string, tier *policy.Tier, now time.Time, cost int64, limits []limiter.Decision) (limiter.Decision, error) {
	if tier.Stack == nil {
		return unlimited, nil
	}
	return st.Decide(ctx, key, tier.Stack, now, cost, limits)
}

// degraded decides by the policy's failure mode after its store failed (cost 0: peeks). For a
// stacked tier, limits receives each limit's decision: Closed rejects by every limit, Open
// admits by every limit, Local decides the stack on the fallback.
func (e *Engine) degraded(ctx context.Context, b *bound, key string, tier *policy.Tier, now time.Time, cost int64, limits []limiter.Decision) limiter.Decision {
	b.obs.StoreError()
	mode := b.policy.FailureMode
	if mode == v1alpha1.FailureModeLocal && b.local != nil {
		d, _ := decideOn(ctx, b.local, key, tier, now, cost, limits) // Memory never fails
		return d
	}
	answer := func(limit int64) limiter.Decision {
		if mode == v1alpha1.FailureModeClosed {
			return limiter.Decision{Limit: limit, RetryAfter: time.Second, ResetAfter: time.Second}
		}
		return limiter.Decision{Allowed: true, Limit: limit, Remaining: limit} // Open admits
	}
	switch {
	case tier.Stack == nil:
		return unlimited
	case limits == nil:
		return answer(tier.Limit(0).Limit())
	}
	for i := range limits {
		limits[i] = answer(tier.Limit(i).Limit())
	}
	d, _ := limiter.Combine(limits)
	return d
}

// Peek reports what a one-unit decision for the client would answer, without consuming anything.
// Unlike Decide with cost 0, a store failure is an error: the admin API reads the client's
// state, not what the failure mode would answer.
func (e *Engine) Peek(ctx context.Context, policyID v1alpha1.PolicyID, key string) (Result, error) {
	b, err := e.find(policyID)
	if err != nil {
		return Result{}, err
	}
	tier := b.policy.Resolve(key)
	key = ClientKey(key)
	r := Result{Policy: b.policy, Tier: tier}
	r.Limits = limitDecisions(tier)
	r.Decision, err = decideOn(ctx, b.store, key, tier, e.opts.Clock(), 0, r.Limits)
	if err != nil {
		return Result{}, fmt.Errorf("read client state: %w", err)
	}
	r.bind()
	return r, nil
}

// Refund returns to the client's allowance the units of the admitted decision that issued
// reservation (Result.Reservation), or amount of them (0: all; at most the reservation's cost),
// and answers what a peek sees after it. Each limit gets back at most what of the charge it has
// not refilled since, measured in time, not whole tokens (limiter.Once.Cost,
// limiter.TokenBucket.RefundInterval): never more than if the charge had been smaller, so a
// refund never lets the client exceed a limit; and right after the charge, on a bucket that was
// full before it, the whole charge (a one-unit charge refunded at once gives its unit back). The
// units come back by the strategy's refund (see limiter.RateLimiter.Refund: clamped so that the
// allowance never exceeds its limit; on a stacked tier every limit gets them back, each clamped
// to its own limit and bound). A reservation whose charge some limit has refilled entirely refunds
// nothing (ErrReservationExpired: refundable). A reservation
// refunds once: the store keeps a record of it (limiter.Store.Refund) until it expires,
// when the units it charged no longer count anyway (Reservation explains when), and
// limiter.RefundRecordGrace more, for replicas' clock skew and a refund's own delay (a refund
// delayed longer than that since it read the clock is refused as ErrReservationExpired).
//
// A reset of the client (Reset) voids the reservations issued before it: the units they charged
// were erased with the client's state, so a refund of one of them would give back units the
// client already has again; it fails with ErrReservationExpired (the store keeps the reset's
// instant for as long as such a reservation could be valid: limiter.Store.Reset). A client never
// reset refunds as if resets did not exist.
//
// Refund fails, refunding nothing, with ErrInvalidReservation (malformed, or signed under
// another key: forged or altered), ErrReservationExpired (also: voided by a reset), ErrRefundsDisabled (the policy does
// not enable refunds, or the engine has no shared key: Options.RefundsUnavailable),
// ErrUnknownPolicy, ErrReservationStale (the client's tier, or its limits, are not those that
// charged), ErrInvalidAmount (over the reservation's cost), ErrRefunded (refunded before: a
// retry of a refund that succeeded) and ErrTooManyRefunds (the store's refund records are
// full, or the client holds its share of them). A store failure is ErrRefundUncertain whatever the failure mode: the store may have
// made the refund (a timeout) or not; retrying is safe, since a reservation
// refunds at most once. A refund is not recorded by the Observer, and decides nothing on a
// failure mode's fallback.
func (e *Engine) Refund(ctx context.Context, token string, amount int64) (Result, error) {
	if amount < 0 {
		return Result{}, ErrInvalidAmount
	}
	if e.opts.RefundsUnavailable != "" {
		return Result{}, fmt.Errorf("%w: %s", ErrRefundsDisabled, e.opts.RefundsUnavailable)
	}
	now := e.opts.Clock()
	rsv, err := e.signer.Parse(token, now)
	switch {
	case errors.Is(err, reservation.ErrExpired):
		return Result{}, fmt.Errorf("%w: %w", ErrReservationExpired, err)
	case errors.Is(err, reservation.ErrForged):
		return Result{}, fmt.Errorf("%w: %w", ErrForgedReservation, err)
	case err != nil:
		return Result{}, fmt.Errorf("%w: %w", ErrInvalidReservation, err)
	case amount > rsv.Cost:
		return Result{}, fmt.Errorf("%w: the reservation charged %d", ErrInvalidAmount, rsv.Cost)
	case amount == 0:
		amount = rsv.Cost
	}
	b, err := e.find(v1alpha1.PolicyID(rsv.Policy))
	if err != nil {
		return Result{}, err
	}
	if !b.policy.Refunds {
		return Result{}, fmt.Errorf("%w: policy %s", ErrRefundsDisabled, b.policy.ID)
	}
	tier := b.chargedTier(rsv.Key, rsv.Tier)
	if tier == nil {
		// Say nothing of the tier: its name may be hidden (spec.tierNames).
		return Result{}, fmt.Errorf("%w: the client is no longer in the tier that charged, the tier's limits changed, or the policy was re-created since", ErrReservationStale)
	}
	if !refundable(tier, rsv.Cost, rsv.At, now) {
		return Result{}, fmt.Errorf("%w: the units it charged have refilled", ErrReservationExpired)
	}
	r := Result{Policy: b.policy, Tier: tier}
	r.Limits = limitDecisions(tier)
	r.Refunded = make([]int64, tier.Stack.Len())
	req := limiter.Request{Key: rsv.Key, Stack: tier.Stack, Cost: amount, Limits: r.Limits, Refunded: r.Refunded}
	// Once.Cost bounds each limit's refund to what of the charge has not refilled since it.
	r.Decision, err = b.store.Refund(ctx, req, now, limiter.Once{ID: rsv.ID, Until: rsv.Until, Issued: rsv.At, Cost: rsv.Cost})
	switch {
	case errors.Is(err, limiter.ErrRefunded):
		return Result{}, ErrRefunded
	case errors.Is(err, limiter.ErrReset):
		// The reset erased the charge: its units count no more, as for an expired reservation.
		return Result{}, fmt.Errorf("%w: the client was reset since the charge", ErrReservationExpired)
	case errors.Is(err, limiter.ErrTooManyRefunds):
		return Result{}, ErrTooManyRefunds
	case errors.Is(err, limiter.ErrRefundTooLate):
		return Result{}, fmt.Errorf("%w: %w", ErrReservationExpired, err)
	case err != nil:
		b.obs.StoreError()
		return Result{}, fmt.Errorf("%w: %w", ErrRefundUncertain, err)
	}
	r.bind()
	r.Outcome = outcome(&r)
	return r, nil
}

// chargedTier returns the tier a reservation for the stored key charged, if the key is still in
// it: the tier the key resolves to, when its tag is the one named. A key stored as its digest
// (ClientKey) cannot be resolved again, since its overrides matched the key as sent: its
// reservation, which only this service can sign, is refunded to the tier whose tag it names
// while the policy has one. nil: the client is no longer in that tier, or the tag is of another
// incarnation of the policy's process-local store (bound.epoch).
func (b *bound) chargedTier(storedKey string, tag reservation.Tag) *policy.Tier {
	if tag == (reservation.Tag{}) {
		return nil // stands for no tier (bound.tierTags)
	}
	if !digested(storedKey) {
		if t := b.policy.Resolve(storedKey); b.tierTags[t.Index] == tag {
			return t
		}
		return nil
	}
	for _, t := range b.policy.Tiers {
		if b.tierTags[t.Index] == tag {
			return t
		}
	}
	return nil
}

// tierTag returns the tag that stands for a tier in reservations: the tier's name may be hidden
// from callers (spec.tierNames). Its policy's epoch (bound.epoch) ties a reservation to the
// store whose refund records can refund it once: a policy removed and re-created on the memory
// store starts with no records, so reservations of the store before it must not refund. The
// tier's limits (names, algorithms, parameters) tie it to the limits that charged: a refund is
// bounded by what refilled since the charge at the tier's rates, so under a rate lowered since
// it would count too few and refund units that the client got back and may have spent.
func (e *Engine) tierTag(policyID v1alpha1.PolicyID, t *policy.Tier, epoch uint64) reservation.Tag {
	var b strings.Builder
	fmt.Fprintf(&b, "tier\x00%s\x00%s\x00%d", policyID, t.Name, epoch)
	for i := range t.NumLimits() {
		name := "" // a tier of one limit, as the tags of earlier versions name it
		if t.Stacked {
			name = t.Stack.Name(i)
		}
		l := t.Limit(i)
		fmt.Fprintf(&b, "\x00%s\x00%s", name, l.Algorithm())
		switch l := l.(type) {
		case *limiter.TokenBucket:
			capacity, rate, period := l.Params()
			fmt.Fprintf(&b, "\x00%d\x00%d\x00%d", capacity, rate, period)
		case *limiter.Concurrency:
			// A lease's entry is found by its expiry, its issue plus the lease timeout: under
			// another timeout it would not be found. The limit may change: a lease is its own.
			fmt.Fprintf(&b, "\x00%d", l.LeaseTimeout())
		}
	}
	return e.signer.Tag(b.String())
}

// reserve gives an admitted decision of cost units its reservation, when the policy enables
// refunds and the decision charged the store (no failure mode decided it) of a limited tier.
// The reservation is valid while some of its units may be refunded (refundable): until the
// first of the tier's limits has certainly refilled them all. It costs nothing otherwise.
func (e *Engine) reserve(b *bound, r *Result, key string, now time.Time, cost int64) {
	if !r.Policy.Refunds || cost < 1 || r.Outcome != Allowed || r.StoreError != nil || !r.Tier.Limited() || e.opts.RefundsUnavailable != "" {
		return
	}
	window := refundWindow(r.Tier, cost)
	if window <= 0 {
		return // the units refill within a nanosecond: nothing could be refunded
	}
	c := reservation.Claim{Policy: string(r.Policy.ID), Key: key, Tier: b.tierTags[r.Tier.Index], Cost: cost, At: now,
		Until: now.Add(window)}
	r.Reservation, _ = e.signer.Issue(&c) // cannot fail: names are bounded, cost >= 1, the window > 0
}

// refundable reports whether some of the cost units that tier t charged at instant at may
// return at now without letting the client exceed any limit: whether every limit of t, a token
// bucket, has refilled less than the charge since (validation refuses refunds with sliding
// windows and quotas: a refund could not remove the charge's own log entry, nor tell the
// charge's period; for them, and an Unlimited tier, nothing is refundable).
//
// How much returns is each limit's own bound, applied by the store under the client's lock
// (limiter.Once.Cost; limiter.TokenBucket.RefundInterval says why it is safe): the refill time
// of the amount, at most that of the charge less the time elapsed since it, exactly, never
// before now. It is not rounded to whole tokens: a bound of cost - ceil(elapsed*rate/period)
// tokens lost the token being refilled, so a one-token charge could never be refunded.
func refundable(t *policy.Tier, cost int64, at, now time.Time) bool {
	if !t.Limited() {
		return false // an Unlimited tier charged nothing
	}
	once := limiter.Once{Issued: at, Cost: cost}
	for i := range t.NumLimits() {
		tb, ok := t.Limit(i).(*limiter.TokenBucket)
		if !ok {
			return false
		}
		if ns, frac := tb.RefundInterval(cost, once, now); ns == 0 && frac == 0 {
			return false
		}
	}
	return true
}

// refundWindow is how long after the charge a reservation of cost units of tier t is valid: the
// shortest over t's limits of cost*period/rate, rounded down to a nanosecond, after which
// refundable is false. It is 0 for a tier with a limit that is no token bucket (see refundable).
func refundWindow(t *policy.Tier, cost int64) time.Duration {
	window := time.Duration(-1)
	for i := range t.NumLimits() {
		tb, ok := t.Limit(i).(*limiter.TokenBucket)
		if !ok {
			return 0
		}
		ns, _ := tb.Interval(cost) // cost <= capacity: Decide admitted it
		if window < 0 || time.Duration(ns) < window {
			window = time.Duration(ns)
		}
	}
	return max(window, 0)
}

// Reset forgets the client's state under the named policy: its state under every limit name,
// the loaded policy's and those an earlier version of it named (limiter.Store.Reset), so that a
// limit that a policy edit removed and a later edit re-adds starts fresh for the client too.
// It voids the client's reservations issued before it, at or before the engine's clock's now
// (Refund answers ErrReservationExpired): the units they charged were erased with the state.
func (e *Engine) Reset(ctx context.Context, policyID v1alpha1.PolicyID, key string) error {
	b, err := e.find(policyID)
	if err != nil {
		return err
	}
	key = ClientKey(key)
	now := e.opts.Clock()
	if err := b.store.Reset(ctx, key, now); err != nil {
		return fmt.Errorf("reset client state: %w", err)
	}
	if b.local != nil {
		_ = b.local.Reset(ctx, key, now)
	}
	return nil
}

// Sweep drops idle (fresh) client state from every in-memory store (limiter.LocalStore) the
// engine decides on. Call it periodically from one goroutine.
func (e *Engine) Sweep() {
	s := e.current.Load()
	if s == nil {
		return
	}
	now := e.opts.Clock()
	for _, b := range s.byID {
		if ls, ok := b.store.(limiter.LocalStore); ok {
			ls.Sweep(now)
		}
		if b.local != nil {
			b.local.Sweep(now)
		}
	}
}

// EachLeaseTier calls yield with each loaded tier that holds a concurrency limit and is decided
// in process memory (limiter.LocalStore), and the counts of its leases there
// (limiter.LeaseStats). A shared store's leases are counted by the store, not here.
func (e *Engine) EachLeaseTier(yield func(policyID v1alpha1.PolicyID, tier string, stats *limiter.LeaseStats)) {
	s := e.current.Load()
	if s == nil {
		return
	}
	for id, b := range s.byID {
		if _, ok := b.store.(limiter.LocalStore); !ok {
			continue
		}
		for _, t := range b.policy.Tiers {
			if t.Stack != nil && t.Stack.LeaseStats() != nil {
				yield(id, t.Name, t.Stack.LeaseStats())
			}
		}
	}
}

// Now returns the current time on the engine's clock, the one decisions are made at.
func (e *Engine) Now() time.Time { return e.opts.Clock() }

// Budget returns the budget of tracked in-memory clients.
func (e *Engine) Budget() *limiter.Budget { return e.opts.Budget }
