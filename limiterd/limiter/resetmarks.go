package limiter

import (
	"strings"
	"sync"
	"time"
)

// MaxResetMarks bounds the reset marks a Memory store keeps (resetMarks): resets are admin
// operations, so the bound is only reached by a flood of them. Past it the store voids the
// charges made before the reset of every client (resetMarks.floor), which refuses more refunds
// than needed and admits nothing extra.
const MaxResetMarks = 1 << 14

// resetMarks are a Memory store's marks of the clients it reset: Reset erases a client's state,
// and with it the charges of the reservations issued before, so a refund of one of them must not
// give units back to the state the client builds after the reset (ErrReset). A mark keeps, by
// stored key, the instant of the client's latest reset, for as long as a charge it erased could
// still be refunded: until every limit's forgotten state would have refilled, at the latest
// (a reservation is valid until its charge has refilled under one of its limits, which is no
// later than that state refills: see engine.refundable) and RefundRecordGrace more. A reset that
// forgot nothing needing a refill marks nothing: whatever was charged before has refilled.
//
// The marks live outside the client's state, which a reset deletes and which stays as small as
// before; they cost nothing to decisions, and a refund one map lookup under its shard lock.
type resetMarks struct {
	mu    sync.Mutex
	marks map[string]resetMark // by stored key
	// floor (Unix ns, 0: none) voids, for every client, the charges made at or before it: set
	// when MaxResetMarks marks are kept and another is needed.
	floor int64
}

// resetMark is the latest reset of a client and until when it may void a refund (Unix ns).
type resetMark struct{ at, until int64 }

// mark records that the client whose stored key is key was reset at at, and that a charge it
// erased may be refunded until until at the latest.
func (r *resetMarks) mark(key string, at, until time.Time) {
	a, u := at.UnixNano(), until.Add(RefundRecordGrace).UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.marks[key]; ok {
		r.marks[key] = resetMark{at: max(a, m.at), until: max(u, m.until)}
		return
	}
	if len(r.marks) >= MaxResetMarks {
		r.dropExpiredLocked(a)
		if len(r.marks) >= MaxResetMarks {
			r.floor = max(r.floor, a)
			return
		}
	}
	if r.marks == nil {
		r.marks = make(map[string]resetMark)
	}
	r.marks[strings.Clone(key)] = resetMark{at: a, until: u}
}

// voids reports whether a refund of a charge made at issued (Unix ns) for the client whose
// stored key is key is void: the client was reset at or after it.
func (r *resetMarks) voids(key string, issued int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if issued <= r.floor && r.floor != 0 {
		return true
	}
	m, ok := r.marks[key]
	return ok && issued <= m.at
}

// sweep drops the marks that can void no refund any more at now.
func (r *resetMarks) sweep(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropExpiredLocked(now.UnixNano())
}

func (r *resetMarks) dropExpiredLocked(now int64) {
	for k, m := range r.marks {
		if m.until <= now {
			delete(r.marks, k)
		}
	}
	if len(r.marks) == 0 {
		r.marks = nil // let the table go
	}
}
