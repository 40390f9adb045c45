package limiter

import "time"

// This file gives shared stores (package store/redis) what they need to keep a strategy's state
// outside process memory and still decide with the code above: a strategy's parameters, the
// exact intervals a server-side script compares, and a token bucket's State built from, or read
// as, its raw theoretical arrival time.

// Params returns the parameters the token bucket was built from.
func (b *TokenBucket) Params() (capacity, refillRate int64, refillPeriod time.Duration) {
	return b.capacity, int64(b.rate), time.Duration(b.period)
}

// Interval returns how long n tokens take to accrue, n*refillPeriod/refillRate, exactly: ns
// whole nanoseconds plus frac/refillRate ns, with frac < refillRate. n must be between 0 and the
// capacity; Interval(capacity) is a full refill.
func (b *TokenBucket) Interval(n int64) (ns int64, frac uint64) {
	d := mulDiv(uint64(n), b.period, b.rate)
	return d.ns, d.frac
}

// StateAt returns the State that b keeps for a client whose bucket is full again at the
// theoretical arrival time tat Unix nanoseconds plus frac/refillRate ns (frac < refillRate):
// the state b.Decide, Peek and Fresh read, and that another token bucket converts.
func (b *TokenBucket) StateAt(tat int64, frac uint64) State {
	return State{stamp: &b.stamp, tat: tat, frac: uint32(frac)}
}

// TAT returns the theoretical arrival time of a state last written by a token bucket: Unix
// nanoseconds plus frac/refillRate ns of that bucket. A fresh state returns 0, 0.
func (s *State) TAT() (tat int64, frac uint64) { return s.tat, uint64(s.frac) }

// Params returns the parameters the sliding window was built from.
func (w *SlidingWindow) Params() (limit int64, window time.Duration) {
	return w.limit, time.Duration(w.window)
}

// Convert returns the state b decides on at now for a client whose state s another token bucket
// wrote: its usage carried over by the rule for parameter changes (a state b wrote, or a fresh
// one, is returned as it is). A shared store converts a state so before deciding on it.
func (b *TokenBucket) Convert(s State, now time.Time) State {
	adopt(&b.stamp, &s, now.UnixNano())
	return s
}

// UsedUnits returns the units the strategy that wrote s counts as used at now, a started token
// counting as used (0 for a fresh state): what another algorithm is charged when it converts s,
// by the rule for parameter changes. A shared store that keeps each algorithm's state in its own
// form converts so between them.
func UsedUnits(s State, now time.Time) int64 {
	if s.stamp == nil {
		return 0
	}
	return usedUnits(&s, now.UnixNano())
}

// Charged returns the state b decides on at now for a client that another algorithm's state
// had charged units units at now (UsedUnits): a debt of their refill time, unclamped (capped at
// MaxRefillWindow), as b converts that state itself.
func (b *TokenBucket) Charged(units int64, now time.Time) State {
	var s State
	b.chargeUnits(&s, now.UnixNano(), units)
	return s
}

// Period returns the start and the end, Unix seconds, of q's period that holds now: start <=
// now < end. A shared store computes them so and passes them to its script, which counts in
// the period without a time zone database.
func (q *Quota) Period(now time.Time) (start, end int64) {
	return q.bounds(floorSeconds(now.UnixNano()))
}

// StateAt returns the State that q keeps for a client that used used units (at most
// MaxQuotaLimit) in the period that ends at end Unix nanoseconds: the state q.Decide, Peek,
// Refund and Fresh read, and that another strategy converts. Its TAT is end, used.
func (q *Quota) StateAt(end, used int64) State {
	return State{stamp: &q.stamp, tat: end, frac: uint32(min(max(used, 0), MaxQuotaLimit))}
}

// Convert returns the state q decides on at now for a client whose state s another strategy
// wrote: its usage carried over by the rule for parameter changes (another quota's count
// carried, another algorithm's used units charged; a state q wrote, or a fresh one, is
// returned as it is). A shared store converts a state so before deciding on it.
func (q *Quota) Convert(s State, now time.Time) State {
	adopt(&q.stamp, &s, now.UnixNano())
	return s
}
