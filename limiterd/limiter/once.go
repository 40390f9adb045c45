package limiter

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"sync"
	"time"
)

// Once makes a refund, or a lease's release or extension, apply at most once (see Store.Refund).
type Once struct {
	// Op is what Store.Refund applies once: a refund (the zero value), or the release or the
	// extension of the lease that the admission at Issued took.
	Op OnceOp
	// ID names the refund: a reservation's ID, unique among every refund of the store.
	ID [16]byte
	// Until is the instant after which nothing would accept the refund any more (the
	// reservation's until); its record is forgotten RefundRecordGrace later.
	Until time.Time
	// Issued is the instant of the charge the refund returns units of (the reservation's at).
	// A refund of a charge issued at or before the client's latest Reset is void (ErrReset):
	// the reset erased the charge with the rest of the state. The zero time is before any reset.
	Issued time.Time
	// Cost is the units the charge took (the reservation's cost), 0 when unknown. With it, a
	// token bucket refunds at most what of the charge has not refilled since Issued, so that
	// the client never gets more than if the charge had been smaller (see
	// TokenBucket.RefundInterval); without it, the amount asked.
	Cost int64
	// Lease names the lease that OpRelease and OpExtend end (Decision.Lease of its admission
	// or of its last extension); a refund ignores it.
	Lease uint64
}

// OnceOp is what Store.Refund applies, once per Once.ID.
type OnceOp uint8

// The operations of Store.Refund.
const (
	// OpRefund returns the request's cost to every limit, as RateLimiter.Refund does; a
	// concurrency limit gives nothing back.
	OpRefund OnceOp = iota
	// OpRelease ends the lease issued at Once.Issued named Once.Lease: each concurrency limit of
	// the stack frees the places that lease still holds (Concurrency); the rate limits are not
	// touched. Request.Refunded receives the places each limit freed.
	OpRelease
	// OpExtend moves the places the lease issued at Once.Issued still holds to expire a lease
	// timeout after now, as a lease issued at now: the old lease is spent and its holder is
	// given a new one, named by the answer's Decision.Lease. The rate limits are not touched. Request.Refunded
	// receives the places each limit moved.
	OpExtend
)

// String returns the operation's name.
func (op OnceOp) String() string {
	switch op {
	case OpRefund:
		return "refund"
	case OpRelease:
		return "release"
	case OpExtend:
		return "extend"
	}
	return "OnceOp(" + strconv.Itoa(int(op)) + ")"
}

// issuedNanos returns once.Issued in Unix nanoseconds, the zero time as the earliest instant.
func (once *Once) issuedNanos() int64 {
	if once.Issued.IsZero() {
		return math.MinInt64
	}
	return once.Issued.UnixNano()
}

// Errors of Store.Refund; neither refunds anything.
var (
	// ErrRefunded: a refund of the same ID was made before.
	ErrRefunded = errors.New("already refunded")
	// ErrTooManyRefunds: the store keeps as many records of the client's refunds that have not
	// expired as its share allows (MaxRefundRecords: fewer than are free), and keeps no more.
	ErrTooManyRefunds = errors.New("too many refunds in their validity: try again later")
	// ErrRefundTooLate: the refund's now is more than RefundRecordGrace older than the newest now
	// the store's records have seen (a refund delayed that long since it read its clock): its
	// record may have been dropped, so the store cannot tell whether it was made; as for an
	// expired reservation, nothing is refunded.
	ErrRefundTooLate = errors.New("refund too late: its instant is older than the refund records keep")
	// ErrReset: the client was reset (Store.Reset) at or after the refund's Once.Issued: the
	// reset erased the charge, and refunding it would give back units nobody holds any more.
	ErrReset = errors.New("the client was reset since the charge: nothing is left to refund")
	// ErrLeaseExpired: a release or an extension of a lease whose expiry (Stack.LeaseExpiry of
	// its Once.Issued) is not after now: its places are free already (nothing is recorded).
	ErrLeaseExpired = errors.New("the lease has expired: its places are free again")
	// ErrNoLease: a release or an extension by a stack without a concurrency limit, or of a
	// lease without its Once.Issued or its Once.Lease: no lease can be named.
	ErrNoLease = errors.New("no lease to release or extend: the stack has no concurrency limit, or the lease names no instant or seq")
)

// RefundRecordGrace is how long a store keeps the record of a refund past its Once.Until (a
// Memory store; the Redis store's record key expires that much later too). Whether a
// reservation is still valid is judged on a clock read before the record is checked, and
// maybe on another replica than the one whose refund wrote the record: without the grace, a
// record expiring exactly at Until lets the same reservation refund a second time through a
// replica whose clock is behind the first's, or through a refund delayed (preempted, queued)
// between its clock read and its check of the record while a later clock dropped the record.
// The grace tolerates the sum of the clock skew between replicas and the time a refund may take
// from its clock read to its record: replicas synchronized by NTP are within milliseconds of
// each other and a store round trip is bounded by the Redis store's timeout (50 ms by default),
// so 10 s is over a hundred times what either needs, and a host whose clock is off by more
// than that is already broken for rate limiting. What it costs: every record lives 10 s longer,
// so a policy refunding R reservations a second keeps about 10*R more records (Memory: 64 to 104
// bytes each, against MaxRefundRecords, which the grace alone fills at about 26,000 refunds a
// second, and one client's share, half the records alone, at about 13,000; Redis: one more
// small key each). A Memory store also refuses a refund whose now is
// more than the grace older than the newest now its records have seen (ErrRefundTooLate), so
// that a refund delayed longer still never misses a record that was dropped.
const RefundRecordGrace = 10 * time.Second

// MaxRefundRecords bounds the refund records a Memory store keeps, so a policy: at most 26 MiB of
// live heap (about 104 bytes a record when each is of another client, whose count is kept too;
// 64, 16 MiB, when few clients hold them; measured by TestRefundRecordsMemory, which holds them
// under 112), and the process's heap may grow to about twice the live figure before the
// collector runs (GOGC=100). A record lives until its refund's Until and RefundRecordGrace more
// (so the cap is reached sooner: the grace alone holds 10 s of refunds); a refund that would
// need one more record, once expired records are dropped, fails with ErrTooManyRefunds and
// refunds nothing: a store never forgets a record early, which would let a refund apply twice.
//
// The records are shared fairly: a refund of a client is recorded only while the client holds
// fewer records than are free (MaxRefundRecords less every client's records). A client's
// refund gives its units back, so one client alone can charge and refund without end, one
// record a refund: with the cap alone it filled the records in about 13 s over HTTP, and every
// other client's refunds were refused until its records expired (issue 34). Under the share,
// one client takes at most half of them, k clients at most MaxRefundRecords/(k+1) each, and a
// client holding fewer than are left free (at least MaxRefundRecords/(k+1) while k clients
// flood) still has its refunds recorded; past its share only the client's own refunds fail.
// Filling the records takes about as many clients as records, each with a refund made. Without
// a flood a client may use what the others leave: half the records hold one client's refunds
// at 13,000 a second with 10 s of records (the grace and a reservation whose units refill at
// once). A record is still never dropped before its expiry: refusing keeps a refund at most
// once, where evicting a record would let its reservation refund again.
const MaxRefundRecords = 1 << 18

// refundRecords are the IDs of a Memory store's refunds until their until and RefundRecordGrace
// more: a set for lookups and a min-heap on until, so that dropping the expired records costs
// O(log n) each and nothing when none has expired; and each client's count of records.
type refundRecords struct {
	mu     sync.Mutex
	ids    map[[16]byte]struct{}
	expiry []refundRecord // a min-heap on until
	// held counts the records of each client with some, by its key's hash in the store (see
	// Memory.admitRefund), for the fair share (MaxRefundRecords). Two clients whose hashes
	// collide (64 bits, a seed of the process) would share a count: refused sooner, never more.
	held map[uint64]uint32
	// newest is the latest now that add or sweep has seen (Unix ns): every record dropped had
	// its until+grace at or before it.
	newest int64
}

// refundRecord is one record: a refund's ID, its until (Unix ns) and its client's hash.
type refundRecord struct {
	until  int64
	client uint64
	id     [16]byte
}

// add records id, a refund of the client whose key hashes to client, until until (and the
// grace), unless it is recorded already (ErrRefunded), the refund is void (ErrReset: checked
// after the record, so that a retry of a refund made before its client's reset still answers
// ErrRefunded, as Redis does), the client's records or all of them are full (ErrTooManyRefunds)
// at now, or now is more than the grace older than the newest now seen (ErrRefundTooLate): a
// record dropped had until+grace <= newest, and a refund judged valid at now has now < until,
// so one that is not too late still finds its record.
func (r *refundRecords) add(id [16]byte, client uint64, until, now time.Time, void bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.UnixNano() < r.newest-int64(RefundRecordGrace) {
		return ErrRefundTooLate
	}
	r.dropExpiredLocked(now.UnixNano())
	if _, ok := r.ids[id]; ok {
		return ErrRefunded
	}
	if void {
		return ErrReset
	}
	// The fair share, which refuses everyone at the cap (nothing is free).
	if int(r.held[client]) >= MaxRefundRecords-len(r.ids) {
		return ErrTooManyRefunds
	}
	if r.ids == nil {
		r.ids, r.held = make(map[[16]byte]struct{}), make(map[uint64]uint32)
	}
	r.ids[id] = struct{}{}
	r.held[client]++
	r.push(refundRecord{until: until.UnixNano(), client: client, id: id})
	return nil
}

// sweep drops the records whose until and grace have passed at now.
func (r *refundRecords) sweep(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropExpiredLocked(now.UnixNano())
}

// dropExpiredLocked pops the records whose until+RefundRecordGrace is at or before now (Unix
// ns), and makes now the newest now seen if it is.
func (r *refundRecords) dropExpiredLocked(now int64) {
	r.newest = max(r.newest, now)
	for len(r.expiry) > 0 && r.expiry[0].until <= now-int64(RefundRecordGrace) {
		rec := r.pop()
		delete(r.ids, rec.id)
		if n := r.held[rec.client]; n > 1 {
			r.held[rec.client] = n - 1
		} else {
			delete(r.held, rec.client)
		}
	}
	if len(r.expiry) == 0 && r.ids != nil {
		r.ids, r.expiry, r.held = nil, nil, nil // let the tables go
	}
}

// push adds rec to the heap. (container/heap would box each record in an interface value,
// one allocation a refund; the two operations are short enough to write for the one type.)
func (r *refundRecords) push(rec refundRecord) {
	r.expiry = append(r.expiry, rec)
	h := r.expiry
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if h[parent].until <= h[i].until {
			break
		}
		h[parent], h[i] = h[i], h[parent]
		i = parent
	}
}

// pop removes and returns the record of the earliest until.
func (r *refundRecords) pop() refundRecord {
	h := r.expiry
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		least, l, rt := i, 2*i+1, 2*i+2
		if l < n && h[l].until < h[least].until {
			least = l
		}
		if rt < n && h[rt].until < h[least].until {
			least = rt
		}
		if least == i {
			break
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
	r.expiry = h
	return top
}

// len returns the number of records kept.
func (r *refundRecords) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// Refund implements Store: under the shard lock of the client key, the refund is checked
// against the client's latest Reset (ErrReset when once.Issued is not after it: see
// resetMarks), the record of once.ID is kept in process memory until once.Until and
// RefundRecordGrace more (at most MaxRefundRecords, shared fairly among clients; Sweep drops
// expired ones), then every limit
// that keeps state for the client refunds, each as RateLimiter.Refund does (a client the store
// does not track has nothing to refund). It also fails with ErrRefundTooLate, refunding nothing,
// when now is more than RefundRecordGrace older than the newest now the records have seen
// (Refund's and Sweep's), and with ErrInvalidCost for a cost below 1. A release or an
// extension (once.Op) keeps no record: it fails first with ErrNoLease or ErrLeaseExpired, then
// with ErrReset as a refund would, then changes the concurrency limits only, under the same
// lock: the lease's entry in its client's state is its record (Concurrency), and a lease that
// no limit holds any more (released, extended, or dropped) fails with ErrRefunded. It never
// fails otherwise.
func (m *Memory) Refund(_ context.Context, req Request, now time.Time, once Once) (Decision, error) {
	if req.Cost < 1 {
		return Decision{}, ErrInvalidCost
	}
	now = ClampInstant(now)
	if !once.Issued.IsZero() {
		once.Issued = ClampInstant(once.Issued)
	}
	switch once.Op {
	case OpRefund:
	case OpRelease, OpExtend:
		if !req.Stack.HasLeases() || once.Issued.IsZero() || once.Lease == 0 {
			return Decision{}, ErrNoLease
		}
		if !req.Stack.LeaseExpiry(once.Issued).After(now) {
			return Decision{}, ErrLeaseExpired
		}
		// No record: the lease's entry in its client's leases is its record (Concurrency).
	default:
		return Decision{}, fmt.Errorf("unknown operation %v", once.Op)
	}
	// The stack path for every stack, one limit included (TestApplyOneMatchesStack holds the
	// two paths to one answer): the gate stays off applyOne, the decisions' fast path.
	var (
		g      = refundGate{once: once, refunded: req.Refunded}
		limits [MaxStack]stackLimit
		own    [MaxStack]Decision
	)
	out := req.Limits
	if out == nil {
		out = own[:]
	}
	added := m.applyStack(req.Key, req.Stack, now, req.Cost, opRefund, limits[:], out, &g)
	if g.err != nil {
		return Decision{}, g.err
	}
	if added && m.budget.over() { // an extension may grow a client's leases
		m.budget.reclaim(m, now)
	}
	d, _ := Combine(out[:req.Stack.Len()])
	return d, nil
}

// refundGate is what a refund must pass, under its client's shard lock, before it changes any
// state: the check of its client's resets and of its record, and the record's write.
type refundGate struct {
	once Once
	err  error // why the gate refused
	// refunded, unless nil, receives what the refund gave back to each limit
	// (Request.Refunded).
	refunded []int64
}

// admitRefund passes the gate g (nil: none) of a refund for the client whose stored key is key,
// at now: it reports whether the refund may apply, else sets g.err. Called under the client's
// shard lock (or, for a store that never decided, without one: no client has state or marks),
// so that no Reset of the client comes between the check and the refund.
func (m *Memory) admitRefund(key string, g *refundGate, now time.Time) bool {
	if g == nil {
		return true
	}
	void := m.resets.voids(key, g.once.issuedNanos())
	if g.once.Op != OpRefund { // a lease is its own record: its entry, while it holds places
		if void {
			g.err = ErrReset
		}
		return !void
	}
	g.err = m.refunds.add(g.once.ID, maphash.String(m.seed, key), g.once.Until, now, void)
	return g.err == nil
}

// RefundRecords returns the number of refund records the store keeps (see MaxRefundRecords).
func (m *Memory) RefundRecords() int { return m.refunds.len() }
