package limiter

import (
	"sort"
	"sync/atomic"
	"time"
)

// Concurrency admits at most Limit places of a client in flight at once: a rate says how
// often, a concurrency limit how many at a time, which is what protects a slow backend from
// one client. A decision of cost n that it admits takes n places, held by a lease; the lease
// ends when it is released (Store.Refund with Once.Op OpRelease) or when its timeout passes,
// so that a caller that crashed holds no place for ever; its holder may extend it (OpExtend).
//
// # State
//
// A client's state is its leases: a ring of entries sorted by expiry, each a lease's expiry
// (Unix ns), places and seq, 24 bytes an entry, plus a 64-byte header. The seq names the
// lease (Decision.Lease): it comes from a counter of the process, so no two leases share one,
// not even leases of one client admitted at one instant. The places held at now are those of
// the entries expiring after now. A decision of cost n at now drops the entries that have
// expired, admits when held + n <= limit, and adds an entry of n places expiring at
// now+leaseTimeout: an append, since expiries grow with the clock. So at most limit entries
// are live after a decision (each holds a place at least): a client costs at most
// 24*limit bytes, rounded up to a power of two, and limit is bounded (MaxConcurrencyLimit).
// A cost of 0 is a peek: whether one place is free, taking none.
//
// Releasing the lease issued at instant t named seq (Once.Issued and Once.Lease) removes its
// entry, expiring at t+leaseTimeout, if the lease has not expired, and frees its places. The
// entry is the lease's record: a lease released, extended, expired or dropped (a reset) has
// none, so a second release or a replay finds nothing, frees nothing and answers ErrRefunded,
// and a lease admitted later at the same instant, whose entry has the same expiry, has another
// seq. So a release applies once per lease with no record beside the state: the record lives
// exactly as long as the lease, and costs what its entry does. An extension moves the lease's
// places to a new entry expiring at now+leaseTimeout, under a new seq (the extended lease is a
// new one, issued at now). Neither ever frees more than the lease holds, so the places held
// never fall below those of the live leases that were not released.
//
// In a stack, a concurrency limit is decided with the others all or nothing: a rejection by a
// rate limit takes no place, and a rejection by a concurrency limit charges no rate. A refund
// gives no place back (Refund changes nothing: places come back by release or expiry only), and
// a release or an extension touches the stack's concurrency limits only, never a rate.
//
// A clock that steps backwards moves no expiry: a lease admitted then expires at that earlier
// now+leaseTimeout (placed in the order), the leases admitted before keep theirs, and an entry
// dropped once its expiry passed stays dropped, since it no longer held a place.
//
// A Concurrency is immutable and safe for concurrent use; build one with NewConcurrency.
type Concurrency struct {
	stamp
	limit   int64
	timeout int64 // ns
}

type concurrencyParams struct {
	limit        int64
	leaseTimeout time.Duration
}

// NewConcurrency returns the concurrency strategy for the given parameters. It fails if limit is
// outside [1, MaxConcurrencyLimit] or leaseTimeout outside [MinPeriod, MaxPeriod].
func NewConcurrency(limit int64, leaseTimeout time.Duration) (*Concurrency, error) {
	if err := checkPositive("limit", limit, MaxConcurrencyLimit); err != nil {
		return nil, err
	}
	if err := checkPeriod("leaseTimeout", leaseTimeout); err != nil {
		return nil, err
	}
	return intern(concurrencyParams{limit, leaseTimeout}, func(id uint64) *Concurrency {
		c := &Concurrency{limit: limit, timeout: int64(leaseTimeout)}
		c.stamp = stamp{rl: c, id: id}
		return c
	}), nil
}

// Params returns the parameters the concurrency limit was built from.
func (c *Concurrency) Params() (limit int64, leaseTimeout time.Duration) {
	return c.limit, time.Duration(c.timeout)
}

// leaseSet is a client's leases: a ring of entries sorted by expiry, oldest first.
type leaseSet struct {
	entries []leaseEntry // ring buffer; len is a power of two or 0
	head    int          // index of the earliest entry
	n       int          // number of entries
	held    int64        // places of every entry, expired ones included until trimmed
	stats   *LeaseStats  // counts the leases of the set's entries (nil: none counts them)
}

// LeaseStats counts the leases of one stack's concurrency limits in a memory store, for
// metrics: those held, and those that expired without a release. A lease counts once, on the
// stack's concurrency limit of the shortest lease timeout (the one its expiry is that of,
// Stack.LeaseExpiry); places carried over from another algorithm are no lease and never count.
//
//   - Held: the leases taken and not yet ended. A lease ends when it is released or extended
//     (the extended lease is then held), or when its entry is dropped: once its expiry passed,
//     by its client's next decision, release or extension or by Memory.Sweep, or at once by a
//     reset, an eviction or a change of algorithm. So a lease past its timeout is counted held
//     until one of those: at most a sweep interval.
//   - Expired: the leases whose entry was dropped after their expiry passed, never released:
//     each is a caller that crashed, leaked it, or worked past its timeout without extending.
//     Counted when the entry is dropped, as above, not at the instant of the expiry.
//
// The counts cost an atomic add per lease taken or ended, none per decision otherwise. A
// LeaseStats is safe for concurrent use; the zero value counts from zero.
type LeaseStats struct {
	held    atomic.Int64
	expired atomic.Uint64
}

// Held returns the leases held, as defined above.
func (s *LeaseStats) Held() int64 { return s.held.Load() }

// Expired returns the leases that expired without a release, as defined above.
func (s *LeaseStats) Expired() uint64 { return s.expired.Load() }

// count moves the count of the set's leases to stats (nil: leaves it where it is): a stack's
// counting limit took a lease of a set that another stack, or none, counted.
func (l *leaseSet) count(stats *LeaseStats) {
	if stats != nil && l.stats != stats { // inlined: the common case is one comparison
		l.recount(stats)
	}
}

// recount is count's move of the counts to another LeaseStats: out of line, so that count is
// inlined.
//
//go:noinline
func (l *leaseSet) recount(stats *LeaseStats) {
	if k := l.leases(); k > 0 {
		if l.stats != nil {
			l.stats.held.Add(-k)
		}
		stats.held.Add(k)
	}
	l.stats = stats
}

// leases returns how many of the set's entries are leases (not carried places).
func (l *leaseSet) leases() int64 {
	k := int64(0)
	for i := range l.n {
		if l.at(i).seq != 0 {
			k++
		}
	}
	return k
}

// drop counts the set's leases ended as its state is forgotten at t (Unix ns): those whose
// expiry passed expired without a release.
func (l *leaseSet) drop(t int64) {
	if l == nil || l.stats == nil {
		return
	}
	var held, expired int64
	for i := range l.n {
		if e := l.at(i); e.seq != 0 {
			held++
			if e.expiry <= t {
				expired++
			}
		}
	}
	l.stats.held.Add(-held)
	l.stats.expired.Add(uint64(expired))
}

// leaseEntry is one lease: its places, its expiry, and the seq that names it (Decision.Lease; 0
// for places carried over from another algorithm, which no lease names).
type leaseEntry struct {
	expiry int64 // Unix ns
	places int64
	seq    uint64
}

func (l *leaseSet) at(i int) *leaseEntry { return &l.entries[(l.head+i)&(len(l.entries)-1)] }

// after returns the index of the first entry expiring after t (n if none).
func (l *leaseSet) after(t int64) int {
	return sort.Search(l.n, func(i int) bool { return l.at(i).expiry > t })
}

// live returns the places held at t, and the index of the first entry that holds them; it
// changes nothing.
func (l *leaseSet) live(t int64) (held int64, first int) {
	if l == nil || l.n == 0 {
		return 0, 0
	}
	first = l.after(t)
	held = l.held
	for i := range first {
		held -= l.at(i).places
	}
	return held, first
}

// trim drops the entries that have expired at t. It changes no decision: they hold nothing.
// The leases among them expired without a release (LeaseStats).
func (l *leaseSet) trim(t int64) {
	if l.n > 0 && l.entries[l.head].expiry <= t { // l.at(0); inlined: most decisions drop nothing
		l.trimExpired(t)
	}
}

// trimExpired is trim, when the earliest entry has expired: out of line, so that trim is
// inlined.
//
//go:noinline
func (l *leaseSet) trimExpired(t int64) {
	expired := int64(0)
	for l.n > 0 && l.at(0).expiry <= t {
		if l.at(0).seq != 0 {
			expired++
		}
		l.held -= l.at(0).places
		l.head = (l.head + 1) & (len(l.entries) - 1)
		l.n--
	}
	if expired > 0 && l.stats != nil {
		l.stats.held.Add(-expired)
		l.stats.expired.Add(uint64(expired))
	}
}

// add adds a lease of places expiring at expiry, named seq, as a new entry in its place in the
// order: the last one, unless the clock stepped back (then after the entries of that expiry).
// Each lease has an entry of its own, so that a release names it by its expiry and seq.
func (l *leaseSet) add(expiry, places int64, seq uint64) {
	l.held += places
	i := l.n
	if l.n > 0 && l.at(l.n-1).expiry > expiry {
		i = sort.Search(l.n, func(i int) bool { return l.at(i).expiry > expiry })
	}
	if l.n == len(l.entries) {
		grown := make([]leaseEntry, max(2, 2*len(l.entries)))
		for j := range l.n {
			grown[j] = *l.at(j)
		}
		l.entries, l.head = grown, 0
	}
	// Open slot i by moving the entries after it one place up.
	for j := l.n; j > i; j-- {
		*l.at(j) = *l.at(j - 1)
	}
	l.n++
	*l.at(i) = leaseEntry{expiry: expiry, places: places, seq: seq}
	if seq != 0 && l.stats != nil {
		l.stats.held.Add(1)
	}
}

// remove drops the entry of the lease expiring at expiry named seq, and returns its places (0:
// no such lease, which was released, extended, dropped or never issued).
func (l *leaseSet) remove(expiry int64, seq uint64) int64 {
	i := sort.Search(l.n, func(i int) bool { return l.at(i).expiry >= expiry })
	for i < l.n && l.at(i).expiry == expiry && l.at(i).seq != seq {
		i++
	}
	if i == l.n || l.at(i).expiry != expiry {
		return 0
	}
	took := l.at(i).places
	l.held -= took
	if seq != 0 && l.stats != nil {
		l.stats.held.Add(-1)
	}
	// Close the gap from the shorter side.
	if i < l.n/2 {
		for j := i; j > 0; j-- {
			*l.at(j) = *l.at(j - 1)
		}
		l.head = (l.head + 1) & (len(l.entries) - 1)
	} else {
		for j := i; j < l.n-1; j++ {
			*l.at(j) = *l.at(j + 1)
		}
	}
	l.n--
	return took
}

// leasesOf returns s's leases when a concurrency limit wrote s, else nil.
func leasesOf(s *State) *leaseSet {
	if _, ok := s.stamp.rlOrNil().(*Concurrency); ok {
		return s.leases
	}
	return nil
}

// rlOrNil returns the strategy of a stamp, nil for none.
func (s *stamp) rlOrNil() RateLimiter {
	if s == nil {
		return nil
	}
	return s.rl
}

// Decide implements RateLimiter: it admits when the places held plus cost are within the
// limit, and then holds cost more places until now+leaseTimeout, as a lease named by a new seq
// (Decision.Lease).
func (c *Concurrency) Decide(s *State, now time.Time, cost int64) Decision {
	return c.take(s, now, cost, nextLeaseSeq(), nil)
}

// leaseSeqs counts the leases issued in the process: a lease's seq is never another's, so
// that a release names one lease only, whatever instant, client or state it was issued at.
var leaseSeqs atomic.Uint64

// nextLeaseSeq returns a seq no lease of the process had (never 0).
func nextLeaseSeq() uint64 { return leaseSeqs.Add(1) }

// take is Decide with the seq of the lease it takes, when it admits, counted by stats (nil: by
// whichever counts s's leases already, if any).
func (c *Concurrency) take(s *State, now time.Time, cost int64, seq uint64, stats *LeaseStats) Decision {
	d := c.check(s, now, cost)
	if !d.Allowed {
		return d
	}
	t := now.UnixNano()
	adopt(&c.stamp, s, t)
	if s.leases == nil {
		s.leases = &leaseSet{}
	}
	s.leases.trim(t)
	s.leases.count(stats)
	s.leases.add(t+c.timeout, cost, seq)
	s.stamp = &c.stamp
	held, _ := s.leases.live(t)
	d = c.decision(s.leases, t, held, cost, true, false)
	d.Lease = seq
	return d
}

// check answers what Decide would, taking no place: it only drops the entries of s's leases
// that have expired, which changes no decision. A store deciding a stack checks a concurrency
// limit so, and decides it once every limit admits (Memory.applyStack): nothing to undo.
func (c *Concurrency) check(s *State, now time.Time, cost int64) Decision {
	t := now.UnixNano()
	if s.stamp != &c.stamp && s.stamp != nil && leasesOf(s) == nil {
		cp := *s // another algorithm's state: its units in use charged, on a copy
		convert(c, &cp, t)
		s = &cp
	}
	l := s.leases
	if leasesOf(s) == nil {
		l = nil
	}
	if l != nil {
		l.trim(t)
	}
	held := int64(0)
	if l != nil {
		held = l.held
	}
	if cost > c.limit-held { // held+cost > limit, without overflowing for any cost
		return c.decision(l, t, held, cost, false, false)
	}
	return c.decision(l, t, held+cost, cost, true, true)
}

// decision describes the leases l at t (Unix ns), held places being held, for a decision of
// cost places: held counts them when admitted. pending tells that an admitted decision's lease
// is not in l yet (check answers before Decide adds it): its expiry, t+leaseTimeout, then
// counts as the latest.
func (c *Concurrency) decision(l *leaseSet, t, held, cost int64, allowed, pending bool) Decision {
	d := Decision{Allowed: allowed, Limit: c.limit, Remaining: max(0, c.limit-held)}
	if held == 0 {
		return d
	}
	last := int64(0)
	if l != nil && l.n > 0 {
		last = l.at(l.n - 1).expiry
	}
	if pending {
		last = max(last, t+c.timeout)
	}
	d.ResetAfter = time.Duration(last - t)
	if allowed || cost > c.limit {
		return d // never admitted: no retry time
	}
	// Without a release, the cost fits once the earliest leases holding held+cost-limit places
	// have expired.
	need := held + cost - c.limit
	_, first := l.live(t)
	for i := first; i < l.n; i++ {
		if need -= l.at(i).places; need <= 0 {
			d.RetryAfter = time.Duration(l.at(i).expiry - t)
			break
		}
	}
	return d
}

// Peek implements RateLimiter: whether one place is free, taking none and changing nothing.
func (c *Concurrency) Peek(s *State, now time.Time) Decision {
	t := now.UnixNano()
	if s.stamp != &c.stamp && s.stamp != nil && leasesOf(s) == nil {
		cp := *s
		convert(c, &cp, t)
		s = &cp
	}
	l := leasesOf(s)
	held, _ := l.live(t)
	return c.decision(l, t, held, 1, held+1 <= c.limit, false)
}

// Refund implements RateLimiter: it gives nothing back. A refund returns rate units; a
// concurrency limit's places come back when their lease is released or expires.
func (c *Concurrency) Refund(s *State, now time.Time, _ int64) Decision {
	return c.Peek(s, now)
}

// release ends the lease issued at issued (Unix ns) named seq: it frees the places of its entry,
// if the lease has not expired, and returns the places freed and what Peek answers after it.
// A lease released, extended, expired or dropped (a reset) has no entry: nothing is freed. A
// state that no concurrency limit wrote holds no lease.
func (c *Concurrency) release(s *State, now time.Time, issued int64, seq uint64) (int64, Decision) {
	if leasesOf(s) == nil {
		return 0, c.Peek(s, now)
	}
	t := now.UnixNano()
	s.stamp = &c.stamp // carried: every lease keeps its expiry
	s.leases.trim(t)
	freed := int64(0)
	if expiry := issued + c.timeout; expiry > t {
		freed = s.leases.remove(expiry, seq)
	}
	return freed, c.Peek(s, now)
}

// extend moves the places of the lease issued at issued (Unix ns) named seq to now+leaseTimeout,
// as the lease next issued at now, and returns how many it moved and what Peek answers after
// it, with next in Decision.Lease when it moved some (as release, a lease without an entry
// moves nothing).
func (c *Concurrency) extend(s *State, now time.Time, issued int64, seq, next uint64) (int64, Decision) {
	if leasesOf(s) == nil {
		return 0, c.Peek(s, now)
	}
	t := now.UnixNano()
	s.stamp = &c.stamp
	s.leases.trim(t)
	moved := int64(0)
	if expiry := issued + c.timeout; expiry > t {
		if moved = s.leases.remove(expiry, seq); moved > 0 {
			s.leases.add(t+c.timeout, moved, next)
		}
	}
	d := c.Peek(s, now)
	if moved > 0 {
		d.Lease = next
	}
	return moved, d
}

// Fresh implements RateLimiter: no lease holds a place.
func (c *Concurrency) Fresh(s *State, now time.Time) bool {
	l := leasesOf(s)
	return l == nil || l.n == 0 || l.at(l.n-1).expiry <= now.UnixNano()
}

// carryFrom converts a state written by another concurrency limit: every lease keeps its
// expiry and its places, beyond the new limit too (a conversion never gives usage back).
func (c *Concurrency) carryFrom(s *State) {
	s.stamp = &c.stamp
}

// usedUnits returns the places held at now (another algorithm charges them).
func (c *Concurrency) usedUnits(s *State, now int64) int64 {
	held, _ := leasesOf(s).live(now)
	return held
}

// chargeUnits sets s to u places held by one lease admitted at now: another algorithm's units in
// use carried over, held for a whole lease timeout from the conversion.
func (c *Concurrency) chargeUnits(s *State, now, u int64) {
	*s = State{stamp: &c.stamp}
	if u > 0 {
		s.leases = &leaseSet{}
		s.leases.add(now+c.timeout, u, 0) // no lease names carried places
	}
}

// Algorithm implements RateLimiter.
func (c *Concurrency) Algorithm() Algorithm { return AlgorithmConcurrency }

// Limit implements RateLimiter: the places.
func (c *Concurrency) Limit() int64 { return c.limit }

// Window implements RateLimiter: the lease timeout, the longest a place is held without a
// release or an extension. A concurrency limit admits Limit at once, not per Window, unless
// nothing is released: then, as over Envoy's rate-limit API, it admits Limit per Window.
func (c *Concurrency) Window() time.Duration { return time.Duration(c.timeout) }

// LeaseTimeout returns how long a lease holds its places without a release or an extension.
func (c *Concurrency) LeaseTimeout() time.Duration { return time.Duration(c.timeout) }
