package limiter

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// MaxStack is the most limits of a Stack. The stores decide a stack in fixed-size arrays of
// MaxStack entries (Memory.applyStack, the Redis store's stack decision), and each limit is one
// more state per client. The API's bound on a tier's limits (v1alpha1.MaxLimits) is this one.
const MaxStack = 4

// DefaultLimitName is the name under which a store keeps the state of a single-limit tier's
// client: a Stack's limit of this name decides on that same state. The API's name of a tier's
// single limit (v1alpha1.DefaultLimitName) is this one.
const DefaultLimitName = "default"

// Stack is the limits of one stacked tier, decided all or nothing: a request is admitted only if
// every limit admits it, and then consumes its cost from each; when any limit rejects it, no
// limit is charged (a store decides the whole stack in one atomic step per client). A peek
// reads every limit; a refund returns the units to every limit, each clamped to its own limit
// (a concurrency limit gives nothing back: a lease's release or extension touches the
// concurrency limits only, see Once.Op).
//
// A store keeps one state per limit of a client, keyed by the client key and the limit's name,
// so the rule for parameter changes (see the package documentation) applies per limit name:
// when a tier's limits change, a limit whose name was there before decides on the state that
// name holds (kept, carried over or fresh by the usual rule), and a new name starts fresh. The
// state of a limit that left the stack is not read any more and decays like an idle client's
// (swept or expired once fresh); Store.Reset forgets it.
// The limit named DefaultLimitName shares its state with the client's single-limit state.
//
// The answer to a stacked request is combined from the limits' decisions by Combine. A Stack is
// immutable and safe for concurrent use; build one with NewStack.
type Stack struct {
	names  []string
	limits []RateLimiter
	// one is the stack's limit when it is a single-limit tier's (one limit, named
	// DefaultLimitName) whose state is compact (a token bucket or a quota), the common case, which
	// the memory store decides without a stack's working space (Memory.applyOne); nil otherwise.
	// Set once here, it spares each decision a name comparison and an interface call.
	one RateLimiter
	// algs are the limits' algorithms, in order: read once here, they spare the memory store's
	// stacked decision an interface call a limit in each of its passes (Memory.applyStack).
	algs [MaxStack]Algorithm
	// leaseTimeout is the shortest lease timeout of the stack's concurrency limits, 0 for none:
	// a lease of the stack expires when its first place does (Stack.LeaseExpiry).
	leaseTimeout time.Duration
	// leases counts the stack's leases in a memory store, on its limit counting (the concurrency
	// limit of the shortest lease timeout, the first of them); nil without a concurrency limit.
	leases   *LeaseStats
	counting int
}

// NewStack returns the stack of the given limits, in order: 1 to MaxStack token buckets,
// sliding windows, quotas or concurrency limits with distinct, non-empty names without a byte
// 0xFF.
func NewStack(names []string, limits []RateLimiter) (*Stack, error) {
	switch {
	case len(names) != len(limits):
		return nil, fmt.Errorf("%d names for %d limits", len(names), len(limits))
	case len(limits) == 0:
		return nil, errors.New("a stack needs at least one limit")
	case len(limits) > MaxStack:
		return nil, fmt.Errorf("a stack has at most %d limits, got %d", MaxStack, len(limits))
	}
	for i, rl := range limits {
		switch {
		case names[i] == "":
			return nil, fmt.Errorf("limit %d has no name", i)
		case strings.IndexByte(names[i], 0xFF) >= 0:
			// The API's names are DNS labels; a store finds a client's limits by the last 0xFF
			// of their keys (Memory.Reset).
			return nil, fmt.Errorf("limit %q: a name holds no byte 0xFF", names[i])
		case rl == nil:
			return nil, fmt.Errorf("limit %q is nil", names[i])
		}
		switch rl.Algorithm() {
		case AlgorithmTokenBucket, AlgorithmSlidingWindow, AlgorithmQuota, AlgorithmConcurrency:
		case AlgorithmUnlimited:
			return nil, fmt.Errorf("limit %q: a limit of a stack is a token bucket, a sliding window, a quota or a concurrency limit, not %s", names[i], rl.Algorithm())
		}
		for _, n := range names[:i] {
			if n == names[i] {
				return nil, fmt.Errorf("limit %q is named twice", n)
			}
		}
	}
	st := &Stack{names: append([]string(nil), names...), limits: append([]RateLimiter(nil), limits...)}
	if len(limits) == 1 && names[0] == DefaultLimitName && compact(limits[0]) {
		st.one = limits[0]
	}
	for i, rl := range limits {
		st.algs[i] = rl.Algorithm()
		if c, ok := rl.(*Concurrency); ok && (st.leaseTimeout == 0 || c.LeaseTimeout() < st.leaseTimeout) {
			st.leaseTimeout, st.counting = c.LeaseTimeout(), i
		}
	}
	if st.leaseTimeout > 0 {
		st.leases = new(LeaseStats)
	}
	return st, nil
}

// LeaseStats returns the counts of the stack's leases in the memory stores that decide it, nil
// for a stack without a concurrency limit.
func (st *Stack) LeaseStats() *LeaseStats { return st.leases }

// ShareLeaseStats makes the stack count its leases where from does, when both count them on a
// concurrency limit of the same name: the tier that from decided, compiled again (a policy
// edit), keeps its counts and the leases taken before. (When the counting limit changed, the
// leases held under the old one are no longer counted: they would end on the other's counts.)
// Call it before the stack decides anything.
func (st *Stack) ShareLeaseStats(from *Stack) {
	if st.leases != nil && from != nil && from.leases != nil && st.leases != from.leases &&
		st.names[st.counting] == from.names[from.counting] {
		st.leases = from.leases
	}
}

// statsOf returns the LeaseStats that limit i counts leases on: the stack's for its counting
// limit, else nil.
func (st *Stack) statsOf(i int) *LeaseStats {
	if i != st.counting {
		return nil
	}
	return st.leases
}

// HasLeases reports whether the stack holds a concurrency limit: whether its admissions take
// places that a lease holds until it is released or expires.
func (st *Stack) HasLeases() bool { return st.leaseTimeout > 0 }

// LeaseExpiry returns when a lease of the stack issued at issued expires: issued plus the
// shortest lease timeout of its concurrency limits (a lease whose places a limit has let go
// already is released or extended no more; the other limits' places follow at their own
// timeouts). It returns the zero time for a stack without a concurrency limit.
func (st *Stack) LeaseExpiry(issued time.Time) time.Time {
	if st.leaseTimeout == 0 {
		return time.Time{}
	}
	return issued.Add(st.leaseTimeout)
}

// Len returns the number of limits.
func (st *Stack) Len() int { return len(st.limits) }

// Name returns the name of limit i.
func (st *Stack) Name(i int) string { return st.names[i] }

// Limiter returns the strategy of limit i.
func (st *Stack) Limiter(i int) RateLimiter { return st.limits[i] }

// Combine returns the decision a stack answers from its limits' decisions ds (in the stack's
// order, at least one), and the index of the binding limit, whose Limit, Remaining and
// ResetAfter it reports:
//
//   - Allowed: every limit admitted the request (for a peek: would admit one unit).
//   - The binding limit: of a rejection, the rejecting limit that must wait longest (one that no
//     wait cures first: RetryAfter 0), then the one with the least remaining; of an admission,
//     the limit closest to exhaustion, the least remaining, then the longest until it is whole
//     again. Ties go to the first in the stack's order.
//   - RetryAfter, of a rejection: how long until every limit would admit the same cost, the
//     longest wait of the rejecting limits (a limit never admits sooner than its own wait, and
//     once it admits it keeps admitting until something else consumes); 0 when a limit can
//     never admit it (a cost above its limit).
func Combine(ds []Decision) (Decision, int) {
	allowed, lease := true, uint64(0)
	for i := range ds {
		allowed = allowed && ds[i].Allowed
		lease = max(lease, ds[i].Lease) // the concurrency limits of a stack share their lease's seq
	}
	binding := 0
	for i := 1; i < len(ds); i++ {
		if binds(&ds[i], &ds[binding], allowed) {
			binding = i
		}
	}
	d := ds[binding]
	d.Allowed = allowed
	if allowed {
		d.RetryAfter = 0
	}
	d.Lease = lease
	return d, binding
}

// binds reports whether limit decision d binds before b (the binding one so far); allowed is
// the stack's outcome.
func binds(d, b *Decision, allowed bool) bool {
	if !allowed {
		switch {
		case d.Allowed:
			return false
		case b.Allowed:
			return true
		case (d.RetryAfter == 0) != (b.RetryAfter == 0): // never admitted waits longest
			return d.RetryAfter == 0
		case d.RetryAfter != b.RetryAfter:
			return d.RetryAfter > b.RetryAfter
		}
		return d.Remaining < b.Remaining
	}
	if d.Remaining != b.Remaining {
		return d.Remaining < b.Remaining
	}
	return d.ResetAfter > b.ResetAfter
}

// UnchargedDecision is what limit rl answers, on its state s at now, when it admitted a request
// that another limit of its stack rejected: its state as it is (as Peek sees it: no unit
// consumed), still saying that it would admit. Every store answers so; a shared store calls it
// on the state it read.
func UnchargedDecision(rl RateLimiter, s *State, now time.Time) Decision {
	d := peek(rl, s, now)
	d.Allowed, d.RetryAfter = true, 0
	return d
}

// peek is rl.Peek(s, now) through concrete calls, which keep s on the caller's stack.
func peek(rl RateLimiter, s *State, now time.Time) Decision {
	switch rl := rl.(type) {
	case *TokenBucket:
		return rl.Peek(s, now)
	case *SlidingWindow:
		return rl.Peek(s, now)
	case *Quota:
		return rl.Peek(s, now)
	case *Concurrency:
		return rl.Peek(s, now)
	}
	return Decision{Allowed: true} // Unlimited, which a stack never holds
}

// decide is rl.Decide(s, now, cost) through concrete calls, which keep s on the caller's stack.
func decide(rl RateLimiter, s *State, now time.Time, cost int64) Decision {
	switch rl := rl.(type) {
	case *TokenBucket:
		return rl.Decide(s, now, cost)
	case *SlidingWindow:
		return rl.Decide(s, now, cost)
	case *Quota:
		return rl.Decide(s, now, cost)
	case *Concurrency:
		return rl.Decide(s, now, cost)
	}
	return Decision{Allowed: true}
}

// refund is rl.Refund(s, now, amount) through concrete calls, which keep s on the caller's
// stack; a token bucket refunds at most what of the charge once names has not refilled
// (TokenBucket.RefundInterval; once.Cost 0: no charge named).
func refund(rl RateLimiter, s *State, now time.Time, amount int64, once *Once) Decision {
	switch rl := rl.(type) {
	case *TokenBucket:
		if once != nil && once.Cost > 0 {
			ns, frac := rl.RefundInterval(amount, *once, now)
			return rl.RefundBy(s, now, ns, frac)
		}
		return rl.Refund(s, now, amount)
	case *SlidingWindow:
		return rl.Refund(s, now, amount)
	case *Quota:
		return rl.Refund(s, now, amount)
	case *Concurrency:
		return rl.Refund(s, now, amount)
	}
	return Decision{Allowed: true}
}
