package limiter

import (
	"context"
	"errors"
	"time"
)

// ErrInvalidCost is a store's answer to a negative cost, or to a refund of less than one unit:
// nothing is decided or refunded. The engine and the servers refuse such costs before; a store
// refuses them too, since no strategy's arithmetic takes them (a token bucket's interval of a
// negative cost overflows, and a sliding window or a quota would take it as usage given back).
var ErrInvalidCost = errors.New("invalid cost: a decision's must be at least 0, a refund's at least 1")

// Store keeps the state of one policy's clients and decides a client's requests by a Stack of
// limits on that state, atomically: concurrent calls on one key behave as some serial order of
// them. A tier of one limit is a stack of one (named DefaultLimitName in the API's single-limit
// form); a store sees nothing else. Memory keeps state in process memory; the redis package keeps
// it in Redis, shared by replicas.
type Store interface {
	// Decide decides cost units for the client key by every limit of st at instant now (a store
	// may use its own clock instead, as Redis does, and says so), all or nothing, in one atomic
	// step: the request is admitted only if every limit admits it, and then consumes its cost
	// from each; when any limit rejects it, no limit's state changes. A cost of 0 is a peek:
	// what a one-unit request would get, consuming nothing and creating no state. A negative
	// cost is refused with ErrInvalidCost.
	//
	// It returns the stack's decision, Combine of the limits' decisions, and writes limit i's
	// decision to out[i] unless out is nil (else len(out) must be at least st.Len()): a limit
	// that admitted a request that another limit rejected answers its state as it is, still
	// Allowed (UnchargedDecision).
	Decide(ctx context.Context, key string, st *Stack, now time.Time, cost int64, out []Decision) (Decision, error)
	// Refund returns req.Cost units (at least 1, else ErrInvalidCost) to every limit of req.Stack for the client
	// req.Key, each as RateLimiter.Refund does (clamped to its own limit; with once.Cost > 0, a
	// token bucket gets back at most what of that charge it has not refilled since once.Issued,
	// at now: TokenBucket.RefundInterval), and answers as
	// Decide would for a peek after it (writing to req.Limits unless nil, and what each limit
	// gave back to req.Refunded unless nil), unless a refund of
	// once.ID was made before: then it returns ErrRefunded and refunds nothing. The check, the
	// record of once.ID and the refund are one atomic step; the record is kept at least until
	// once.Until and RefundRecordGrace more. A refund of a charge made (once.Issued) at or
	// before the client's latest Reset fails with ErrReset and records nothing: the reset erased
	// the charge, so its units are nobody's to give back (checked after the record: a retry of
	// a refund made before the reset answers ErrRefunded). It may also fail with
	// ErrTooManyRefunds or ErrRefundTooLate (Memory) or a store error; an error other than a
	// store's timeout means nothing was refunded (after a timeout the refund may have been made:
	// a retry of the same once.ID is safe).
	//
	// With once.Op OpRelease or OpExtend it ends or extends, instead, the lease that the
	// admission of req.Cost places at once.Issued took, named once.Lease (its Decision.Lease;
	// Concurrency), once per lease (ErrRefunded: the lease is held no more, its entry being its
	// record) and not after a reset (ErrReset), on the stack's concurrency limits only: a
	// release gives no rate unit back. It fails first with ErrNoLease (a stack without a
	// concurrency limit, no once.Issued or no once.Lease) or ErrLeaseExpired (the lease's expiry,
	// Stack.LeaseExpiry, is not after now).
	Refund(ctx context.Context, req Request, now time.Time, once Once) (Decision, error)
	// DecideBatch decides reqs at instant now (with the same proviso as Decide) and writes the
	// answer to reqs[i] to out[i]; len(out) must be len(reqs). The answers are those of
	// successive Decide calls in the order of reqs: requests on one key are decided in order,
	// each on the state the previous one left. A batch costs less than its requests one by one
	// (one pass over process memory, one round trip per Redis node). A request of a negative
	// cost is answered ErrInvalidCost, alone.
	DecideBatch(ctx context.Context, reqs []Request, now time.Time, out []Answer)
	// Reset forgets the client's state under every limit name it has state for: the names of
	// the loaded policy's tiers, DefaultLimitName, and names that a policy edit removed (so that
	// a limit re-added later starts fresh too). Its next request is decided as its first by
	// any stack. It forgets no other client's state, whatever bytes the keys hold. In the same
	// atomic step it marks the client reset at now (the clock reservations are issued on), for
	// as long as a charge it erased could be refunded, so that Refund voids the charges made at
	// or before now (ErrReset); the mark survives the state it erased, and a client never reset
	// has none.
	Reset(ctx context.Context, key string, now time.Time) error
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

// Request is one decision of a batch, or a refund: Cost units for the client Key by every limit
// of Stack, as Store.Decide decides them (a Cost of 0 is a peek). Limits, unless nil, receives
// the limits' decisions (len(Limits) must be at least Stack.Len()).
type Request struct {
	Key    string
	Stack  *Stack
	Cost   int64
	Limits []Decision
	// Refunded, unless nil, receives from Store.Refund what the refund gave back to each limit
	// (len(Refunded) must be at least Stack.Len()): how many more units the limit admits right
	// after the refund than right before it, in the same atomic step. A token bucket's fraction
	// of a token counts once it completes a whole one; a limit clamped at its limit counts what
	// fitted; a limit that kept nothing to refund counts 0.
	Refunded []int64
}

// Answer is a store's answer to one Request of a batch: the Decision, or the error Decide would
// have returned for it.
type Answer struct {
	Decision
	Err error
}
