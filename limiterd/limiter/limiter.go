package limiter

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// Decision is the answer to one request. It is returned by value and never allocates.
type Decision struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Limit is the strategy's capacity (token bucket) or limit (sliding window, quota); 0 for
	// Unlimited.
	Limit int64
	// Remaining is how many more units the client could be admitted right now.
	Remaining int64
	// ResetAfter is how long until the client's state is fresh again (bucket full, window empty,
	// quota's period over).
	ResetAfter time.Duration
	// RetryAfter is, for a rejected request, how long until the same cost could be admitted.
	// It is 0 for a cost the strategy can never admit, one above its capacity or limit: no wait
	// admits it (a rejection that a wait cures always has a positive RetryAfter).
	RetryAfter time.Duration
	// Lease names the lease that an admission by a concurrency limit took (or that an extension
	// gave: Store.Refund with OpExtend), to pass in Once.Lease to release or extend it; 0 when
	// no lease was taken. Seqs are never reused within a process.
	Lease uint64
}

// Algorithm names a strategy's algorithm.
type Algorithm uint8

// The algorithms.
const (
	AlgorithmUnlimited Algorithm = iota
	AlgorithmTokenBucket
	AlgorithmSlidingWindow
	AlgorithmQuota
	AlgorithmConcurrency
)

// String returns the algorithm's API name.
func (a Algorithm) String() string {
	switch a {
	case AlgorithmTokenBucket:
		return "TokenBucket"
	case AlgorithmSlidingWindow:
		return "SlidingWindow"
	case AlgorithmQuota:
		return "Quota"
	case AlgorithmConcurrency:
		return "Concurrency"
	case AlgorithmUnlimited:
		return "Unlimited"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// RateLimiter is a rate-limit strategy: the immutable parameters of one algorithm. It decides
// for one client on the State a store keeps for that client. Implementations are safe for
// concurrent use; a State is not, and the store serialises decisions on it.
//
// The set of strategies is closed (TokenBucket, SlidingWindow, Quota, Concurrency, Unlimited): a shared
// store such as Redis runs each algorithm as a server-side script that must mirror the Go code
// exactly, and the conformance table in package limitertest holds both to the same
// expectations.
type RateLimiter interface {
	// Decide admits cost units for the client whose state is s at instant now, or rejects
	// them and leaves s as it was. cost must be at least 1.
	Decide(s *State, now time.Time, cost int64) Decision
	// Peek reports what Decide would answer for one unit, without changing s.
	Peek(s *State, now time.Time) Decision
	// Refund returns amount units to the client's allowance at instant now, clamped so that
	// the allowance never exceeds its limit: a token bucket's theoretical arrival time moves
	// back by amount tokens' refill time, never before now; a sliding window forgets the
	// newest amount admitted units still in the window; a quota's count of its current period
	// goes down by amount, never below 0; a concurrency limit gives nothing back (its places
	// come back when their lease is released or expires). It answers what Peek would after it.
	// amount must be at least 1.
	Refund(s *State, now time.Time, amount int64) Decision
	// Fresh reports whether s has decayed back to the state of a client never seen (bucket full,
	// window empty, no lease held), so that dropping it changes no future decision.
	Fresh(s *State, now time.Time) bool
	// Algorithm returns the strategy's algorithm.
	Algorithm() Algorithm
	// Limit returns the capacity or limit (0 for Unlimited).
	Limit() int64
	// Window returns the interval the limit is expressed over, for the RateLimit-Policy header:
	// the time a token bucket takes to refill completely, a sliding window's window, or the
	// longest a quota's calendar period lasts (Quota.Window).
	Window() time.Duration
	// ID identifies the strategy for the life of the process: strategies built from equal
	// parameters while one of them is in use are one value, with one ID; an ID is never reused.
	// It is 0 for Unlimited.
	ID() uint64

	sealed()
}

// stamp is the part of a stateful strategy that a State records of the strategy that last wrote
// it: a single pointer, which keeps the strategy in use as long as the state is.
type stamp struct {
	rl RateLimiter // the strategy the stamp is part of
	id uint64
}

// ID implements RateLimiter.
func (s *stamp) ID() uint64 { return s.id }

func (*stamp) sealed()    {} // TokenBucket, SlidingWindow, Quota and Concurrency, which embed a stamp
func (unlimited) sealed() {}

// State is one client's state under a strategy. The zero value is a client never seen.
// It is not safe for concurrent use. It references the strategy that last wrote it, which
// therefore stays in use as long as the state does.
type State struct {
	stamp  *stamp     // of the strategy that last wrote the state; nil: fresh
	tat    int64      // Unix ns. token bucket: theoretical arrival time; quota: end of the period
	frac   uint32     // token bucket: fraction of tat, in 1/refillRate ns; quota: units used
	log    *windowLog // sliding window: admitted instants
	leases *leaseSet  // concurrency: the leases' expiries
}

// strategies interns strategies: while a strategy is reachable, building one from equal
// parameters returns it, so that a state written under a policy is recognised as unchanged when
// the policy is compiled again, and a shared store formats a strategy's parameters once. It
// holds strategies weakly: a strategy that no policy, decision or state references any more is
// freed by the garbage collector, and its entry with it, so the table holds the strategies in
// use, however many parameter sets were ever compiled (Strategies reports how many).
var strategies struct {
	sync.Mutex
	byParams map[any]any // tokenBucketParams → weak.Pointer[TokenBucket]; slidingWindowParams → weak.Pointer[SlidingWindow]; quotaParams → weak.Pointer[Quota]; concurrencyParams → weak.Pointer[Concurrency]
	ids      atomic.Uint64
}

// Strategies returns how many strategies are in use: built and not yet freed.
func Strategies() int {
	strategies.Lock()
	defer strategies.Unlock()
	return len(strategies.byParams)
}

// intern returns the strategy in use for params, building one with build, which is given the
// new strategy's ID, if none is.
func intern[T any](params any, build func(id uint64) *T) *T {
	strategies.Lock()
	defer strategies.Unlock()
	if w, ok := strategies.byParams[params].(weak.Pointer[T]); ok {
		if rl := w.Value(); rl != nil {
			return rl
		}
	}
	if strategies.byParams == nil {
		strategies.byParams = make(map[any]any)
	}
	rl := build(strategies.ids.Add(1))
	w := weak.Make(rl)
	strategies.byParams[params] = w
	runtime.AddCleanup(rl, forgetStrategy, internEntry{params, w})
	return rl
}

// internEntry is what the cleanup of a freed strategy needs to remove its entry.
type internEntry struct {
	params any
	weak   any // the weak.Pointer the entry held
}

// forgetStrategy removes the entry of a freed strategy, unless it was replaced meanwhile.
func forgetStrategy(e internEntry) {
	strategies.Lock()
	defer strategies.Unlock()
	if strategies.byParams[e.params] == e.weak {
		delete(strategies.byParams, e.params)
	}
}

// adopt prepares s for a decision by the strategy whose stamp is own: it applies the rule for
// parameter changes (see the package documentation) when s was last written by another one.
func adopt(own *stamp, s *State, now int64) {
	if s.stamp != own && s.stamp != nil {
		convert(own.rl, s, now)
	}
}

// convert converts s, last written by another strategy, for a decision by rl, by the rule for
// parameter changes: a conversion never gives usage back. The same algorithm carries its state
// (carryFrom); another algorithm's used units are charged to rl's state at now (chargeUnits).
func convert(rl RateLimiter, s *State, now int64) {
	switch to := rl.(type) {
	case *TokenBucket:
		if from, ok := s.stamp.rl.(*TokenBucket); ok {
			to.carryFrom(from, s, now)
			return
		}
		to.chargeUnits(s, now, usedUnits(s, now))
	case *SlidingWindow:
		if _, ok := s.stamp.rl.(*SlidingWindow); ok {
			to.carryFrom(s, now)
			return
		}
		to.chargeUnits(s, now, usedUnits(s, now))
	case *Quota:
		if from, ok := s.stamp.rl.(*Quota); ok {
			to.carryFrom(from, s, now)
			return
		}
		to.chargeUnits(s, now, usedUnits(s, now))
	case *Concurrency:
		if _, ok := s.stamp.rl.(*Concurrency); ok {
			to.carryFrom(s)
			return
		}
		to.chargeUnits(s, now, usedUnits(s, now))
	default:
		*s = State{}
	}
}

// usedUnits returns the units the strategy that wrote s counts as used at now, a started token
// counting as used: what another algorithm charges when it converts s.
func usedUnits(s *State, now int64) int64 {
	switch from := s.stamp.rl.(type) {
	case *TokenBucket:
		return from.usedUnits(s, now)
	case *SlidingWindow:
		return from.usedUnits(s, now)
	case *Quota:
		return from.usedUnits(s, now)
	case *Concurrency:
		return from.usedUnits(s, now)
	}
	return 0
}

// Bounds of the strategies' parameters: the ranges in which their exact integer arithmetic
// holds (NewTokenBucket, NewSlidingWindow, NewQuota and NewConcurrency reject parameters
// outside them). They
// are the one source of these bounds: the API (api/v1alpha1, limits.go) takes its own from
// them, so that every valid policy compiles; the CRD's markers repeat them as literals, and the
// API's tests check the generated CRD against them.
const (
	// MaxCapacity bounds a token bucket's capacity and refillRate (both at least 1). A TAT's
	// fraction, in units of 1/refillRate ns, is below the rate: the bound keeps it within the
	// 32 bits State holds it in (1e9 < 2^32), and keeps the fractions the Redis store's script
	// adds exact in Lua's doubles (below 2^53). Products such as capacity*refillPeriod (up to
	// 1e9 * 24h, above 2^64) are taken in 128 bits (bits.Mul64).
	MaxCapacity = 1_000_000_000
	// MaxWindowLimit bounds a sliding window's limit (at least 1). A window's log holds a
	// 16-byte entry per distinct admitted instant inside it, at most limit entries, so the
	// bound caps a client's state and the entries a decision or a peek may walk or copy.
	MaxWindowLimit = 100_000
	// MaxQuotaLimit bounds a quota's limit (at least 1). A quota's count, at most its limit,
	// is kept in State's 32-bit fraction field (1e9 < 2^32).
	MaxQuotaLimit = 1_000_000_000
	// MaxConcurrencyLimit bounds a concurrency limit's places (at least 1). A client's leases
	// hold a 24-byte entry per lease, at most limit live ones after a decision, so the bound
	// caps a client's state (384 KiB: 10,000 entries in a ring of 16,384) and the
	// entries a release or an extension moves to close or open a gap in the order (a few
	// microseconds at worst, under the client's shard lock). Ten thousand requests of one
	// client in flight at once is beyond what the slow backends it protects serve; use a rate
	// for more.
	MaxConcurrencyLimit = 10_000
	// MinPeriod is the shortest refillPeriod, window or leaseTimeout. The arithmetic needs only a positive
	// period (TokenBucket.tokens divides by it; under a window of 0 every admission would
	// expire at once); one millisecond is the resolution of the durations limiterd answers
	// (resetAfterMs, retryAfterMs), and with MaxCapacity still allows 1e12 tokens a second.
	MinPeriod = time.Millisecond
	// MaxPeriod is the longest refillPeriod, window or leaseTimeout. Every duration a sliding window
	// computes is at most its window, 24h < 2^47 ns, which keeps the Redis store's script,
	// working in Lua's doubles, exact (below 2^53); and a window's state is released at most a
	// window after its last admission.
	MaxPeriod = 24 * time.Hour
	// MaxRefillWindow bounds a token bucket's full refill, capacity*refillPeriod/refillRate
	// (rounded down to whole nanoseconds). Every interval a decision computes, n*period/rate
	// with n at most the capacity, is at most a full refill: the bound keeps each such
	// quotient within an int64 of nanoseconds (bits.Div64 panics on one that overflows 64
	// bits), and every TAT, now plus at most a full refill, far from overflowing. 366 days
	// lets a bucket refill once a year, leap years included.
	MaxRefillWindow = 366 * 24 * time.Hour
)

func checkPositive(name string, v, max int64) error {
	if v < 1 || v > max {
		return fmt.Errorf("%s must be between 1 and %d, got %d", name, max, v)
	}
	return nil
}

func checkPeriod(name string, d time.Duration) error {
	if d < MinPeriod || d > MaxPeriod {
		return fmt.Errorf("%s must be between %v and %v, got %v", name, MinPeriod, MaxPeriod, d)
	}
	return nil
}

// unlimited admits everything.
type unlimited struct{}

// Unlimited is the strategy that admits every request and keeps no state.
var Unlimited RateLimiter = unlimited{}

func (unlimited) Decide(*State, time.Time, int64) Decision { return Decision{Allowed: true} }
func (unlimited) Peek(*State, time.Time) Decision          { return Decision{Allowed: true} }
func (unlimited) Refund(*State, time.Time, int64) Decision { return Decision{Allowed: true} }
func (unlimited) Fresh(*State, time.Time) bool             { return true }
func (unlimited) Algorithm() Algorithm                     { return AlgorithmUnlimited }
func (unlimited) Limit() int64                             { return 0 }
func (unlimited) Window() time.Duration                    { return 0 }
func (unlimited) ID() uint64                               { return 0 }
