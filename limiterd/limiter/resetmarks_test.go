package limiter

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestResetMarkLifetime: a Memory reset marks its client only while a state it forgot had units
// to refill, and the mark lives until they would have refilled and RefundRecordGrace more, so as
// long as a reservation that charged the state could be refunded, then Sweep drops it.
func TestResetMarkLifetime(t *testing.T) {
	ctx := context.Background()
	t0 := time.Unix(1_700_000_000, 0)
	tb, _ := NewTokenBucket(10, 1, time.Second)
	long, _ := NewTokenBucket(10, 1, time.Minute)
	st, _ := NewStack([]string{DefaultLimitName, "long"}, []RateLimiter{tb, long})
	m := NewMemory(nil)
	refund := func(now time.Time, id byte) error {
		_, err := m.Refund(ctx, Request{Key: "k", Stack: st, Cost: 1}, now, Once{ID: [16]byte{id}, Until: now.Add(time.Hour), Issued: t0})
		return err
	}
	if err := m.Reset(ctx, "k", t0); err != nil || m.resets.marks != nil {
		t.Fatalf("reset of a client without state: %v, marks %v, want none", err, m.resets.marks)
	}
	m.Decide(ctx, "k", st, t0, 2, nil) // "long" refills in 2 minutes
	m.Decide(ctx, "other", st, t0, 2, nil)
	m.Reset(ctx, "k", t0.Add(time.Second))
	end := t0.Add(time.Second + 2*time.Minute - time.Second + RefundRecordGrace) // "long"'s refill and the grace
	m.Sweep(end.Add(-1))
	if err := refund(end.Add(-1), 1); !errors.Is(err, ErrReset) {
		t.Fatalf("refund of a charge before the reset, the mark still due: %v, want ErrReset", err)
	}
	if err := refund(end.Add(-1), 2); !errors.Is(err, ErrReset) {
		t.Fatalf("again: %v, want ErrReset", err)
	}
	m.Sweep(end)
	if m.resets.marks != nil {
		t.Fatalf("marks after the refill and the grace: %v, want none", m.resets.marks)
	}
}

// TestResetMarksOverflow: past MaxResetMarks marks, a reset voids the charges made before it for
// every client (refusing more refunds than needed, admitting nothing extra), until marks expire.
func TestResetMarksOverflow(t *testing.T) {
	var r resetMarks
	t0 := time.Unix(1_700_000_000, 0)
	for i := range MaxResetMarks {
		r.mark(fmt.Sprint("c", i), t0, t0.Add(time.Hour))
	}
	if r.floor != 0 || r.voids("x", t0.UnixNano()-1) {
		t.Fatalf("a client never reset is void with %d marks", len(r.marks))
	}
	r.mark("one more", t0.Add(time.Second), t0.Add(time.Hour))
	if r.floor != t0.Add(time.Second).UnixNano() || !r.voids("x", t0.Add(time.Second).UnixNano()) || r.voids("x", t0.Add(time.Second).UnixNano()+1) {
		t.Fatalf("past the bound: floor %d, want the reset's instant, voiding every client's earlier charges only", r.floor)
	}
	// Once marks expired, a new one is kept again.
	later := t0.Add(time.Hour + RefundRecordGrace)
	r.mark("late", later, later.Add(time.Hour))
	if len(r.marks) != 1 || !r.voids("late", later.UnixNano()) {
		t.Fatalf("after the marks expired: %d marks, want the new one alone", len(r.marks))
	}
}
