package redis

import (
	"context"
	"testing"
	"time"
)

// TestDeadlinesBoundEachWait: a wait that starts at any instant gets at least the timeout, and
// at most a sixteenth more.
func TestDeadlinesBoundEachWait(t *testing.T) {
	const timeout = 160 * time.Millisecond
	d := newDeadlines(timeout)
	for range 1000 {
		start := time.Now()
		ctx, cancel := d.context(t.Context())
		dl, ok := ctx.Deadline()
		cancel()
		if !ok {
			t.Fatal("a wait without a deadline")
		}
		// The deadline is at least the timeout after the start, and at most a sixteenth more
		// (plus the time the call itself took).
		if wait := dl.Sub(start); wait < timeout || wait > timeout+timeout/16+time.Since(start) {
			t.Fatalf("a wait starting now ends after %v, want between %v and %v", wait, timeout, timeout+timeout/16)
		}
	}
}

// TestDeadlinesKeepACallersSoonerDeadline: a caller's deadline sooner than the timeout still
// ends the wait, and its cancellation too.
func TestDeadlinesKeepACallersSoonerDeadline(t *testing.T) {
	d := newDeadlines(time.Second)
	parent, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	want, _ := parent.Deadline()
	ctx, release := d.context(parent)
	defer release()
	if got, _ := ctx.Deadline(); !got.Equal(want) {
		t.Fatalf("deadline %v, want the caller's %v", got, want)
	}
	cancel()
	<-ctx.Done() // it follows the caller's context
}

// TestDeadlinesShareOneContextPerSlot: decisions that start within one slot cost no context
// (and no timer) of their own.
func TestDeadlinesShareOneContextPerSlot(t *testing.T) {
	d := newDeadlines(time.Hour) // a slot of 3m45s: every call below falls in the first
	first, _ := d.context(t.Context())
	for range 100 {
		if ctx, _ := d.context(t.Context()); ctx != first {
			t.Fatal("calls within one slot got contexts of their own")
		}
	}
}
