package redis

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Circuit breaker defaults, for Options left zero.
const (
	// DefaultBreakerFailures is how many consecutive failures of Redis (lost connections,
	// error replies, failed health checks) open the breaker.
	DefaultBreakerFailures = 5
	// DefaultBreakerBackoff is how long the breaker first stays open before a health check;
	// each failed check doubles it, up to maxBreakerBackoffFactor times. It is short because a
	// health check costs Redis one trivial script: once Redis answers again, the failure modes
	// stop deciding within one backoff (at most 8 × 100 ms) and one round trip.
	DefaultBreakerBackoff = 100 * time.Millisecond
	// maxBreakerBackoffFactor bounds the backoff: DefaultBreakerBackoff grows to 800 ms.
	maxBreakerBackoffFactor = 8
)

// ErrBreakerOpen is returned while the breaker is open: Redis failed repeatedly and is not called until a health check finds it answering; the policy's failure mode decides meanwhile, at once.
var ErrBreakerOpen = errors.New("redis circuit breaker open: not calling redis after consecutive failures")

// errUnhealthy is the error of the requests of a batch that were not sent because a health check
// after a timed-out piece failed.
var errUnhealthy = errors.New("redis failed its health check: request not sent")

// Breaker states.
const (
	breakerClosed int32 = iota // calls go to Redis
	breakerOpen                // calls fail at once; after the backoff, a health check probes Redis
)

// breaker stops calling Redis while Redis is unhealthy, judged by Redis's health and never by
// what one caller asked: only failures that say something of Redis count (a lost connection, an
// error reply, a failed health check). A call that merely timed out does not count by itself,
// since a caller's own work may have taken the time: it starts a health check (one trivial
// script with a deadline of its own, at most one at a time), and only a failed check counts.
//
// While closed, every call goes through and a success resets the count. Once threshold
// failures in a row were counted it opens: calls fail at once with ErrBreakerOpen; the first
// call after the backoff starts a health check (and fails at once too). A check that succeeds
// closes the breaker; one that fails keeps it open for twice the backoff (at most the maximum).
// It is safe for concurrent use; a call while closed with no failures costs two atomic loads.
type breaker struct {
	threshold  int32 // < 0: never opens
	base, most time.Duration
	now        func() time.Time
	log        *slog.Logger
	// check probes Redis's health within its own deadline; key (possibly "") routes it to the
	// node of the call that timed out.
	check func(key string) error

	state    atomic.Int32
	failures atomic.Int32 // consecutive, while closed
	trips    atomic.Int64
	checks   atomic.Int64 // health checks started

	mu       sync.Mutex
	until    time.Time // open: when the next health check may start
	backoff  time.Duration
	checking *healthCheck // the health check in flight, nil if none
	lastKey  string       // a key of the last call that failed or timed out: where to check
}

// healthCheck is one health check; err is set before done is closed.
type healthCheck struct {
	done chan struct{}
	err  error
}

func newBreaker(threshold int, backoff time.Duration, log *slog.Logger, check func(key string) error) *breaker {
	return &breaker{
		threshold: int32(min(threshold, 1<<30)), // bounded
		base:      backoff,
		most:      maxBreakerBackoffFactor * backoff,
		now:       time.Now,
		log:       log,
		check:     check,
		backoff:   backoff,
	}
}

// allow returns nil when a call may go to Redis, ErrBreakerOpen when not. Every allowed call
// must be followed by done. The first call after an open breaker's backoff starts a health
// check.
func (b *breaker) allow() error {
	if b.state.Load() == breakerClosed {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() == breakerClosed {
		return nil
	}
	if b.checking == nil && !b.now().Before(b.until) {
		b.startCheckLocked(b.lastKey)
	}
	return ErrBreakerOpen
}

// Outcomes of an allowed call, for done.
type outcome uint8

const (
	succeeded outcome = iota // Redis answered
	failed                   // Redis failed: counts towards opening
	timedOut                 // no answer in time: a health check decides whether it counts
	abandoned                // the caller gave up or the client closed: says nothing of Redis
)

// classify returns the outcome of a call that returned err under the caller's ctx.
func classify(ctx context.Context, err error) outcome {
	switch {
	case err == nil:
		return succeeded
	case ctx.Err() != nil || errors.Is(err, ErrClosed):
		return abandoned
	case errors.Is(err, context.DeadlineExceeded):
		return timedOut
	}
	return failed
}

// done records how an allowed call went. For a timed-out call it returns the health check it
// started or joined (nil otherwise): its done channel closes once Redis's health is known.
func (b *breaker) done(o outcome, key string) *healthCheck {
	switch o {
	case succeeded:
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
	case failed:
		b.mu.Lock()
		b.lastKey = key
		b.failedLocked()
		b.mu.Unlock()
	case timedOut:
		b.mu.Lock()
		defer b.mu.Unlock()
		b.lastKey = key
		if b.checking == nil {
			b.startCheckLocked(key)
		}
		return b.checking
	case abandoned:
	}
	return nil
}

// failedLocked counts one failure of Redis.
func (b *breaker) failedLocked() {
	if b.state.Load() == breakerClosed && b.threshold >= 0 && b.failures.Add(1) >= b.threshold {
		b.state.Store(breakerOpen)
		b.trips.Add(1)
		b.backoff = b.base
		b.until = b.now().Add(b.backoff)
		b.log.Warn("redis circuit breaker opened: failure modes decide without calling redis",
			"consecutive_failures", b.failures.Load(), "backoff", b.backoff.String())
	}
}

// startCheckLocked starts a health check; b.mu is held and no check is in flight.
func (b *breaker) startCheckLocked(key string) {
	hc := &healthCheck{done: make(chan struct{})}
	b.checking = hc
	b.checks.Add(1)
	go func() {
		hc.err = b.check(key)
		b.mu.Lock()
		b.checking = nil
		switch {
		case hc.err == nil && b.state.Load() == breakerOpen:
			b.failures.Store(0)
			b.backoff = b.base
			b.state.Store(breakerClosed)
			b.log.Info("redis circuit breaker closed: redis answered again")
		case hc.err == nil:
			b.failures.Store(0)
		case b.state.Load() == breakerOpen:
			b.backoff = min(2*b.backoff, b.most)
			b.until = b.now().Add(b.backoff)
			b.log.Debug("redis health check failed", "backoff", b.backoff.String(), "error", hc.err)
		default:
			b.log.Debug("redis health check after a timeout failed", "error", hc.err)
			b.failedLocked()
		}
		b.mu.Unlock()
		close(hc.done)
	}()
}

// open reports whether the breaker is open.
func (b *breaker) open() bool { return b.state.Load() != breakerClosed }
