package limiter

import (
	"testing"
	"time"
)

// TestClampInstant checks the bounds to the nanosecond, on either side of each, in the bounds'
// own seconds (which ClampInstant compares exactly) and beyond them.
func TestClampInstant(t *testing.T) {
	for _, tc := range []struct {
		name     string
		now, out time.Time
	}{
		{"ordinary", time.Date(2026, 12, 7, 5, 0, 0, 1, time.UTC), time.Date(2026, 12, 7, 5, 0, 0, 1, time.UTC)},
		{"the latest", LatestInstant, LatestInstant},
		{"just before the latest", LatestInstant.Add(-1), LatestInstant.Add(-1)},
		{"just after the latest", LatestInstant.Add(1), LatestInstant},
		{"a second after the latest", LatestInstant.Add(time.Second), LatestInstant},
		{"a second before the latest", LatestInstant.Add(-time.Second), LatestInstant.Add(-time.Second)},
		{"the end of int64 ns", time.Unix(0, 1<<63-1), LatestInstant},
		{"year 3000", time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), LatestInstant},
		{"the earliest", EarliestInstant, EarliestInstant},
		{"just after the earliest", EarliestInstant.Add(1), EarliestInstant.Add(1)},
		{"just before the earliest", EarliestInstant.Add(-1), EarliestInstant},
		{"a second before the earliest", EarliestInstant.Add(-time.Second), EarliestInstant},
		{"a second after the earliest", EarliestInstant.Add(time.Second), EarliestInstant.Add(time.Second)},
		{"year 1000", time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), EarliestInstant},
	} {
		if got := ClampInstant(tc.now); !got.Equal(tc.out) {
			t.Errorf("%s: ClampInstant(%v) = %v, want %v", tc.name, tc.now, got, tc.out)
		}
	}
}

// TestInstantSeconds holds the constant seconds inSeconds compares with to the bounds' own.
func TestInstantSeconds(t *testing.T) {
	if latestSecond != LatestInstant.Unix() || earliestSecond != EarliestInstant.Unix() {
		t.Fatalf("seconds %d and %d, want %d and %d (the bounds' Unix seconds)",
			earliestSecond, latestSecond, EarliestInstant.Unix(), LatestInstant.Unix())
	}
}
