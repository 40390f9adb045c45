package ratelimitheaders

import (
	"math"
	"testing"
	"time"
)

func TestAppendPolicy(t *testing.T) {
	for _, c := range []struct {
		name   string
		quota  int64
		window time.Duration
		want   string
	}{
		{"free", 10, time.Minute, `"free";q=10;w=60`},
		{"free", 10, 1500 * time.Millisecond, `"free";q=10;w=2`},
		{"free", 10, time.Millisecond, `"free";q=10;w=1`},
		{"free", 10, 0, `"free";q=10;w=1`},
		{`a"b\c`, 1, time.Second, `"a\"b\\c";q=1;w=1`},
		{"caf\u00e9\n", 1, time.Second, `"caf???";q=1;w=1`},
		{"", 1_000_000_000, 366 * 24 * time.Hour, `"";q=1000000000;w=31622400`},
	} {
		if got := string(AppendPolicy([]byte("x"), c.name, c.quota, c.window)); got != "x"+c.want {
			t.Errorf("AppendPolicy(%q, %d, %v) = %s, want x%s", c.name, c.quota, c.window, got, c.want)
		}
	}
}

// TestAppendQuotaUnit: the qu parameter follows the item AppendPolicy wrote, as a structured
// field String, and a second item after it is a separate list member.
func TestAppendQuotaUnit(t *testing.T) {
	b := AppendPolicy(nil, "slow", 3, 30*time.Second)
	b = AppendQuotaUnit(b, UnitConcurrentRequests)
	b = append(b, ", "...)
	b = AppendPolicy(b, "rate", 10, time.Second)
	if got, want := string(b), `"slow";q=3;w=30;qu="concurrent-requests", "rate";q=10;w=1`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestAppendLimit(t *testing.T) {
	for _, c := range []struct {
		remaining int64
		reset     time.Duration
		want      string
	}{
		{9, 2 * time.Second, `"t";r=9;t=2`},
		{0, time.Nanosecond, `"t";r=0;t=1`},
		{-3, 0, `"t";r=0;t=0`},
		{5, -time.Second, `"t";r=5;t=0`},
	} {
		if got := string(AppendLimit(nil, "t", c.remaining, c.reset)); got != c.want {
			t.Errorf("AppendLimit(%d, %v) = %s, want %s", c.remaining, c.reset, got, c.want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for _, c := range []struct {
		retry time.Duration
		want  string
	}{
		{0, "1"}, {-time.Second, "1"}, {time.Nanosecond, "1"}, {time.Second, "1"},
		{time.Second + 1, "2"}, {90 * time.Second, "90"},
		{time.Duration(math.MaxInt64), "9223372037"},
	} {
		if got := string(AppendRetryAfter(nil, c.retry)); got != c.want {
			t.Errorf("AppendRetryAfter(%v) = %s, want %s", c.retry, got, c.want)
		}
	}
}

func TestAppendDoesNotAllocate(t *testing.T) {
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		b := AppendPolicy(buf[:0], "free", 100, time.Minute)
		b = AppendQuotaUnit(b, UnitConcurrentRequests)
		b = AppendLimit(b, "free", 42, 3*time.Second)
		_ = AppendRetryAfter(b, time.Second)
	}); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}
