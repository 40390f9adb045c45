package limiter

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"

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

// stamps interns strategy parameters: equal parameters share one stamp, so that a state written
// by a strategy finds the strategy (and its parameters) that wrote it, and its usage carries over
// when its tier's parameters change (see the package documentation).
//
// The table references its strategies weakly, so it is bounded by what is still needed: the
// strategies that something holds (the loaded policies, a decision in flight), plus each strategy
// that was collected for its horizon (Window: a full refill, or the window) after its collection.
// No decision can run on a strategy after it is collected, so by then every state it wrote is
// fresh under it, and a state whose stamp the table has forgotten is treated as fresh. Until its
// horizon passes, a collected strategy is rebuilt from its parameters, with the same stamp, when
// a state it wrote needs it. The horizon is measured on the wall clock, like the engine's
// decisions.
//
// Stamps are not reused until the 32-bit counter wraps (2^32 distinct parameter sets); a state
// that outlives its strategy that long is read under the strategy that got its stamp again.
var stamps = internTable{byParams: make(map[any]*stampEntry)}

type internTable struct {
	mu       sync.Mutex
	byParams map[any]*stampEntry // guarded by mu
	byStamp  sync.Map            // uint32 → *stampEntry; written under mu, read without it
	last     uint32              // last stamp issued; guarded by mu
	retired  []*stampEntry       // collected strategies waiting for their horizon; guarded by mu
	pruneAt  int64               // earliest forgetAt in retired (Unix ns); guarded by mu
}

// stampEntry is the table's record of one parameter set.
type stampEntry struct {
	stamp   uint32
	params  any
	horizon time.Duration
	ref     atomic.Value       // strategyRef: the strategy, weakly
	fill    func() RateLimiter // builds the strategy again and stores a weak reference to it; under mu
	// Guarded by mu: when the strategy was collected, Unix ns after which the entry is forgotten
	// (0 while something holds it or it has not been collected yet), and whether it was.
	forgetAt  int64
	forgotten bool
	retiring  bool // in retired
}

// strategyRef is a weak reference to a strategy.
type strategyRef interface{ strategy() RateLimiter }

type weakStrategy[T any, P interface {
	*T
	RateLimiter
}] weak.Pointer[T]

func (w weakStrategy[T, P]) strategy() RateLimiter {
	if v := weak.Pointer[T](w).Value(); v != nil {
		return P(v)
	}
	return nil
}

// strategy returns the entry's strategy, or nil if it was collected.
func (e *stampEntry) strategy() RateLimiter {
	if r, ok := e.ref.Load().(strategyRef); ok {
		return r.strategy()
	}
	return nil
}

// Strategies returns how many strategies (distinct parameter sets) the intern table holds: those
// in use and those collected less than their horizon ago.
func Strategies() int {
	t := &stamps
	t.mu.Lock()
	defer t.mu.Unlock()
	t.prune()
	return len(t.byParams)
}

// intern returns the canonical strategy for params, building it with build (given its stamp) if
// no strategy with those parameters is alive. horizon is the strategy's Window.
func intern[T any, P interface {
	*T
	RateLimiter
}](params any, horizon time.Duration, build func(stamp uint32) P) P {
	t := &stamps
	t.mu.Lock()
	defer t.mu.Unlock()
	t.prune()
	e := t.byParams[params]
	if e == nil {
		e = &stampEntry{stamp: t.issue(), params: params, horizon: horizon}
		e.fill = func() RateLimiter {
			p := build(e.stamp)
			e.ref.Store(strategyRef(weakStrategy[T, P](weak.Make((*T)(p)))))
			runtime.AddCleanup((*T)(p), t.collected, e)
			return p
		}
		t.byParams[params] = e
		t.byStamp.Store(e.stamp, e)
	}
	e.forgetAt = 0 // in use again: the caller holds it
	if rl := e.strategy(); rl != nil {
		return rl.(P)
	}
	return e.fill().(P)
}

// issue returns an unused stamp. Stamp 0 means fresh and is never issued.
func (t *internTable) issue() uint32 {
	for {
		t.last++
		if _, used := t.byStamp.Load(t.last); t.last != 0 && !used {
			return t.last
		}
	}
}

// collected is the cleanup of a strategy the garbage collector freed: the entry is kept for the
// strategy's horizon from the first collection after its last use.
func (t *internTable) collected(e *stampEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.forgotten || e.forgetAt != 0 || e.strategy() != nil {
		return // already retiring (a rebuilt copy was collected), or rebuilt and alive
	}
	e.forgetAt = time.Now().Add(e.horizon).UnixNano()
	if len(t.retired) == 0 || e.forgetAt < t.pruneAt {
		t.pruneAt = e.forgetAt
	}
	if !e.retiring {
		e.retiring = true
		t.retired = append(t.retired, e)
	}
}

// prune forgets the retired entries whose horizon has passed. It scans them only once the
// earliest horizon has passed, so that interning many strategies costs O(1) each.
func (t *internTable) prune() {
	now := time.Now().UnixNano()
	if len(t.retired) == 0 || now <= t.pruneAt {
		return
	}
	kept := t.retired[:0]
	t.pruneAt = 0
	for _, e := range t.retired {
		switch {
		case e.forgetAt == 0: // in use again
			e.retiring = false
		case now <= e.forgetAt || e.strategy() != nil:
			if len(kept) == 0 || e.forgetAt < t.pruneAt {
				t.pruneAt = e.forgetAt
			}
			kept = append(kept, e)
		default:
			e.retiring, e.forgotten = false, true
			delete(t.byParams, e.params)
			t.byStamp.Delete(e.stamp)
		}
	}
	clear(t.retired[len(kept):])
	t.retired = kept
}

// strategyOf returns the strategy that wrote a state, or nil for a fresh state or one whose
// strategy was forgotten (which is fresh under it).
func strategyOf(stamp uint32) RateLimiter {
	if stamp == 0 {
		return nil
	}
	v, ok := stamps.byStamp.Load(stamp)
	if !ok {
		return nil
	}
	e := v.(*stampEntry)
	if rl := e.strategy(); rl != nil {
		return rl
	}
	t := &stamps
	t.mu.Lock()
	defer t.mu.Unlock()
	if rl := e.strategy(); rl != nil || e.forgotten {
		return rl
	}
	if e.forgetAt != 0 && time.Now().UnixNano() > e.forgetAt {
		return nil // past its horizon: the next prune forgets it
	}
	return e.fill()
}

// strategyCache remembers the last strategyOf lookup, for a loop over many states that mostly
// share a stamp (a sweep, an eviction sample).
type strategyCache struct {
	stamp uint32
	rl    RateLimiter
}

func (c *strategyCache) of(stamp uint32) RateLimiter {
	if stamp != c.stamp {
		c.stamp, c.rl = stamp, strategyOf(stamp)
	}
	return c.rl
}

// fresh is IsFresh through the cache.
func (c *strategyCache) fresh(s *State, now time.Time) bool {
	rl := c.of(s.stamp)
	return rl == nil || rl.Fresh(s, now)
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
