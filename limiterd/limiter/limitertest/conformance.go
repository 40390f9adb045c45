// Package limitertest holds the conformance table that every limiter.Store must pass with every
// strategy: the same steps and the same expected decisions for the memory store and for Redis.
package limitertest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the quota cases' zones, whatever the machine has installed

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// T0 is the instant conformance steps are relative to.
var T0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// Step is one decision (or peek, or refund) of a conformance case and what it must answer:
// every field of the Decision is checked, except RetryAfter of an admitted request and a
// ResetAfter of -1.
type Step struct {
	At   time.Duration // since T0
	Key  string        // default "client"
	Cost int64         // default 1
	// Peek makes the step a peek (Store.Decide of cost 0): what a one-unit request would get,
	// consuming nothing.
	Peek bool
	// Refund, when positive, makes the step a Store.Refund of that many units; the answer
	// describes the state after it, as a peek would.
	Refund     int64
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration // checked when the request is rejected; 0: no wait admits it
	ResetAfter time.Duration // -1: not checked
	// Then switches the strategy for the following steps (a policy swap).
	Then limiter.RateLimiter
}

// Case is a named sequence of decisions with one strategy (until a step switches it), decided as
// the stack of that one limit named limiter.DefaultLimitName (see Table).
type Case struct {
	Name     string
	Strategy limiter.RateLimiter
	Steps    []Step
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Cases returns the conformance table's cases of one limit.
func Cases() []Case {
	tb := func(capacity, rate int64, period time.Duration) limiter.RateLimiter {
		return must(limiter.NewTokenBucket(capacity, rate, period))
	}
	sw := func(limit int64, window time.Duration) limiter.RateLimiter {
		return must(limiter.NewSlidingWindow(limit, window))
	}
	qt := func(limit int64, period limiter.CalendarPeriod, loc *time.Location) limiter.RateLimiter {
		return must(limiter.NewQuota(limit, period, loc))
	}
	newYork := must(time.LoadLocation("America/New_York"))
	// nyDST is the start of 14 March 2027 in New York, when its clocks spring forward at 02:00.
	nyDST := time.Date(2027, 3, 14, 5, 0, 0, 0, time.UTC).Sub(T0)
	const ms = time.Millisecond
	return []Case{
		{Name: "token bucket starts full and refills continuously", Strategy: tb(3, 1, time.Second), Steps: []Step{
			{At: 0, Allowed: true, Remaining: 2, ResetAfter: time.Second},
			{At: 0, Allowed: true, Remaining: 1, ResetAfter: 2 * time.Second},
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
			{At: 0, Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: 3 * time.Second},
			{At: 500 * ms, Allowed: false, Remaining: 0, RetryAfter: 500 * ms, ResetAfter: 2500 * ms},
			{At: time.Second, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
			{At: 10 * time.Second, Allowed: true, Remaining: 2, ResetAfter: time.Second},
		}},
		{Name: "token bucket fractions of a token accrue", Strategy: tb(1, 3, time.Second), Steps: []Step{
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 333333334},
			{At: 333333333, Allowed: false, Remaining: 0, RetryAfter: 1, ResetAfter: 1},
			{At: 333333334, Allowed: true, Remaining: 0, ResetAfter: 333333334},
		}},
		{Name: "token bucket cost", Strategy: tb(10, 10, time.Second), Steps: []Step{
			{At: 0, Cost: 7, Allowed: true, Remaining: 3, ResetAfter: 700 * ms},
			{At: 0, Cost: 4, Allowed: false, Remaining: 3, RetryAfter: 100 * ms, ResetAfter: 700 * ms},
			{At: 100 * ms, Cost: 4, Allowed: true, Remaining: 0, ResetAfter: time.Second},
		}},
		{Name: "token bucket cost above capacity consumes nothing and has no retry time", Strategy: tb(5, 1, time.Second), Steps: []Step{
			{At: 0, Cost: 6, Allowed: false, Remaining: 5, RetryAfter: 0, ResetAfter: 0},
			{At: 0, Cost: 5, Allowed: true, Remaining: 0, ResetAfter: 5 * time.Second},
			{At: time.Second, Cost: 6, Allowed: false, Remaining: 1, RetryAfter: 0, ResetAfter: 4 * time.Second},
		}},
		{Name: "token bucket clock jumps backwards", Strategy: tb(2, 1, time.Second), Steps: []Step{
			{At: 10 * time.Second, Allowed: true, Remaining: 1, ResetAfter: time.Second},
			{At: 10 * time.Second, Allowed: true, Remaining: 0, ResetAfter: 2 * time.Second},
			{At: 5 * time.Second, Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: 2 * time.Second},
			{At: 12 * time.Second, Allowed: true, Remaining: 1, ResetAfter: time.Second},
		}},
		{Name: "token bucket huge limits", Strategy: tb(1_000_000_000, 1_000_000_000, time.Second), Steps: []Step{
			{At: 0, Cost: 999_999_999, Allowed: true, Remaining: 1, ResetAfter: 999_999_999},
			{At: 0, Cost: 2, Allowed: false, Remaining: 1, RetryAfter: 1, ResetAfter: 999_999_999},
			{At: 1, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: time.Second},
		}},
		{Name: "token bucket tiny rate", Strategy: tb(1, 1, 24*time.Hour), Steps: []Step{
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 24 * time.Hour},
			{At: 24*time.Hour - 1, Allowed: false, Remaining: 0, RetryAfter: 1, ResetAfter: 1},
			{At: 24 * time.Hour, Allowed: true, Remaining: 0, ResetAfter: 24 * time.Hour},
		}},
		{Name: "token bucket clients are isolated", Strategy: tb(1, 1, time.Second), Steps: []Step{
			{At: 0, Key: "a", Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 0, Key: "a", Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: time.Second},
			{At: 0, Key: "b", Allowed: true, Remaining: 0, ResetAfter: time.Second},
		}},
		{Name: "sliding window is a hard cap over any window", Strategy: sw(3, time.Second), Steps: []Step{
			{At: 0, Allowed: true, Remaining: 2, ResetAfter: time.Second},
			{At: 400 * ms, Allowed: true, Remaining: 1, ResetAfter: time.Second},
			{At: 800 * ms, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 999 * ms, Allowed: false, Remaining: 0, RetryAfter: 1 * ms, ResetAfter: 801 * ms},
			{At: time.Second, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 1300 * ms, Allowed: false, Remaining: 0, RetryAfter: 100 * ms, ResetAfter: 700 * ms},
			{At: 1400 * ms, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 5 * time.Second, Allowed: true, Remaining: 2, ResetAfter: time.Second},
		}},
		{Name: "sliding window cost and retry", Strategy: sw(10, time.Second), Steps: []Step{
			{At: 0, Cost: 4, Allowed: true, Remaining: 6, ResetAfter: time.Second},
			{At: 100 * ms, Cost: 3, Allowed: true, Remaining: 3, ResetAfter: time.Second},
			{At: 200 * ms, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 300 * ms, Cost: 5, Allowed: false, Remaining: 0, RetryAfter: 800 * ms, ResetAfter: 900 * ms},
			{At: 300 * ms, Cost: 11, Allowed: false, Remaining: 0, RetryAfter: 0, ResetAfter: 900 * ms},
			{At: 1100 * ms, Cost: 5, Allowed: true, Remaining: 2, ResetAfter: time.Second},
		}},
		{Name: "sliding window cost above the limit consumes nothing and has no retry time", Strategy: sw(3, time.Second), Steps: []Step{
			{At: 0, Cost: 4, Allowed: false, Remaining: 3, RetryAfter: 0, ResetAfter: 0},
			{At: 0, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: time.Second},
		}},
		{Name: "sliding window clock jumps backwards", Strategy: sw(2, time.Second), Steps: []Step{
			{At: 10 * time.Second, Allowed: true, Remaining: 1, ResetAfter: time.Second},
			{At: 10 * time.Second, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 9 * time.Second, Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: time.Second},
			{At: 11 * time.Second, Allowed: true, Remaining: 1, ResetAfter: time.Second},
		}},
		{Name: "token bucket peek consumes nothing", Strategy: tb(3, 1, time.Second), Steps: []Step{
			{At: 0, Peek: true, Allowed: true, Remaining: 3, ResetAfter: 0},
			{At: 0, Peek: true, Allowed: true, Remaining: 3, ResetAfter: 0},
			{At: 0, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
			{At: 0, Peek: true, Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: 3 * time.Second},
			{At: 500 * ms, Peek: true, Allowed: false, Remaining: 0, RetryAfter: 500 * ms, ResetAfter: 2500 * ms},
			{At: time.Second, Allowed: true, Remaining: 0, ResetAfter: 3 * time.Second},
		}},
		{Name: "token bucket refund moves the arrival time back, clamped to a full bucket", Strategy: tb(10, 10, time.Second), Steps: []Step{
			{At: 0, Refund: 5, Allowed: true, Remaining: 10, ResetAfter: 0},
			{At: 0, Cost: 7, Allowed: true, Remaining: 3, ResetAfter: 700 * ms},
			{At: 0, Refund: 4, Allowed: true, Remaining: 7, ResetAfter: 300 * ms},
			{At: 0, Refund: 100, Allowed: true, Remaining: 10, ResetAfter: 0},
			{At: 0, Cost: 10, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 0, Allowed: false, Remaining: 0, RetryAfter: 100 * ms, ResetAfter: time.Second},
			{At: 50 * ms, Refund: 1, Allowed: true, Remaining: 1, ResetAfter: 850 * ms},
			{At: 50 * ms, Cost: 2, Allowed: false, Remaining: 1, RetryAfter: 50 * ms, ResetAfter: 850 * ms},
			{At: 100 * ms, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: time.Second},
		}},
		{Name: "token bucket refund of a fraction of a token", Strategy: tb(2, 3, time.Second), Steps: []Step{
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 666666667},
			{At: 100 * ms, Refund: 1, Allowed: true, Remaining: 1, ResetAfter: 233333334},
			{At: 100 * ms, Refund: 1, Allowed: true, Remaining: 2, ResetAfter: 0},
		}},
		{Name: "token bucket refund after a swap carries the usage over first", Strategy: tb(10, 1, time.Second), Steps: []Step{
			{At: 0, Cost: 6, Allowed: true, Remaining: 4, ResetAfter: 6 * time.Second, Then: tb(20, 2, time.Second)},
			{At: 0, Refund: 2, Allowed: true, Remaining: 16, ResetAfter: 2 * time.Second},
			{At: 0, Cost: 16, Allowed: true, Remaining: 0, ResetAfter: 10 * time.Second},
		}},
		{Name: "sliding window peek consumes nothing", Strategy: sw(2, time.Second), Steps: []Step{
			{At: 0, Peek: true, Allowed: true, Remaining: 2, ResetAfter: 0},
			{At: 0, Allowed: true, Remaining: 1, ResetAfter: time.Second},
			{At: 200 * ms, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 500 * ms, Peek: true, Allowed: false, Remaining: 0, RetryAfter: 500 * ms, ResetAfter: 700 * ms},
			{At: 1000 * ms, Peek: true, Allowed: true, Remaining: 1, ResetAfter: 200 * ms},
			{At: 1000 * ms, Allowed: true, Remaining: 0, ResetAfter: time.Second},
		}},
		{Name: "sliding window refund forgets the newest units first", Strategy: sw(10, time.Second), Steps: []Step{
			{At: 0, Refund: 3, Allowed: true, Remaining: 10, ResetAfter: 0},
			{At: 0, Cost: 4, Allowed: true, Remaining: 6, ResetAfter: time.Second},
			{At: 100 * ms, Cost: 3, Allowed: true, Remaining: 3, ResetAfter: time.Second},
			{At: 200 * ms, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			// The 3 units of 200ms leave, then 1 of the 3 of 100ms.
			{At: 300 * ms, Refund: 4, Allowed: true, Remaining: 4, ResetAfter: 800 * ms},
			{At: 300 * ms, Cost: 5, Allowed: false, Remaining: 4, RetryAfter: 700 * ms, ResetAfter: 800 * ms},
			{At: 1050 * ms, Cost: 8, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: 1050 * ms, Refund: 100, Allowed: true, Remaining: 10, ResetAfter: 0},
			{At: 1050 * ms, Cost: 10, Allowed: true, Remaining: 0, ResetAfter: time.Second},
		}},
		{Name: "sliding window refund cannot return units that left the window", Strategy: sw(3, time.Second), Steps: []Step{
			{At: 0, Cost: 2, Allowed: true, Remaining: 1, ResetAfter: time.Second},
			{At: 500 * ms, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: time.Second, Refund: 3, Allowed: true, Remaining: 3, ResetAfter: 0},
			{At: time.Second, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: time.Second},
			{At: time.Second, Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: time.Second},
		}},
		{Name: "same parameters keep state across a swap", Strategy: tb(2, 1, time.Second), Steps: []Step{
			{At: 0, Allowed: true, Remaining: 1, ResetAfter: time.Second, Then: tb(2, 1, time.Second)},
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 2 * time.Second},
		}},
		// The usage carries over unclamped: a debt beyond the new capacity waits longer.
		{Name: "token bucket carries usage to new parameters, unclamped", Strategy: tb(10, 1, time.Second), Steps: []Step{
			{At: 0, Cost: 6, Allowed: true, Remaining: 4, ResetAfter: 6 * time.Second, Then: tb(20, 2, time.Second)},
			{At: 0, Allowed: true, Remaining: 13, ResetAfter: 3500 * ms, Then: tb(3, 1, time.Second)},
			{At: 0, Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: 3 * time.Second},
		}},
		// A refund takes its tokens off a debt carried beyond the new capacity, not off a full
		// refill: 10 tokens owed to a bucket of 2, 1 refunded, leave 9 to wait for.
		{Name: "a refund comes off a carried debt beyond the capacity", Strategy: tb(10, 1, time.Second), Steps: []Step{
			{At: 0, Cost: 10, Allowed: true, Remaining: 0, ResetAfter: 10 * time.Second, Then: tb(2, 1, time.Second)},
			{At: 0, Refund: 1, Allowed: false, Remaining: 0, RetryAfter: time.Second, ResetAfter: 2 * time.Second},
			{At: 7500 * ms, Peek: true, Allowed: false, Remaining: 0, RetryAfter: 500 * ms, ResetAfter: 1500 * ms},
			{At: 8 * time.Second, Allowed: true, Remaining: 0, ResetAfter: 2 * time.Second},
		}},
		// Every admission still inside the new window stays, beyond the new limit too.
		{Name: "sliding window carries usage to new parameters, unclamped", Strategy: sw(10, time.Second), Steps: []Step{
			{At: 0, Cost: 3, Allowed: true, Remaining: 7, ResetAfter: time.Second},
			{At: 500 * ms, Cost: 5, Allowed: true, Remaining: 2, ResetAfter: time.Second, Then: sw(6, 2*time.Second)},
			{At: 600 * ms, Allowed: false, Remaining: 0, RetryAfter: 1400 * ms, ResetAfter: 1900 * ms, Then: sw(10, 200*ms)},
			{At: 700 * ms, Cost: 10, Allowed: true, Remaining: 0, ResetAfter: 200 * ms},
		}},
		// A conversion never gives usage back (it used to start fresh, which let two replicas on
		// different algorithms admit every request): the units in use are charged to the new
		// algorithm at the conversion, and a rejection writes nothing, not even a conversion.
		{Name: "a new algorithm is charged the units in use", Strategy: tb(2, 1, time.Minute), Steps: []Step{
			{At: 0, Allowed: true, Remaining: 1, ResetAfter: time.Minute, Then: sw(2, time.Minute)},
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: time.Minute, Then: tb(2, 1, time.Minute)},
			{At: 30 * time.Second, Allowed: false, Remaining: 0, RetryAfter: time.Minute, ResetAfter: 2 * time.Minute},
			{At: 90 * time.Second, Allowed: true, Remaining: 1, ResetAfter: time.Minute, Then: sw(2, time.Minute)},
			{At: 90 * time.Second, Cost: 2, Allowed: false, Remaining: 1, RetryAfter: time.Minute, ResetAfter: time.Minute},
		}},
		{Name: "quota counts in its calendar day and resets at its end", Strategy: qt(3, limiter.PeriodDay, time.UTC), Steps: []Step{
			// T0 is 10:00 UTC: the day ends in 14 hours.
			{At: 0, Allowed: true, Remaining: 2, ResetAfter: 14 * time.Hour},
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 14 * time.Hour},
			{At: time.Hour, Allowed: false, Remaining: 0, RetryAfter: 13 * time.Hour, ResetAfter: 13 * time.Hour},
			{At: time.Hour, Cost: 4, Allowed: false, Remaining: 0, RetryAfter: 0, ResetAfter: 13 * time.Hour},
			{At: 2 * time.Hour, Peek: true, Allowed: false, Remaining: 0, RetryAfter: 12 * time.Hour, ResetAfter: 12 * time.Hour},
			{At: 14*time.Hour - 1, Allowed: false, Remaining: 0, RetryAfter: 1, ResetAfter: 1},
			{At: 14 * time.Hour, Allowed: true, Remaining: 2, ResetAfter: 24 * time.Hour},
			{At: 14 * time.Hour, Cost: 4, Allowed: false, Remaining: 2, RetryAfter: 0, ResetAfter: 24 * time.Hour},
			{At: 14 * time.Hour, Key: "other", Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 24 * time.Hour},
		}},
		{Name: "quota refunds come off the current period only", Strategy: qt(3, limiter.PeriodDay, time.UTC), Steps: []Step{
			{At: 0, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 14 * time.Hour},
			{At: time.Hour, Refund: 2, Allowed: true, Remaining: 2, ResetAfter: 13 * time.Hour},
			{At: time.Hour, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 13 * time.Hour},
			{At: 15 * time.Hour, Refund: 2, Allowed: true, Remaining: 3, ResetAfter: 0},
		}},
		{Name: "quota day in a time zone lasts 23 hours when its clocks spring forward", Strategy: qt(2, limiter.PeriodDay, newYork), Steps: []Step{
			// 14 March 2027 in New York: 00:00 EST (05:00 UTC) to 00:00 EDT (04:00 UTC the next day).
			{At: nyDST + time.Hour, Allowed: true, Remaining: 1, ResetAfter: 22 * time.Hour},
			{At: nyDST + 7*time.Hour, Allowed: true, Remaining: 0, ResetAfter: 16 * time.Hour},
			{At: nyDST + 7*time.Hour, Allowed: false, Remaining: 0, RetryAfter: 16 * time.Hour, ResetAfter: 16 * time.Hour},
			{At: nyDST + 23*time.Hour, Allowed: true, Remaining: 1, ResetAfter: 24 * time.Hour},
		}},
		{Name: "quota conversions never give usage back", Strategy: qt(5, limiter.PeriodMonth, time.UTC), Steps: []Step{
			// December 2026 ends 29 days and 14 hours after T0.
			{At: 0, Cost: 5, Allowed: true, Remaining: 0, ResetAfter: 29*24*time.Hour + 14*time.Hour, Then: qt(3, limiter.PeriodDay, time.UTC)},
			// The month's 5 units, unclamped, count in each day of the month (they may have
			// been used in it): a conversion never gives usage back.
			{At: time.Hour, Allowed: false, Remaining: 0, RetryAfter: 13 * time.Hour, ResetAfter: 13 * time.Hour},
			{At: 14 * time.Hour, Allowed: false, Remaining: 0, RetryAfter: 24 * time.Hour, ResetAfter: 24 * time.Hour,
				Then: qt(8, limiter.PeriodMonth, time.UTC)},
			// Another month's quota carries the count to the month's end.
			{At: 15 * time.Hour, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 29*24*time.Hour - time.Hour},
			{At: 15 * time.Hour, Allowed: false, Remaining: 0, RetryAfter: 29*24*time.Hour - time.Hour, ResetAfter: 29*24*time.Hour - time.Hour},
		}},
		{Name: "quota and other algorithms charge each other the units in use", Strategy: tb(10, 1, time.Second), Steps: []Step{
			{At: 0, Cost: 4, Allowed: true, Remaining: 6, ResetAfter: 4 * time.Second, Then: qt(5, limiter.PeriodDay, time.UTC)},
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 14 * time.Hour, Then: tb(10, 1, time.Second)},
			// The quota's 5 units: 5 tokens' debt.
			{At: 0, Allowed: true, Remaining: 4, ResetAfter: 6 * time.Second, Then: sw(8, time.Minute)},
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: time.Minute, Then: qt(9, limiter.PeriodDay, time.UTC)},
			{At: 0, Cost: 2, Allowed: false, Remaining: 1, RetryAfter: 14 * time.Hour, ResetAfter: 14 * time.Hour},
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 14 * time.Hour, Then: sw(8, time.Minute)},
			{At: 0, Allowed: false, Remaining: 0, RetryAfter: time.Minute, ResetAfter: time.Minute},
		}},
	}
}

// LimitWant is what one limit of a stack must answer in a StackStep: every field of its
// Decision is checked (Limit is the limit's own), except RetryAfter when Allowed and a
// ResetAfter of -1.
type LimitWant struct {
	Allowed    bool
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
}

// StackStep is one decision, peek or refund of a stacked case, and what each limit and the
// stack must answer.
type StackStep struct {
	At   time.Duration // since T0
	Key  string        // default "client"
	Cost int64         // default 1
	// Peek makes the step a peek (Store.Decide of cost 0).
	Peek bool
	// Refund, when positive, makes the step a Store.Refund of that many units.
	Refund int64
	// Single, when set, makes the step a call by the stack of this one limit named
	// limiter.DefaultLimitName instead (the form of a tier of one limit), whose answer must be
	// Limits[0]: the state that a stack's limit of that name shares.
	Single limiter.RateLimiter
	// Allowed and RetryAfter are the stack's answer (RetryAfter checked when rejected); the
	// stack's other fields must be those of its binding limit, Binding.
	Allowed    bool
	RetryAfter time.Duration
	Binding    int
	Limits     []LimitWant
	// Then switches the stack for the following steps (a policy swap).
	Then *limiter.Stack
}

// StackCase is a named sequence of steps with one stack (until a step switches it).
type StackCase struct {
	Name  string
	Stack *limiter.Stack
	Steps []StackStep
}

// Stack returns a stack of the named limits, for tables; it panics on an invalid stack.
func Stack(limits ...any) *limiter.Stack {
	var (
		names []string
		rls   []limiter.RateLimiter
	)
	for i := 0; i+1 < len(limits); i += 2 {
		names = append(names, limits[i].(string))
		rls = append(rls, limits[i+1].(limiter.RateLimiter))
	}
	return must(limiter.NewStack(names, rls))
}

// StackCases returns the conformance table of stacked limits.
func StackCases() []StackCase {
	tb := func(capacity, rate int64, period time.Duration) limiter.RateLimiter {
		return must(limiter.NewTokenBucket(capacity, rate, period))
	}
	sw := func(limit int64, window time.Duration) limiter.RateLimiter {
		return must(limiter.NewSlidingWindow(limit, window))
	}
	const (
		ms = time.Millisecond
		s  = time.Second
	)
	return []StackCase{
		{Name: "admitted only when every limit admits, and a rejection charges no limit",
			Stack: Stack("burst", tb(3, 1, s), "daily", sw(5, 10*s)), Steps: []StackStep{
				{At: 0, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 2, s, 0}, {true, 4, 10 * s, 0}}},
				{At: 0, Cost: 2, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 3 * s, 0}, {true, 2, 10 * s, 0}}},
				// The bucket rejects: the window, which would admit, is not charged.
				{At: 0, Allowed: false, RetryAfter: s, Binding: 0, Limits: []LimitWant{{false, 0, 3 * s, s}, {true, 2, 10 * s, 0}}},
				{At: s, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 3 * s, 0}, {true, 1, 10 * s, 0}}},
				// Both reject: the wait is until both admit, the window's.
				{At: 2 * s, Cost: 2, Allowed: false, RetryAfter: 8 * s, Binding: 1, Limits: []LimitWant{{false, 1, 2 * s, s}, {false, 1, 9 * s, 8 * s}}},
				{At: 10 * s, Cost: 2, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 1, 2 * s, 0}, {true, 2, 10 * s, 0}}},
				// Clients are isolated.
				{At: 10 * s, Key: "other", Cost: 3, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 3 * s, 0}, {true, 2, 10 * s, 0}}},
			}},
		{Name: "a cost above one limit is rejected with no retry time and charges nothing",
			Stack: Stack("burst", tb(3, 1, s), "daily", sw(5, 10*s)), Steps: []StackStep{
				{At: 0, Cost: 4, Allowed: false, RetryAfter: 0, Binding: 0, Limits: []LimitWant{{false, 3, 0, 0}, {true, 5, 0, 0}}},
				{At: 0, Cost: 6, Allowed: false, RetryAfter: 0, Binding: 0, Limits: []LimitWant{{false, 3, 0, 0}, {false, 5, 0, 0}}},
				{At: 0, Cost: 3, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 3 * s, 0}, {true, 2, 10 * s, 0}}},
				// Once the bucket refills, the window's retry time is the stack's; a cost above the
				// bucket's capacity is still never admitted.
				{At: 3 * s, Cost: 3, Allowed: false, RetryAfter: 7 * s, Binding: 1, Limits: []LimitWant{{true, 3, 0, 0}, {false, 2, 7 * s, 7 * s}}},
				{At: 3 * s, Cost: 4, Allowed: false, RetryAfter: 0, Binding: 0, Limits: []LimitWant{{false, 3, 0, 0}, {false, 2, 7 * s, 7 * s}}},
			}},
		{Name: "a peek reads every limit, a refund returns units to every limit, each clamped",
			Stack: Stack("burst", tb(3, 1, s), "daily", sw(5, 10*s)), Steps: []StackStep{
				{At: 0, Peek: true, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 3, 0, 0}, {true, 5, 0, 0}}},
				{At: 0, Refund: 2, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 3, 0, 0}, {true, 5, 0, 0}}},
				{At: 0, Cost: 3, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 3 * s, 0}, {true, 2, 10 * s, 0}}},
				{At: 0, Peek: true, Allowed: false, RetryAfter: s, Binding: 0, Limits: []LimitWant{{false, 0, 3 * s, s}, {true, 2, 10 * s, 0}}},
				{At: 0, Refund: 2, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 2, s, 0}, {true, 4, 10 * s, 0}}},
				{At: 0, Refund: 10, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 3, 0, 0}, {true, 5, 0, 0}}},
				{At: 0, Cost: 3, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 3 * s, 0}, {true, 2, 10 * s, 0}}},
			}},
		{Name: "a rejected stack leaves a sliding window's log exactly as it was",
			Stack: Stack("burst", tb(4, 1, 10*s), "window", sw(5, s)), Steps: []StackStep{
				{At: 0, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 3, 10 * s, 0}, {true, 4, s, 0}}},
				{At: 100 * ms, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 2, 19900 * ms, 0}, {true, 3, s, 0}}},
				{At: 200 * ms, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 1, 29800 * ms, 0}, {true, 2, s, 0}}},
				{At: 300 * ms, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 39700 * ms, 0}, {true, 1, s, 0}}},
				// The window would add to its newest entry: undone.
				{At: 300 * ms, Allowed: false, RetryAfter: 9700 * ms, Binding: 0, Limits: []LimitWant{{false, 0, 39700 * ms, 9700 * ms}, {true, 1, s, 0}}},
				// The window would expire its oldest entry and reuse its slot of the full ring: undone.
				{At: s, Allowed: false, RetryAfter: 9 * s, Binding: 0, Limits: []LimitWant{{false, 0, 39 * s, 9 * s}, {true, 2, 300 * ms, 0}}},
				{At: 1100 * ms, Peek: true, Allowed: false, RetryAfter: 8900 * ms, Binding: 0, Limits: []LimitWant{{false, 0, 38900 * ms, 8900 * ms}, {true, 3, 200 * ms, 0}}},
				{At: 1250 * ms, Peek: true, Allowed: false, RetryAfter: 8750 * ms, Binding: 0, Limits: []LimitWant{{false, 0, 38750 * ms, 8750 * ms}, {true, 4, 50 * ms, 0}}},
				{At: 10 * s, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 40 * s, 0}, {true, 4, s, 0}}},
			}},
		{Name: "limits keep their state by name across a swap, and a new name starts fresh",
			Stack: Stack("burst", tb(3, 1, s), "daily", sw(5, time.Hour)), Steps: []StackStep{
				{At: 0, Cost: 2, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 1, 2 * s, 0}, {true, 3, time.Hour, 0}},
					Then: Stack("daily", sw(5, time.Hour), "hourly", sw(2, time.Hour))},
				{At: 0, Allowed: true, Binding: 1, Limits: []LimitWant{{true, 2, time.Hour, 0}, {true, 1, time.Hour, 0}},
					Then: Stack("burst", tb(3, 1, s), "daily", sw(10, time.Hour))},
				// burst left the stack and came back before its state decayed: it reads it again.
				// daily's usage carries over to its new limit.
				{At: 0, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 3 * s, 0}, {true, 6, time.Hour, 0}},
					Then: Stack("burst", sw(3, time.Hour))},
				// Another algorithm under a name is charged the units in use (3 tokens: a full window).
				{At: 0, Allowed: false, RetryAfter: time.Hour, Binding: 0, Limits: []LimitWant{{false, 0, time.Hour, time.Hour}}},
			}},
		{Name: "the limit named default shares the single-limit state",
			Stack: Stack("default", tb(3, 1, s), "daily", sw(5, time.Hour)), Steps: []StackStep{
				{At: 0, Cost: 2, Single: tb(3, 1, s), Limits: []LimitWant{{true, 1, 2 * s, 0}}},
				{At: 0, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 3 * s, 0}, {true, 4, time.Hour, 0}}},
				{At: 0, Peek: true, Single: tb(3, 1, s), Limits: []LimitWant{{false, 0, 3 * s, s}}},
				{At: 2 * s, Cost: 2, Single: tb(3, 1, s), Limits: []LimitWant{{true, 0, 3 * s, 0}}},
				{At: 2 * s, Allowed: false, RetryAfter: s, Binding: 0, Limits: []LimitWant{{false, 0, 3 * s, s}, {true, 4, time.Hour - 2*s, 0}}},
			}},
		{Name: "a rejected stack keeps the state of a limit whose algorithm changed",
			Stack: Stack("l", tb(2, 1, s)), Steps: []StackStep{
				{At: 0, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 1, s, 0}},
					Then: Stack("l", sw(2, time.Hour), "m", tb(1, 1, time.Hour))},
				// l's bucket is full again: converted, it admits on its own; m rejects.
				{At: 2 * s, Cost: 2, Allowed: false, RetryAfter: 0, Binding: 1, Limits: []LimitWant{{true, 2, 0, 0}, {false, 1, 0, 0}},
					Then: Stack("l", tb(2, 1, s))},
				{At: 2 * s, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 1, s, 0}},
					Then: Stack("l", sw(2, time.Hour), "m", tb(1, 1, time.Hour))},
				// The token in use is charged to the window (a conversion never gives usage back).
				{At: 2 * s, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, time.Hour, 0}, {true, 0, time.Hour, 0}},
					Then: Stack("l", tb(2, 1, s))},
				// And the window's 2 units to the bucket: empty, a token in 1s.
				{At: 2 * s, Allowed: false, RetryAfter: s, Binding: 0, Limits: []LimitWant{{false, 0, 2 * s, s}}},
			}},
		{Name: "a rejected stack does not keep a token bucket's conversion",
			Stack: Stack("b", tb(10, 1, s), "w", sw(10, time.Hour)), Steps: []StackStep{
				// Equally close to exhaustion: the one that takes longer to be whole again binds.
				{At: 0, Cost: 6, Allowed: true, Binding: 1, Limits: []LimitWant{{true, 4, 6 * s, 0}, {true, 4, time.Hour, 0}},
					Then: Stack("b", tb(20, 2, s), "w", sw(10, time.Hour))},
				{At: 0, Cost: 5, Allowed: false, RetryAfter: time.Hour, Binding: 1, Limits: []LimitWant{{true, 14, 3 * s, 0}, {false, 4, time.Hour, time.Hour}}},
				// Converted again at 300ms (5.7 tokens used, exactly), not at 0: a full bucket in 2.85s.
				{At: 300 * ms, Peek: true, Allowed: true, Binding: 1, Limits: []LimitWant{{true, 14, 2850 * ms, 0}, {true, 4, time.Hour - 300*ms, 0}}},
				{At: 300 * ms, Allowed: true, Binding: 1, Limits: []LimitWant{{true, 13, 3350 * ms, 0}, {true, 3, time.Hour, 0}}},
			}},
		{Name: "a quota stacked with a token bucket: all or nothing",
			Stack: Stack("day", must(limiter.NewQuota(3, limiter.PeriodDay, time.UTC)), "rate", tb(2, 1, s)), Steps: []StackStep{
				{At: 0, Allowed: true, Binding: 1, Limits: []LimitWant{{true, 2, 14 * time.Hour, 0}, {true, 1, s, 0}}},
				{At: 0, Allowed: true, Binding: 1, Limits: []LimitWant{{true, 1, 14 * time.Hour, 0}, {true, 0, 2 * s, 0}}},
				// The bucket rejects: the quota, which would admit, is not charged.
				{At: 0, Allowed: false, RetryAfter: s, Binding: 1, Limits: []LimitWant{{true, 1, 14 * time.Hour, 0}, {false, 0, 2 * s, s}}},
				{At: s, Allowed: true, Binding: 0, Limits: []LimitWant{{true, 0, 14*time.Hour - s, 0}, {true, 0, 2 * s, 0}}},
				// The quota rejects: the bucket is not charged.
				{At: 10 * s, Allowed: false, RetryAfter: 14*time.Hour - 10*s, Binding: 0, Limits: []LimitWant{{false, 0, 14*time.Hour - 10*s, 14*time.Hour - 10*s}, {true, 2, 0, 0}}},
				{At: 10 * s, Peek: true, Allowed: false, RetryAfter: 14*time.Hour - 10*s, Binding: 0, Limits: []LimitWant{{false, 0, 14*time.Hour - 10*s, 14*time.Hour - 10*s}, {true, 2, 0, 0}}},
				{At: 14 * time.Hour, Cost: 2, Allowed: true, Binding: 1, Limits: []LimitWant{{true, 1, 24 * time.Hour, 0}, {true, 0, 2 * s, 0}}},
				// Its one limit, as a tier of one limit, shares the state (the quota's name).
				{At: 14 * time.Hour, Single: must(limiter.NewQuota(3, limiter.PeriodDay, time.UTC)), Allowed: true, Limits: []LimitWant{{true, 2, 24 * time.Hour, 0}}},
			}},
	}
}

// Table returns the whole conformance table: the cases of one limit (Cases), each as the stack
// of that limit named limiter.DefaultLimitName, which is how every layer above the stores
// decides a tier of one limit, then the stacked cases (StackCases).
func Table() []StackCase {
	var table []StackCase
	for _, c := range Cases() {
		table = append(table, fromSingle(c))
	}
	return append(table, StackCases()...)
}

// One returns the stack of the single limit rl, named limiter.DefaultLimitName: the form of a
// tier of one limit.
func One(rl limiter.RateLimiter) *limiter.Stack { return Stack(limiter.DefaultLimitName, rl) }

// fromSingle returns a case of one limit as a stacked case.
func fromSingle(c Case) StackCase {
	sc := StackCase{Name: c.Name, Stack: One(c.Strategy)}
	for _, s := range c.Steps {
		step := StackStep{At: s.At, Key: s.Key, Cost: s.Cost, Peek: s.Peek, Refund: s.Refund,
			Allowed: s.Allowed, Limits: []LimitWant{{s.Allowed, s.Remaining, s.ResetAfter, s.RetryAfter}}}
		if !s.Allowed {
			step.RetryAfter = s.RetryAfter
		}
		if s.Then != nil {
			step.Then = One(s.Then)
		}
		sc.Steps = append(sc.Steps, step)
	}
	return sc
}

// Run runs the conformance table (Table) against stores made by newStore, each case on a fresh
// store, through Decide and Refund, then again through DecideBatch: the decisions and peeks of
// a case at one instant, up to a swap, a refund or a Single step, go in one DecideBatch call
// (with a request of another stack on another key between them, so that a batch mixes stacks)
// and must answer what the calls one by one answer. It then checks that a batch interleaving
// keys, stacks and costs (above a capacity, peeks) answers exactly what the same requests
// answer one by one on other keys.
func Run(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	for _, c := range Table() {
		t.Run(c.Name, func(t *testing.T) {
			t.Run("calls", func(t *testing.T) { runCalls(t, newStore(t), c) })
			t.Run("batch", func(t *testing.T) { runBatch(t, newStore(t), c) })
		})
	}
	t.Run("interleaved keys match one-by-one decisions", func(t *testing.T) {
		stacks := []*limiter.Stack{
			One(must(limiter.NewTokenBucket(5, 1, time.Second))),
			One(must(limiter.NewSlidingWindow(4, time.Second))),
			Stack("burst", must(limiter.NewTokenBucket(3, 1, time.Second)), "window", must(limiter.NewSlidingWindow(5, time.Second))),
		}
		var reqs []limiter.Request
		for i := range 60 {
			st := stacks[i%3]
			cost := int64(1 + i%3)
			switch {
			case i%17 == 0:
				cost = 6 // above every capacity: rejected, consumes nothing
			case i%7 == 0:
				cost = 0 // a peek
			}
			reqs = append(reqs, limiter.Request{Key: fmt.Sprintf("k%d-%d", i%3, i%4), Stack: st, Cost: cost,
				Limits: make([]limiter.Decision, st.Len())})
		}
		// One store: the one-by-one decisions go to other keys.
		store := newStore(t)
		out := make([]limiter.Answer, len(reqs))
		store.DecideBatch(context.Background(), reqs, T0, out)
		for i, r := range reqs {
			limits := make([]limiter.Decision, r.Stack.Len())
			want, err := store.Decide(context.Background(), "one-by-one-"+r.Key, r.Stack, T0, r.Cost, limits)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if out[i].Err != nil || out[i].Decision != want || fmt.Sprint(r.Limits) != fmt.Sprint(limits) {
				t.Fatalf("request %d (key %s, cost %d): batch answered %+v %+v (error %v), one by one %+v %+v",
					i, r.Key, r.Cost, out[i].Decision, r.Limits, out[i].Err, want, limits)
			}
		}
	})
}

// refundIDs numbers the refunds the runners make: every refund of a store has its own ID.
var refundIDs atomic.Uint64

// Refund makes a refund of amount units by st through Store.Refund, with an ID of its own: no
// earlier refund's record stands in its way.
func Refund(store limiter.Store, key string, st *limiter.Stack, at time.Time, amount int64, limits []limiter.Decision) (limiter.Decision, error) {
	var id [16]byte
	binary.BigEndian.PutUint64(id[8:], refundIDs.Add(1))
	return store.Refund(context.Background(), limiter.Request{Key: key, Stack: st, Cost: amount, Limits: limits}, at,
		limiter.Once{ID: id, Until: at.Add(time.Hour)})
}

// refundChecked is Refund, for runners that make one call at a time on a key: it also checks
// what the store says each limit gave back (Request.Refunded) against a peek just before the
// refund, at the same instant: the limit's remaining units after it less those before, at most
// the amount.
func refundChecked(t *testing.T, step int, store limiter.Store, key string, st *limiter.Stack, at time.Time, amount int64, limits []limiter.Decision) (limiter.Decision, error) {
	t.Helper()
	before := make([]limiter.Decision, st.Len())
	if _, err := store.Decide(context.Background(), key, st, at, 0, before); err != nil {
		t.Fatalf("step %d: peek before the refund: %v", step, err)
	}
	after := limits
	if after == nil {
		after = make([]limiter.Decision, st.Len())
	}
	refunded := make([]int64, st.Len())
	for i := range refunded {
		refunded[i] = -1 // the store must write every limit's
	}
	var id [16]byte
	binary.BigEndian.PutUint64(id[8:], refundIDs.Add(1))
	d, err := store.Refund(context.Background(), limiter.Request{Key: key, Stack: st, Cost: amount, Limits: after, Refunded: refunded}, at,
		limiter.Once{ID: id, Until: at.Add(time.Hour)})
	if err != nil {
		return d, err
	}
	for i := range refunded {
		if want := after[i].Remaining - before[i].Remaining; refunded[i] != want || refunded[i] < 0 || refunded[i] > amount {
			t.Errorf("step %d: refund of %d, limit %d: refunded %d, want %d (remaining %d before, %d after)",
				step, amount, i, refunded[i], want, before[i].Remaining, after[i].Remaining)
		}
	}
	return d, nil
}

// stepStack returns the stack a step decides by, and the step as checked: a Single step decides
// by the stack of its one limit and answers as that limit.
func stepStack(st *limiter.Stack, s StackStep) (*limiter.Stack, StackStep) {
	if s.Single == nil {
		return st, s
	}
	l := s.Limits[0]
	s.Allowed, s.RetryAfter, s.Binding = l.Allowed, 0, 0
	if !l.Allowed {
		s.RetryAfter = l.RetryAfter
	}
	return One(s.Single), s
}

// runCalls runs a case through Decide and Refund, one call a step.
func runCalls(t *testing.T, store limiter.Store, c StackCase) {
	st := c.Stack
	for i, s := range c.Steps {
		stepSt, s := stepStack(st, s)
		key, cost := stackStepKey(s)
		limits := make([]limiter.Decision, stepSt.Len())
		var (
			got limiter.Decision
			err error
			op  = "decide"
		)
		if s.Refund > 0 {
			got, err = refundChecked(t, i, store, key, stepSt, T0.Add(s.At), s.Refund, limits)
			op = "refund"
		} else {
			if s.Peek {
				op = "peek"
			}
			got, err = store.Decide(context.Background(), key, stepSt, T0.Add(s.At), cost, limits)
		}
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, op, err)
		}
		checkStackStep(t, i, s, stepSt, got, limits, fmt.Sprintf("%s, key %s, cost %d", op, key, cost))
		if s.Then != nil {
			st = s.Then
		}
	}
}

// runBatch runs a case through DecideBatch (see Run).
func runBatch(t *testing.T, store limiter.Store, c StackCase) {
	filler := Stack("filler", must(limiter.NewTokenBucket(100, 1, time.Second)))
	st := c.Stack
	var (
		reqs  []limiter.Request
		steps []int // the steps of reqs; -1 for a filler
		sts   []*limiter.Stack
	)
	flush := func() {
		t.Helper()
		if len(reqs) == 0 {
			return
		}
		out := make([]limiter.Answer, len(reqs))
		at := c.Steps[steps[0]].At
		store.DecideBatch(context.Background(), reqs, T0.Add(at), out)
		for j, a := range out {
			if a.Err != nil {
				t.Fatalf("item %d of %d: %v", j, len(reqs), a.Err)
			}
			if steps[j] < 0 {
				continue
			}
			_, s := stepStack(st, c.Steps[steps[j]])
			checkStackStep(t, steps[j], s, sts[j], a.Decision, reqs[j].Limits,
				fmt.Sprintf("item %d of %d, key %s, cost %d", j, len(reqs), reqs[j].Key, reqs[j].Cost))
		}
		reqs, steps, sts = reqs[:0], steps[:0], sts[:0]
	}
	for i, s := range c.Steps {
		if len(steps) > 0 && c.Steps[steps[0]].At != s.At {
			flush()
		}
		stepSt, checked := stepStack(st, s)
		key, cost := stackStepKey(s)
		switch {
		case s.Single != nil:
			flush()
			limits := make([]limiter.Decision, 1)
			var d limiter.Decision
			var err error
			if s.Refund > 0 {
				d, err = refundChecked(t, i, store, key, stepSt, T0.Add(s.At), s.Refund, limits)
			} else {
				d, err = store.Decide(context.Background(), key, stepSt, T0.Add(s.At), cost, limits)
			}
			if err != nil {
				t.Fatalf("step %d (single limit): %v", i, err)
			}
			checkStackStep(t, i, checked, stepSt, d, limits, "single limit")
		case s.Refund > 0:
			flush()
			limits := make([]limiter.Decision, st.Len())
			d, err := refundChecked(t, i, store, key, st, T0.Add(s.At), s.Refund, limits)
			if err != nil {
				t.Fatalf("step %d (refund): %v", i, err)
			}
			checkStackStep(t, i, s, st, d, limits, "refund")
		default:
			reqs = append(reqs,
				limiter.Request{Key: key, Stack: st, Cost: cost, Limits: make([]limiter.Decision, st.Len())},
				limiter.Request{Key: "filler-" + key, Stack: filler, Cost: 1})
			steps, sts = append(steps, i, -1), append(sts, st, nil)
		}
		if s.Then != nil {
			flush()
			st = s.Then
		}
	}
	flush()
}

// stackStepKey returns a step's key and cost, defaulted.
func stackStepKey(s StackStep) (string, int64) {
	key, cost := s.Key, s.Cost
	if key == "" {
		key = "client"
	}
	if s.Peek {
		cost = 0
	} else if cost == 0 {
		cost = 1
	}
	return key, cost
}

// expected returns the decision a step of the tables expects of a strategy of the given limit:
// a retry time only for a rejection.
func expected(allowed bool, limit, remaining int64, resetAfter, retryAfter time.Duration) limiter.Decision {
	d := limiter.Decision{Allowed: allowed, Limit: limit, Remaining: remaining, ResetAfter: resetAfter}
	if !allowed {
		d.RetryAfter = retryAfter
	}
	return d
}

// checkStackStep checks what a store answered for a step of a stacked case: the limits'
// decisions, and the stack's decision combined from them.
func checkStackStep(t *testing.T, i int, s StackStep, st *limiter.Stack, got limiter.Decision, limits []limiter.Decision, detail string) {
	t.Helper()
	want := make([]limiter.Decision, len(s.Limits))
	if len(s.Limits) != st.Len() {
		t.Fatalf("step %d: the table gives %d limits for a stack of %d", i, len(s.Limits), st.Len())
	}
	for j, l := range s.Limits {
		want[j] = expected(l.Allowed, st.Limiter(j).Limit(), l.Remaining, l.ResetAfter, l.RetryAfter)
		if l.ResetAfter < 0 {
			want[j].ResetAfter, limits[j].ResetAfter = 0, 0
		}
		if limits[j] != want[j] {
			t.Fatalf("step %d (%s at t0+%v), limit %q:\n got  %+v\n want %+v", i, detail, s.At, st.Name(j), limits[j], want[j])
		}
	}
	wantStack, binding := limiter.Combine(want)
	if binding != s.Binding || wantStack.Allowed != s.Allowed || !s.Allowed && wantStack.RetryAfter != s.RetryAfter {
		t.Fatalf("step %d: the table's stack answer (allowed %t, retry %v, binding %d) is not what Combine makes of its limits (%t, %v, %d)",
			i, s.Allowed, s.RetryAfter, s.Binding, wantStack.Allowed, wantStack.RetryAfter, binding)
	}
	if got.ResetAfter != wantStack.ResetAfter && s.Limits[binding].ResetAfter < 0 {
		got.ResetAfter = wantStack.ResetAfter
	}
	if got != wantStack {
		t.Fatalf("step %d (%s at t0+%v), the stack:\n got  %+v\n want %+v", i, detail, s.At, got, wantStack)
	}
}

// concurrentStacks are the stacks RunConcurrent and RunRefundRace race on: a token bucket and a
// sliding window of capacity limit, each alone (a tier of one limit), and both stacked (the
// window a half larger, so that either may bind).
func concurrentStacks(limit int64) map[string]*limiter.Stack {
	tb := must(limiter.NewTokenBucket(limit, 1, time.Hour))
	return map[string]*limiter.Stack{
		"TokenBucket":   One(tb),
		"SlidingWindow": One(must(limiter.NewSlidingWindow(limit, time.Hour))),
		"Stack":         Stack("burst", tb, "daily", must(limiter.NewSlidingWindow(limit+limit/2, time.Hour))),
	}
}

// RunConcurrent checks that racing decisions on one key admit exactly what a serial run admits,
// and the all-or-nothing rule of a stack under races: workers goroutines each decide perWorker
// times at one instant (nothing refills), with costs of 1 to 3, on one client of each of
// concurrentStacks, refunding one unit of every third admission. Whatever the interleaving, the
// units held (admitted costs minus refunds) never exceed limit, and each limit's remaining
// allowance is exactly its limit minus the units held: a stack that charged one limit and not
// the other would leave them apart.
func RunConcurrent(t *testing.T, store limiter.Store, workers, perWorker int, limit int64) {
	ctx := context.Background()
	for name, st := range concurrentStacks(limit) {
		t.Run(name, func(t *testing.T) {
			key := "race-" + name
			held, admitted, rejected := race(t, store, key, st, workers, perWorker, func() time.Time { return T0 })
			if held > limit || held < 0 {
				t.Fatalf("%d units held after %d admissions, limit %d", held, admitted, limit)
			}
			if rejected == 0 {
				t.Fatalf("no request was rejected: the race did not reach the limit")
			}
			limits := make([]limiter.Decision, st.Len())
			if _, err := store.Decide(ctx, key, st, T0, 0, limits); err != nil {
				t.Fatal(err)
			}
			for j := range st.Len() {
				if want := st.Limiter(j).Limit() - held; limits[j].Remaining != want {
					t.Fatalf("%d units held after %d admissions: limit %q says %d remaining, want %d",
						held, admitted, st.Name(j), limits[j].Remaining, want)
				}
			}
			t.Logf("%d workers: %d admitted, %d rejected, %d units held of %d", workers, admitted, rejected, held, limit)
		})
	}
}

// RunConcurrentMovingClock is RunConcurrent with the clock moving, so that refills and window
// expiries race the decisions: every decision takes the next instant of a shared clock that
// advances by one step per decision (workers may reach the store slightly out of that order, as
// replicas do), and the run lasts about two full refills. Whatever the interleaving, the units
// held (admitted costs minus refunds) never exceed what each limit allows over the elapsed time:
// a token bucket its capacity plus its refill, a sliding window its limit in each window the run
// touches. And more than limit units must have been admitted: refills were used.
func RunConcurrentMovingClock(t *testing.T, store limiter.Store, workers, perWorker int, limit int64) {
	decisions := int64(workers * perWorker)
	step := 2 * time.Duration(limit) * movingRefill / time.Duration(decisions)
	// One clock for the three stacks, which never goes back: a store's refund records refuse a
	// refund much older than the newest instant they have seen.
	var tick atomic.Int64
	for name, st := range movingClockStacks(limit) {
		t.Run(name, func(t *testing.T) {
			start := tick.Load()
			next := func() time.Time { return T0.Add(time.Duration(tick.Add(1)) * step) }
			// A key of its own for every run: a store that outlives a run (Redis, go test -count)
			// keeps the states of the last, whose clock ran ahead of this one's.
			key := fmt.Sprintf("moving-%s-%d", name, movingRuns.Add(1))
			held, admitted, rejected := race(t, store, key, st, workers, perWorker, next)
			elapsed := time.Duration(tick.Load()-start) * step
			allowed := int64(math.MaxInt64) // the least any limit allows
			for j := range st.Len() {
				var bound int64
				switch l := st.Limiter(j).(type) {
				case *limiter.TokenBucket:
					bound = l.Limit() + int64(elapsed/movingRefill)
				case *limiter.SlidingWindow:
					bound = l.Limit() * (int64(elapsed/(time.Duration(limit)*movingRefill)) + 1)
				default:
					t.Fatalf("limit %q: no bound for %T", st.Name(j), l)
				}
				if held > bound {
					t.Fatalf("%d units held after %d admissions over %v: limit %q allows %d", held, admitted, elapsed, st.Name(j), bound)
				}
				allowed = min(allowed, bound)
			}
			if held <= limit || rejected == 0 {
				t.Fatalf("%d units held, %d rejected over %v: the run did not use refills and reach the limit (limit %d)",
					held, rejected, elapsed, limit)
			}
			t.Logf("%d workers over %v: %d admitted, %d rejected, %d units held of %d allowed", workers, elapsed, admitted, rejected, held, allowed)
		})
	}
}

// movingRuns numbers the runs of RunConcurrentMovingClock in this process.
var movingRuns atomic.Uint64

// movingRefill is how often the stacks of RunConcurrentMovingClock give back one unit: a token
// bucket refills 1 per movingRefill, and a sliding window of limit spans limit*movingRefill.
const movingRefill = time.Second

// movingClockStacks are the stacks RunConcurrentMovingClock races on: a token bucket of capacity
// limit refilled by 1 every movingRefill, a sliding window of limit over limit*movingRefill, each
// alone, and both stacked (the window a half larger, so that either may bind).
func movingClockStacks(limit int64) map[string]*limiter.Stack {
	tb := must(limiter.NewTokenBucket(limit, 1, movingRefill))
	window := time.Duration(limit) * movingRefill
	return map[string]*limiter.Stack{
		"TokenBucket":   One(tb),
		"SlidingWindow": One(must(limiter.NewSlidingWindow(limit, window))),
		"Stack":         Stack("burst", tb, "daily", must(limiter.NewSlidingWindow(limit+limit/2, window))),
	}
}

// race runs workers goroutines that each decide perWorker times on key at the instants at
// returns, with costs of 1 to 3, refunding one unit of every third admission (at the next
// instant). It returns the units held (admitted costs minus refunds), the admissions and the
// rejections, and fails t if any call failed.
func race(t *testing.T, store limiter.Store, key string, st *limiter.Stack, workers, perWorker int, at func() time.Time) (held, admitted int64, rejected int) {
	t.Helper()
	ctx := context.Background()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for w := range workers {
		wg.Go(func() {
			var h, a int64
			var r int
			limits := make([]limiter.Decision, st.Len())
			for i := range perWorker {
				cost := int64(1 + (w+i)%3)
				d, err := store.Decide(ctx, key, st, at(), cost, limits)
				if err != nil {
					fail(err)
					return
				}
				if !d.Allowed {
					r++
					continue
				}
				h += cost
				a++
				if a%3 != 0 {
					continue
				}
				// This worker holds the units it was just admitted: the refund returns one to each limit.
				switch _, err := Refund(store, key, st, at(), 1, limits); {
				case errors.Is(err, limiter.ErrRefundTooLate):
					// Behind the newest instant by more than the records keep (a worker that
					// lagged while the clock moved): nothing was refunded.
				case err != nil:
					fail(err)
					return
				default:
					h--
				}
			}
			mu.Lock()
			held, admitted, rejected = held+h, admitted+a, rejected+r
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d calls failed, the first: %v", len(errs), errs[0])
	}
	return held, admitted, rejected
}
