package limiter

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// Decision is the answer to one request. It is returned by value and never allocates.
type Decision struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Limit is the strategy's capacity (token bucket) or limit (sliding window); 0 for Unlimited.
	Limit int64
	// Remaining is how many more units the client could be admitted right now.
	Remaining int64
	// ResetAfter is how long until the client's state is fresh again (bucket full, window empty).
	ResetAfter time.Duration
	// RetryAfter is, for a rejected request, how long until the same cost could be admitted.
	// It is 0 for a cost the strategy can never admit, one above its capacity or limit: no wait
	// admits it (a rejection that a wait cures always has a positive RetryAfter).
	RetryAfter time.Duration
}

// Algorithm names a strategy's algorithm.
type Algorithm uint8

// The algorithms.
const (
	AlgorithmUnlimited Algorithm = iota
	AlgorithmTokenBucket
	AlgorithmSlidingWindow
)

// String returns the algorithm's API name.
func (a Algorithm) String() string {
	switch a {
	case AlgorithmTokenBucket:
		return "TokenBucket"
	case AlgorithmSlidingWindow:
		return "SlidingWindow"
	case AlgorithmUnlimited:
		return "Unlimited"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// RateLimiter is a rate-limit strategy: the immutable parameters of one algorithm. It decides
// for one client on the State a store keeps for that client. Implementations are safe for
// concurrent use; a State is not, and the store serialises decisions on it.
//
// The set of strategies is closed (TokenBucket, SlidingWindow, Unlimited): a shared store such
// as Redis runs each algorithm as a server-side script that must mirror the Go code exactly,
// and the conformance table in package limitertest holds both to the same expectations.
type RateLimiter interface {
	// Decide admits cost units for the client whose state is s at instant now, or rejects
	// them and leaves s as it was. cost must be at least 1.
	Decide(s *State, now time.Time, cost int64) Decision
	// Peek reports what Decide would answer for one unit, without changing s.
	Peek(s *State, now time.Time) Decision
	// Refund returns amount units to the client's allowance at instant now, clamped so that
	// the allowance never exceeds its limit: a token bucket's theoretical arrival time moves
	// back by amount tokens' refill time, never before now; a sliding window forgets the
	// newest amount admitted units still in the window. It answers what Peek would after it.
	// amount must be at least 1.
	Refund(s *State, now time.Time, amount int64) Decision
	// Fresh reports whether s has decayed back to the state of a client never seen (bucket full,
	// window empty), so that dropping it changes no future decision.
	Fresh(s *State, now time.Time) bool
	// Algorithm returns the strategy's algorithm.
	Algorithm() Algorithm
	// Limit returns the capacity or limit (0 for Unlimited).
	Limit() int64
	// Window returns the interval the limit is expressed over, for the RateLimit-Policy header:
	// the time a token bucket takes to refill completely, or a sliding window's window.
	Window() time.Duration
	// Stamp identifies the algorithm and parameters: equal stamps, equal strategies.
	Stamp() uint32

	sealed()
}

func (*TokenBucket) sealed()   {}
func (*SlidingWindow) sealed() {}
func (unlimited) sealed()      {}

// State is one client's state under a strategy. The zero value is a client never seen.
// It is not safe for concurrent use.
type State struct {
	stamp uint32     // Stamp of the strategy that last wrote the state; 0: fresh
	frac  uint32     // token bucket: fraction of tat, in units of 1/refillRate ns
	tat   int64      // token bucket: theoretical arrival time, Unix ns
	log   *windowLog // sliding window: admitted instants
}

// stamps interns strategy parameters: equal parameters share one stamp, so a state written by
// a strategy can find the strategy (and its parameters) that wrote it. It holds one entry per
// distinct parameter set ever compiled (Strategies reports how many): a state may carry any stamp
// ever issued, and its usage must carry over when its tier's parameters change, so an entry is
// never dropped or reused. Strategies are looked up by stamp without the lock, in chunks that
// never move, so that adding one costs O(1) whatever the number of policies.
var stamps struct {
	sync.Mutex
	byParams map[any]uint32
	n        atomic.Uint32                              // stamps issued
	chunks   atomic.Pointer[[]*[stampChunk]RateLimiter] // stamp-1 is at chunks[(stamp-1)/stampChunk]
}

const stampChunk = 256

// Strategies returns how many distinct strategies (parameter sets) were ever compiled.
func Strategies() int { return int(stamps.n.Load()) }

// intern returns the canonical strategy for params, creating it with build on first use.
func intern(params any, build func(stamp uint32) RateLimiter) RateLimiter {
	stamps.Lock()
	defer stamps.Unlock()
	if stamps.byParams == nil {
		stamps.byParams = make(map[any]uint32)
	}
	if s, ok := stamps.byParams[params]; ok {
		return strategyOf(s)
	}
	i := stamps.n.Load()
	var chunks []*[stampChunk]RateLimiter
	if p := stamps.chunks.Load(); p != nil {
		chunks = *p
	}
	if int(i/stampChunk) == len(chunks) {
		// Copy the spine on write: readers may hold it without the lock. Chunks are shared.
		grown := make([]*[stampChunk]RateLimiter, len(chunks)+1)
		copy(grown, chunks)
		grown[len(chunks)] = new([stampChunk]RateLimiter)
		chunks = grown
		stamps.chunks.Store(&grown)
	}
	rl := build(i + 1)
	// A reader only looks up a stamp it found in a State, which was written after this strategy
	// was returned, so the slot is written before any read of it.
	chunks[i/stampChunk][i%stampChunk] = rl
	stamps.byParams[params] = i + 1
	stamps.n.Store(i + 1)
	return rl
}

// strategyOf returns the strategy that wrote a state, or nil for a fresh state.
func strategyOf(stamp uint32) RateLimiter {
	if stamp == 0 {
		return nil
	}
	return (*stamps.chunks.Load())[(stamp-1)/stampChunk][(stamp-1)%stampChunk]
}

// adopt prepares s for a decision by rl: it applies the rule for parameter changes (see the
// package documentation) when s was last written by another strategy.
func adopt(rl RateLimiter, s *State, now int64) {
	if s.stamp == rl.Stamp() || s.stamp == 0 {
		return
	}
	switch to := rl.(type) {
	case *TokenBucket:
		if from, ok := strategyOf(s.stamp).(*TokenBucket); ok {
			to.carryFrom(from, s, now)
			return
		}
	case *SlidingWindow:
		if _, ok := strategyOf(s.stamp).(*SlidingWindow); ok {
			to.carryFrom(s, now)
			return
		}
	}
	*s = State{}
}

// Bounds of the strategies' parameters: those of the API (api/v1alpha1/limits.go), so that
// every valid policy compiles.
const (
	MaxCapacity     = v1alpha1.MaxCapacity
	MaxWindowLimit  = v1alpha1.MaxWindowLimit
	MinPeriod       = v1alpha1.MinPeriod
	MaxPeriod       = v1alpha1.MaxPeriod
	MaxRefillWindow = v1alpha1.MaxRefillWindow // a full refill takes at most this long
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
func (unlimited) Stamp() uint32                            { return 0 }
