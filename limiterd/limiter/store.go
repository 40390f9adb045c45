package limiter

import (
	"context"
	"time"
)

// Store keeps the state of one policy's clients and applies a strategy to one client's state
// atomically: concurrent decisions on one key behave as some serial order of them.
// Memory keeps state in process memory; the redis package keeps it in Redis, shared by replicas.
type Store interface {
	// Decide decides cost units for the client key by rl at instant now (a store may use its
	// own clock instead, as Redis does, and says so).
	Decide(ctx context.Context, key string, rl RateLimiter, now time.Time, cost int64) (Decision, error)
	// Peek reports what a one-unit decision would answer, without consuming anything.
	Peek(ctx context.Context, key string, rl RateLimiter, now time.Time) (Decision, error)
	// Refund returns amount units (at least 1) to the client's allowance by rl at instant now,
	// as RateLimiter.Refund does, atomically with the client's decisions, and answers what Peek
	// would after it. A refund is not idempotent: repeating one refunds again (up to the
	// limit).
	Refund(ctx context.Context, key string, rl RateLimiter, now time.Time, amount int64) (Decision, error)
	// DecideStack decides cost units for the client key by every limit of st at instant now
	// (with the same proviso as Decide), all or nothing, in one atomic step: the request is
	// admitted only if every limit admits it, and then consumes its cost from each; when any
	// limit rejects it, no limit's state changes. A cost of 0 is a peek of every limit. It
	// writes limit i's decision to out[i] (len(out) must be at least st.Len()): a limit that
	// admitted a request that another limit rejected answers its state as it is, still Allowed
	// (UnchargedDecision). It returns the stack's decision, Combine(out).
	DecideStack(ctx context.Context, key string, st *Stack, now time.Time, cost int64, out []Decision) (Decision, error)
	// RefundStack returns amount units (at least 1) to every limit of st, each as Refund does
	// (clamped to its own limit), in one atomic step with the client's decisions, and answers
	// as DecideStack would for a peek after it.
	RefundStack(ctx context.Context, key string, st *Stack, now time.Time, amount int64, out []Decision) (Decision, error)
	// RefundOnce refunds req.Cost units to the client req.Key, by req.Limiter as Refund does,
	// or by every limit of req.Stack as RefundStack does (writing to req.Limits), unless a
	// refund of once.ID was made before: then it returns ErrRefunded and refunds nothing. The
	// check, the record of once.ID and the refund are one atomic step; the record is kept at
	// least until once.Until and RefundRecordGrace more. It may also fail with
	// ErrTooManyRefunds or ErrRefundTooLate (Memory) or a store error; an error other than a
	// store's timeout means nothing was refunded (after a timeout the refund may have been
	// made: a retry of the same once.ID is safe).
	RefundOnce(ctx context.Context, req Request, now time.Time, once Once) (Decision, error)
	// Reset forgets the client's state: that of single-limit tiers, and that of the named
	// limits of stacked tiers. Its next request is decided as its first.
	Reset(ctx context.Context, key string, limits ...string) error
}

var _ Store = (*Memory)(nil)

// A LocalStore keeps client state in process memory, counted against a Budget. Its owner sweeps
// it periodically, so that idle clients cost nothing, and closes it when its policy is removed,
// so that its clients leave the budget.
type LocalStore interface {
	Store
	// Sweep drops the client states that have decayed back to fresh at now.
	Sweep(now time.Time)
	// Close forgets every client; the store keeps answering, but keeps no state.
	Close()
}

var _ LocalStore = (*Memory)(nil)

// Request is one decision of a batch: Cost units for the client Key by Limiter, or by every
// limit of Stack (as DecideStack, all or nothing) when Stack is set; a Cost of 0 is a peek (what
// Peek answers; nothing is consumed).
type Request struct {
	Key     string
	Limiter RateLimiter
	Cost    int64
	// Stack, when set, is decided instead of Limiter, and Limits receives its limits'
	// decisions (len(Limits) must be at least Stack.Len()); the Answer is Combine(Limits).
	Stack  *Stack
	Limits []Decision
}

// Answer is a store's answer to one Request of a batch: the Decision, or the error Decide would
// have returned for it.
type Answer struct {
	Decision
	Err error
}

// A BatchStore decides several requests in one call, with less overhead than one call each
// (one pass over process memory, one round trip per Redis node).
type BatchStore interface {
	Store
	// DecideBatch decides reqs at instant now (with the same proviso as Decide) and writes the
	// answer to reqs[i] to out[i]; len(out) must be len(reqs). The answers are those of
	// successive Decide (or Peek) calls in the order of reqs: requests on one key are decided
	// in order, each on the state the previous one left (for a stack, the states of its
	// limits).
	DecideBatch(ctx context.Context, reqs []Request, now time.Time, out []Answer)
}

var _ BatchStore = (*Memory)(nil)
