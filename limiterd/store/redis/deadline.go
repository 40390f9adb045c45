package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadlines hands out the contexts that bound a decision's wait for Redis. A context with a
// timeout of its own costs each decision a timer and, under a cancellable parent, a place in the
// parent's children: at 64 concurrent decisions that was a quarter of limiterd's CPU on the Redis
// path (make bench-redis). Instead, the decisions that start within one slot (a sixteenth of the
// timeout) share one context whose deadline is the slot's end plus the timeout, so each waits at
// least the timeout and at most a sixteenth longer.
//
// A shared context does not follow its caller's cancellation: a decision already sent to Redis
// waits for its answer, within the timeout, even if its caller has gone. A caller's deadline
// sooner than the timeout is kept, through a context of the decision's own.
type deadlines struct {
	timeout time.Duration
	slot    time.Duration
	current atomic.Pointer[deadlineSlot]
	mu      sync.Mutex // serialises making a new slot
}

// deadlineSlot is the context shared by the decisions that start until its last instant.
type deadlineSlot struct {
	ctx    context.Context
	cancel context.CancelFunc // the context cancels itself at its deadline; kept for vet
	last   time.Time          // the last start that may share ctx
}

func newDeadlines(timeout time.Duration) *deadlines {
	return &deadlines{timeout: timeout, slot: max(timeout/16, time.Nanosecond)}
}

// context returns the context bounding a wait that starts now under parent, and the function
// that releases it.
func (d *deadlines) context(parent context.Context) (context.Context, context.CancelFunc) {
	now := time.Now()
	if dl, ok := parent.Deadline(); ok && dl.Before(now.Add(d.timeout+d.slot)) {
		return context.WithTimeout(parent, d.timeout)
	}
	if s := d.current.Load(); s != nil && !now.After(s.last) {
		return s.ctx, func() {}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.current.Load(); s != nil && !now.After(s.last) {
		return s.ctx, func() {}
	}
	s := &deadlineSlot{last: now.Add(d.slot)}
	s.ctx, s.cancel = context.WithDeadline(context.Background(), s.last.Add(d.timeout))
	d.current.Store(s)
	return s.ctx, func() {}
}
