package limiter

import (
	"sort"
	"time"
)

// SlidingWindow is a hard cap: in any half-open interval [t, t+Window) it admits at most Limit
// units. A request of cost n is admitted if the units admitted in (now-window, now] plus n are
// at most the limit.
//
// A client's state is the log of its admissions still inside the window: one 16-byte entry per
// distinct admitted instant (nanosecond), so at most 16*limit bytes, plus a 64-byte header.
// Entries carry the running total of admitted units, so a decision is amortised O(1) (expired
// entries are dropped once each) and the retry time is a binary search.
//
// A clock that jumps backwards is treated as standing still at the latest instant seen for
// that client, so the log stays ordered and no more than the limit is ever admitted.
//
// A SlidingWindow is immutable and safe for concurrent use; build one with NewSlidingWindow.
type SlidingWindow struct {
	stamp
	limit  int64
	window int64 // ns
}

type slidingWindowParams struct {
	limit  int64
	window time.Duration
}

// NewSlidingWindow returns the sliding window strategy for the given parameters. It fails if
// limit is outside [1, 100000] or window outside [1ms, 24h].
func NewSlidingWindow(limit int64, window time.Duration) (*SlidingWindow, error) {
	if err := checkPositive("limit", limit, MaxWindowLimit); err != nil {
		return nil, err
	}
	if err := checkPeriod("window", window); err != nil {
		return nil, err
	}
	return intern(slidingWindowParams{limit, window}, func(id uint64) *SlidingWindow {
		w := &SlidingWindow{limit: limit, window: int64(window)}
		w.stamp = stamp{rl: w, id: id}
		return w
	}), nil
}

// windowLog is a ring of admissions, oldest first.
type windowLog struct {
	entries []admission // ring buffer; len is a power of two or 0
	head    int         // index of the oldest entry
	n       int         // number of entries
	base    int64       // running total just before the oldest entry
}

// admission is one admitted instant and the running total of units admitted up to it.
type admission struct {
	at  int64
	cum int64
}

func (l *windowLog) at(i int) *admission { return &l.entries[(l.head+i)&(len(l.entries)-1)] }

func (l *windowLog) last() *admission { return l.at(l.n - 1) }

// used returns the units admitted by the entries in the log.
func (l *windowLog) used() int64 {
	if l == nil || l.n == 0 {
		return 0
	}
	return l.last().cum - l.base
}

// expire drops the entries that left the window at now.
func (l *windowLog) expire(now, window int64) {
	for l.n > 0 && l.at(0).at+window <= now {
		l.base = l.at(0).cum
		l.head = (l.head + 1) & (len(l.entries) - 1)
		l.n--
	}
}

func (l *windowLog) push(at, cost int64) {
	if l.n > 0 && l.last().at == at {
		l.last().cum += cost
		return
	}
	if l.n == len(l.entries) {
		grown := make([]admission, max(2, 2*len(l.entries)))
		for i := 0; i < l.n; i++ {
			grown[i] = *l.at(i)
		}
		l.entries, l.head = grown, 0
	}
	cum := l.base + cost
	if l.n > 0 {
		cum = l.last().cum + cost
	}
	l.n++
	*l.last() = admission{at: at, cum: cum}
}

// unpush forgets the newest n units of the log, dropping the entries they emptied.
func (l *windowLog) unpush(n int64) {
	for n > 0 && l.n > 0 {
		last, prev := l.last(), l.base
		if l.n > 1 {
			prev = l.at(l.n - 2).cum
		}
		units := last.cum - prev
		if units > n {
			last.cum -= n
			return
		}
		n -= units
		l.n--
	}
}

// clamp returns the instant a decision at now happens at for this log: never before its newest
// entry (a clock that stepped backwards).
func (l *windowLog) clamp(now int64) int64 {
	if l != nil && l.n > 0 && l.last().at > now {
		return l.last().at
	}
	return now
}

// Decide implements RateLimiter.
func (w *SlidingWindow) Decide(s *State, now time.Time, cost int64) Decision {
	t := now.UnixNano()
	adopt(&w.stamp, s, t)
	t = s.log.clamp(t)
	if s.log != nil {
		s.log.expire(t, w.window)
	}
	used := s.log.used()
	if cost > w.limit || used+cost > w.limit {
		return w.decision(s.log, t, used, cost, false)
	}
	if s.log == nil {
		s.log = &windowLog{}
	}
	s.log.push(t, cost)
	s.stamp = &w.stamp
	return w.decision(s.log, t, used+cost, cost, true)
}

// decision describes the log after a decision at t; used counts the units in the window.
func (w *SlidingWindow) decision(l *windowLog, t, used, cost int64, allowed bool) Decision {
	d := Decision{Allowed: allowed, Limit: w.limit, Remaining: max(0, w.limit-used)}
	if used == 0 {
		return d
	}
	d.ResetAfter = time.Duration(l.last().at + w.window - t)
	if allowed {
		return d
	}
	if cost > w.limit {
		return d // never admitted: no retry time
	}
	// The request fits once the oldest entries holding (used+cost-limit) units have expired:
	// find the first entry whose running total reaches that.
	need := l.base + used + cost - w.limit
	i := sort.Search(l.n, func(i int) bool { return l.at(i).cum >= need })
	d.RetryAfter = time.Duration(l.at(i).at + w.window - t)
	return d
}

// Peek implements RateLimiter.
func (w *SlidingWindow) Peek(s *State, now time.Time) Decision {
	t := now.UnixNano()
	if s.stamp != &w.stamp && s.stamp != nil {
		c := *s
		if c.log != nil { // carryFrom changes the log in place: work on a copy
			cp := *c.log
			cp.entries = append([]admission(nil), c.log.entries...)
			c.log = &cp
		}
		convert(w, &c, t)
		s = &c
	}
	t = s.log.clamp(t)
	used := int64(0)
	if s.log != nil {
		// Count the units still in the window without dropping the expired entries.
		i := sort.Search(s.log.n, func(i int) bool { return s.log.at(i).at+w.window > t })
		base := s.log.base
		if i > 0 {
			base = s.log.at(i - 1).cum
		}
		used = s.log.used() - (base - s.log.base)
		view := windowLog{entries: s.log.entries, head: (s.log.head + i) & (len(s.log.entries) - 1), n: s.log.n - i, base: base}
		return w.decision(&view, t, used, 1, used+1 <= w.limit)
	}
	return w.decision(nil, t, used, 1, true)
}

// Refund implements RateLimiter: the newest amount units admitted inside the window leave it
// first, so that a reservation refunded at once leaves the log as if it had been smaller.
func (w *SlidingWindow) Refund(s *State, now time.Time, amount int64) Decision {
	t := now.UnixNano()
	adopt(&w.stamp, s, t)
	if s.log == nil {
		return w.decision(nil, t, 0, 1, true)
	}
	t = s.log.clamp(t)
	s.log.expire(t, w.window)
	s.log.unpush(amount)
	used := s.log.used()
	return w.decision(s.log, t, used, 1, used+1 <= w.limit)
}

// Fresh implements RateLimiter: the window holds no admission.
func (w *SlidingWindow) Fresh(s *State, now time.Time) bool {
	return s.log == nil || s.log.n == 0 || s.log.last().at+w.window <= now.UnixNano()
}

// carryFrom converts a state written by another sliding window (the rule for parameter
// changes: a conversion never gives usage back): every admission still inside the new window
// stays, however many units they hold; units beyond the new limit just keep the client waiting
// until they leave the window.
func (w *SlidingWindow) carryFrom(s *State, now int64) {
	s.stamp = &w.stamp
	if l := s.log; l != nil {
		l.expire(l.clamp(now), w.window)
	}
}

// usedUnits returns the units admitted inside the window at now (another algorithm carries
// them over), without changing the log.
func (w *SlidingWindow) usedUnits(s *State, now int64) int64 {
	l := s.log
	if l == nil || l.n == 0 {
		return 0
	}
	t := l.clamp(now)
	i := sort.Search(l.n, func(i int) bool { return l.at(i).at+w.window > t })
	if i == l.n {
		return 0
	}
	if i == 0 {
		return l.used()
	}
	return l.last().cum - l.at(i-1).cum
}

// chargeUnits sets s to a window of w holding u units admitted at now: another algorithm's
// usage carried over, held for a whole window from the conversion.
func (w *SlidingWindow) chargeUnits(s *State, now, u int64) {
	*s = State{stamp: &w.stamp}
	if u > 0 {
		s.log = &windowLog{}
		s.log.push(now, u)
	}
}

// Algorithm implements RateLimiter.
func (w *SlidingWindow) Algorithm() Algorithm { return AlgorithmSlidingWindow }

// Limit implements RateLimiter.
func (w *SlidingWindow) Limit() int64 { return w.limit }

// Window implements RateLimiter.
func (w *SlidingWindow) Window() time.Duration { return time.Duration(w.window) }

// IsFresh reports whether s has decayed back to the state of a client never seen, judged by the
// strategy that wrote it. A store uses it to drop idle clients.
func IsFresh(s *State, now time.Time) bool {
	return s.stamp == nil || s.stamp.rl.Fresh(s, now)
}
