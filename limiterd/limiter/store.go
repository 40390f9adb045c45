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
	// Reset forgets the client's state: its next request is decided as its first.
	Reset(ctx context.Context, key string) error
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
