// Package testsupport holds helpers shared by the module's tests: a clock that moves only when
// told, builders of RateLimitPolicy tiers, a log sink safe for concurrent writes, and the polling
// helpers (Eventually, and Consistently for what must not happen).
//
// It is a normal package so that tests of several packages can share it, but it is meant to be
// imported only by _test.go files, never by production code.
package testsupport

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// Clock is a clock that moves only when told.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a Clock set to a fixed instant.
func NewClock() *Clock {
	c := &Clock{}
	c.ns.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// TokenBucketTier returns a token bucket tier holding capacity tokens, refilled by rate every
// period.
func TokenBucketTier(name string, capacity, rate int64, period time.Duration) v1alpha1.Tier {
	return v1alpha1.Tier{
		Name:      name,
		Algorithm: v1alpha1.AlgorithmTokenBucket,
		TokenBucket: &v1alpha1.TokenBucket{
			Capacity: capacity, RefillRate: rate, RefillPeriod: &metav1.Duration{Duration: period},
		},
	}
}

// SlidingWindowTier returns a sliding window tier allowing limit requests per window.
func SlidingWindowTier(name string, limit int64, window time.Duration) v1alpha1.Tier {
	return v1alpha1.Tier{
		Name:          name,
		Algorithm:     v1alpha1.AlgorithmSlidingWindow,
		SlidingWindow: &v1alpha1.SlidingWindow{Limit: limit, Window: metav1.Duration{Duration: window}},
	}
}

// QuotaTier returns a calendar quota tier allowing limit requests per period of the time zone
// ("" for the default, UTC).
func QuotaTier(name string, limit int64, period v1alpha1.CalendarPeriod, zone string) v1alpha1.Tier {
	return v1alpha1.Tier{
		Name:      name,
		Algorithm: v1alpha1.AlgorithmQuota,
		Quota:     &v1alpha1.Quota{Limit: limit, Period: period, TimeZone: zone},
	}
}

// StackedTier returns a tier of the given limits, decided all or nothing.
func StackedTier(name string, limits ...v1alpha1.Limit) v1alpha1.Tier {
	return v1alpha1.Tier{Name: name, Limits: limits}
}

// TokenBucketLimit returns a limit of a stacked tier: a token bucket holding capacity tokens,
// refilled by rate every period.
func TokenBucketLimit(name string, capacity, rate int64, period time.Duration) v1alpha1.Limit {
	t := TokenBucketTier(name, capacity, rate, period)
	return v1alpha1.Limit{Name: name, Algorithm: t.Algorithm, TokenBucket: t.TokenBucket}
}

// SlidingWindowLimit returns a limit of a stacked tier: a sliding window allowing limit
// requests per window.
func SlidingWindowLimit(name string, limit int64, window time.Duration) v1alpha1.Limit {
	t := SlidingWindowTier(name, limit, window)
	return v1alpha1.Limit{Name: name, Algorithm: t.Algorithm, SlidingWindow: t.SlidingWindow}
}

// QuotaLimit returns a limit of a stacked tier: a calendar quota allowing limit requests per
// period of the time zone ("" for the default, UTC).
func QuotaLimit(name string, limit int64, period v1alpha1.CalendarPeriod, zone string) v1alpha1.Limit {
	t := QuotaTier(name, limit, period, zone)
	return v1alpha1.Limit{Name: name, Algorithm: t.Algorithm, Quota: t.Quota}
}

// UnlimitedTier returns a tier that never limits.
func UnlimitedTier(name string) v1alpha1.Tier {
	return v1alpha1.Tier{Name: name, Algorithm: v1alpha1.AlgorithmUnlimited}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes, such as a log sink. Its zero value is
// ready to use.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p) //nolint:wrapcheck // an io.Writer passes the error of the one it wraps (bytes.Buffer: always nil)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// NewEngine returns an engine on the clock now with the policies compiled and loaded (none: the
// engine is not ready). It fails the test if a policy does not compile.
func NewEngine(t testing.TB, now func() time.Time, policies ...*v1alpha1.RateLimitPolicy) *engine.Engine {
	t.Helper()
	e := engine.New(engine.Options{Clock: now})
	if len(policies) == 0 {
		return e
	}
	e.Swap(PolicySet(t, policies...))
	return e
}

// PolicySet compiles policies into a set, failing t if one does not compile or the set cannot
// be made.
func PolicySet(t testing.TB, policies ...*v1alpha1.RateLimitPolicy) *policy.Set {
	t.Helper()
	var compiled []*policy.Policy
	for _, p := range policies {
		c, err := policy.Compile(p)
		if err != nil {
			t.Fatalf("compile %s: %v", p.Name, err)
		}
		compiled = append(compiled, c)
	}
	set, err := policy.NewSet(compiled...)
	if err != nil {
		t.Fatalf("new set: %v", err)
	}
	return set
}

// Eventually calls condition until it holds (true, or a nil error), and fails t, naming what
// did not happen and the condition's last error, if that has not happened within timeout. It
// polls every few milliseconds at first and backs off to 200ms, so a short wait ends quickly
// and a long one (an API server, a cluster) is not hammered.
func Eventually[C func() bool | func() error](t testing.TB, timeout time.Duration, what string, condition C) {
	t.Helper()
	check := asCheck(condition)
	deadline := time.Now().Add(timeout)
	for interval := 5 * time.Millisecond; ; interval = min(2*interval, 200*time.Millisecond) {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			if errors.Is(err, errNotYet) {
				t.Fatalf("%s: not within %v", what, timeout)
			}
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(interval)
	}
}

// Consistently calls condition repeatedly for duration, and fails t, naming what stopped
// holding and the condition's error, the first time the condition does not hold (false, or a
// non-nil error). It is how a test shows that something does not happen: the last call is made
// once duration has passed. It polls as Eventually does, every few milliseconds at first and
// backing off to 200ms.
func Consistently[C func() bool | func() error](t testing.TB, duration time.Duration, what string, condition C) {
	t.Helper()
	check := asCheck(condition)
	deadline := time.Now().Add(duration)
	for interval := 5 * time.Millisecond; ; interval = min(2*interval, 200*time.Millisecond) {
		if err := check(); err != nil {
			if errors.Is(err, errNotYet) {
				t.Fatalf("%s: did not hold for %v", what, duration)
			}
			t.Fatalf("%s: did not hold for %v: %v", what, duration, err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		time.Sleep(min(interval, left))
	}
}

// asCheck returns condition as a function returning nil when it holds: a boolean condition that
// does not hold returns errNotYet.
func asCheck[C func() bool | func() error](condition C) func() error {
	if c, ok := any(condition).(func() bool); ok {
		return func() error {
			if c() {
				return nil
			}
			return errNotYet
		}
	}
	return any(condition).(func() error)
}

// errNotYet is the error of a boolean condition that does not hold.
var errNotYet = errors.New("condition does not hold")
