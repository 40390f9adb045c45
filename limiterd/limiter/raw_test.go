package limiter_test

import (
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// The accessors of raw.go, by which a shared store (store/redis) keeps a strategy's state outside
// process memory: parameters, exact intervals, a token bucket's State from and to its TAT, and
// the conversion of a state across a change of parameters.

func bucket(t *testing.T, capacity, rate int64, period time.Duration) *limiter.TokenBucket {
	t.Helper()
	b, err := limiter.NewTokenBucket(capacity, rate, period)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRawParams(t *testing.T) {
	c, r, p := bucket(t, 10, 3, 7*time.Second).Params()
	if c != 10 || r != 3 || p != 7*time.Second {
		t.Errorf("TokenBucket(10, 3, 7s).Params() = %d, %d, %v", c, r, p)
	}
	w, err := limiter.NewSlidingWindow(40, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if l, d := w.Params(); l != 40 || d != 90*time.Second {
		t.Errorf("SlidingWindow(40, 90s).Params() = %d, %v", l, d)
	}
}

func TestRawInterval(t *testing.T) {
	b := bucket(t, 10, 3, time.Second) // a token every 333,333,333 1/3 ns
	for _, tc := range []struct {
		n        int64
		wantNS   int64
		wantFrac uint64
	}{
		{0, 0, 0},
		{1, 333_333_333, 1},
		{2, 666_666_666, 2},
		{3, 1_000_000_000, 0},
		{10, 3_333_333_333, 1}, // a full refill
	} {
		if ns, frac := b.Interval(tc.n); ns != tc.wantNS || frac != tc.wantFrac {
			t.Errorf("Interval(%d) = %d + %d/3 ns, want %d + %d/3", tc.n, ns, frac, tc.wantNS, tc.wantFrac)
		}
	}
}

func TestRawStateAt(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ns := now.UnixNano()
	b := bucket(t, 10, 3, time.Second)
	for _, tc := range []struct {
		name          string
		tat           int64
		frac          uint64
		wantRemaining int64
	}{
		{"full long ago", ns - int64(time.Hour), 0, 10},
		{"full just now", ns, 0, 10},
		{"one token used, exactly", ns + 333_333_333, 1, 9},
		{"a third of a nanosecond more", ns + 333_333_333, 2, 8},
		{"three used", ns + int64(time.Second), 0, 7},
		{"empty", ns + 3_333_333_333, 1, 0},
	} {
		s := b.StateAt(tc.tat, tc.frac)
		if tat, frac := s.TAT(); tat != tc.tat || frac != tc.frac {
			t.Errorf("%s: StateAt(%d, %d).TAT() = %d, %d", tc.name, tc.tat, tc.frac, tat, frac)
		}
		if d := b.Peek(&s, now); d.Remaining != tc.wantRemaining {
			t.Errorf("%s: a peek on StateAt(now%+d ns, %d/3) answers %d remaining, want %d",
				tc.name, tc.tat-ns, tc.frac, d.Remaining, tc.wantRemaining)
		}
	}
	if tat, frac := (&limiter.State{}).TAT(); tat != 0 || frac != 0 {
		t.Errorf("a fresh state's TAT() = %d, %d, want 0, 0", tat, frac)
	}
}

// TestRawConvert: the rule for parameter changes, which never gives usage back. The debt a
// client owed the old bucket carries to the new one exactly, unclamped (beyond its capacity it
// just waits longer); a state the new bucket wrote, or a fresh one, is kept as it is; another
// algorithm's units in use are charged as the new bucket's debt.
func TestRawConvert(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ns := now.UnixNano()
	old := bucket(t, 10, 1, time.Second) // a token a second
	used := func(d time.Duration) func() limiter.State {
		return func() limiter.State { return old.StateAt(ns+int64(d), 0) }
	}
	window, err := limiter.NewSlidingWindow(10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fresh := int64(-1) // wantTAT of a fresh state: TAT() 0, 0
	for _, tc := range []struct {
		name          string
		state         func() limiter.State
		to            *limiter.TokenBucket
		wantTAT       int64 // ns after now, or fresh
		wantFrac      uint64
		wantRemaining int64
	}{
		{"its own state, as it is", used(4 * time.Second), old, int64(4 * time.Second), 0, 6},
		{"its own state, even a TAT beyond a full refill", used(time.Hour), old, int64(time.Hour), 0, 0},
		{"the same parameters, another bucket", used(4 * time.Second), bucket(t, 10, 1, time.Second), int64(4 * time.Second), 0, 6},
		{"a smaller capacity still above the usage", used(4 * time.Second), bucket(t, 5, 1, time.Second), int64(4 * time.Second), 0, 1},
		{"a capacity below the usage: the debt carries, unclamped", used(4 * time.Second), bucket(t, 3, 1, time.Second), int64(4 * time.Second), 0, 0},
		{"a faster refill: the same tokens, refilled sooner", used(4 * time.Second), bucket(t, 10, 2, time.Second), int64(2 * time.Second), 0, 6},
		{"a fraction of a token carries exactly", used(2500 * time.Millisecond), bucket(t, 10, 2, time.Second), int64(1250 * time.Millisecond), 0, 7},
		{"an inexact refill keeps its fraction", used(time.Second), bucket(t, 10, 3, time.Second), 333_333_333, 1, 9},
		{"a full bucket: nothing used", used(-time.Minute), bucket(t, 20, 1, time.Second), 0, 0, 20},
		{"a fresh state", func() limiter.State { return limiter.State{} }, bucket(t, 20, 1, time.Second), fresh, 0, 20},
		{"a sliding window's units in use are charged", func() limiter.State {
			var s limiter.State
			window.Decide(&s, now, 7)
			return s
		}, bucket(t, 20, 1, time.Second), int64(7 * time.Second), 0, 13},
	} {
		s := tc.to.Convert(tc.state(), now)
		tat, frac := s.TAT()
		if tc.wantTAT == fresh && (tat != 0 || frac != 0) || tc.wantTAT != fresh && (tat-ns != tc.wantTAT || frac != tc.wantFrac) {
			t.Errorf("%s: converted TAT now%+d ns + %d/rate, want now%+d + %d", tc.name, tat-ns, frac, tc.wantTAT, tc.wantFrac)
		}
		if d := tc.to.Peek(&s, now); d.Remaining != tc.wantRemaining {
			t.Errorf("%s: %d remaining after the conversion, want %d", tc.name, d.Remaining, tc.wantRemaining)
		}
	}
}
