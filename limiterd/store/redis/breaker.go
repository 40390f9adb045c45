package redis

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Circuit breaker defaults, for Options left zero.
const (
	// DefaultBreakerFailures is how many consecutive failed calls open the breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerBackoff is how long the breaker first stays open; each failed probe
	// doubles it, up to maxBreakerBackoffFactor times.
	DefaultBreakerBackoff = time.Second
	// maxBreakerBackoffFactor bounds the backoff: DefaultBreakerBackoff grows to 8 s.
	maxBreakerBackoffFactor = 8
)

// ErrBreakerOpen is returned while the breaker is open: Redis failed repeatedly and is not called until the breaker's backoff has
// passed; the policy's failure mode decides meanwhile, at once.
var ErrBreakerOpen = errors.New("redis circuit breaker open: not calling redis after consecutive failures")

// Breaker states.
const (
	breakerClosed int32 = iota // calls go to Redis
	breakerOpen                // calls fail at once; after the backoff, one call probes
)

// breaker stops calling Redis after consecutive failures. While it is closed, every call goes
// through and a success resets the count. Once threshold calls in a row have failed it opens:
// calls fail at once with ErrBreakerOpen for the backoff, then one call (the probe) goes
// through while the others keep failing at once. A probe that succeeds closes the breaker; one
// that fails opens it again for twice the backoff (at most the maximum). It is safe for
// concurrent use; a call while closed with no failures costs two atomic loads.
type breaker struct {
	threshold  int32 // < 0: never opens
	base, most time.Duration
	now        func() time.Time
	log        *slog.Logger

	state    atomic.Int32
	failures atomic.Int32 // consecutive, while closed
	trips    atomic.Int64

	mu      sync.Mutex
	until   time.Time // open: when the next probe may go
	backoff time.Duration
	probing bool
}

func newBreaker(threshold int, backoff time.Duration, log *slog.Logger) *breaker {
	return &breaker{
		threshold: int32(min(threshold, 1<<30)), // bounded
		base:      backoff,
		most:      maxBreakerBackoffFactor * backoff,
		now:       time.Now,
		log:       log,
		backoff:   backoff,
	}
}

// allow reports whether a call may go to Redis (ErrBreakerOpen if not), and whether it is the
// probe of an open breaker. Every allowed call must be followed by done.
func (b *breaker) allow() (probe bool, err error) {
	if b.state.Load() == breakerClosed {
		return false, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.state.Load() == breakerClosed:
		return false, nil
	case b.probing || b.now().Before(b.until):
		return false, ErrBreakerOpen
	}
	b.probing = true
	return true, nil
}

// done records how an allowed call went: failed is whether Redis failed it.
func (b *breaker) done(probe, failed bool) {
	if !probe && !failed {
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case probe && !failed:
		b.probing = false
		b.failures.Store(0)
		b.backoff = b.base
		b.state.Store(breakerClosed)
		b.log.Info("redis circuit breaker closed: redis answered again")
	case probe:
		b.probing = false
		b.backoff = min(2*b.backoff, b.most)
		b.until = b.now().Add(b.backoff)
		b.log.Debug("redis circuit breaker probe failed", "backoff", b.backoff.String())
	case b.state.Load() == breakerClosed && b.threshold >= 0 && b.failures.Add(1) >= b.threshold:
		b.state.Store(breakerOpen)
		b.trips.Add(1)
		b.until = b.now().Add(b.backoff)
		b.log.Warn("redis circuit breaker opened: failure modes decide without calling redis",
			"consecutive_failures", b.failures.Load(), "backoff", b.backoff.String())
	}
}

// abandon records an allowed call that says nothing of Redis's health (its caller gave up):
// a probe lets the next call probe.
func (b *breaker) abandon(probe bool) {
	if probe {
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
	}
}

// open reports whether the breaker is open (or probing).
func (b *breaker) open() bool { return b.state.Load() != breakerClosed }
