package limiter

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Once makes a refund apply at most once (see Store.RefundOnce).
type Once struct {
	// ID names the refund: a reservation's ID, unique among every refund of the store.
	ID [16]byte
	// Until is when the record of the refund may be forgotten: the instant after which nothing
	// would accept the refund any more (the reservation's until).
	Until time.Time
}

// Errors of RefundOnce; neither refunds anything.
var (
	// ErrRefunded: a refund of the same ID was made before.
	ErrRefunded = errors.New("already refunded")
	// ErrTooManyRefunds: the store keeps MaxRefundRecords records of refunds that have not
	// expired, and keeps no more.
	ErrTooManyRefunds = errors.New("too many refunds in their validity: try again later")
)

// MaxRefundRecords bounds the refund records a Memory store keeps (about 40 bytes each: 10 MiB
// at most a store, so a policy). A record lives until its refund's Until; a refund that would
// need one more record, once expired records are dropped, fails with ErrTooManyRefunds and
// refunds nothing: a store never forgets a record early, which would let a refund apply twice.
const MaxRefundRecords = 1 << 18

// refundRecords are the IDs of a Memory store's refunds, each with its until (Unix ns).
type refundRecords struct {
	mu  sync.Mutex
	ids map[[16]byte]int64
}

// add records id until until, unless it is recorded already (ErrRefunded) or the records are
// full (ErrTooManyRefunds) at now.
func (r *refundRecords) add(id [16]byte, until, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if u, ok := r.ids[id]; ok && u > now.UnixNano() {
		return ErrRefunded
	}
	if len(r.ids) >= MaxRefundRecords {
		r.sweepLocked(now)
		if len(r.ids) >= MaxRefundRecords {
			return ErrTooManyRefunds
		}
	}
	if r.ids == nil {
		r.ids = make(map[[16]byte]int64)
	}
	r.ids[id] = until.UnixNano()
	return nil
}

// sweep drops the records whose until has passed at now.
func (r *refundRecords) sweep(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
}

func (r *refundRecords) sweepLocked(now time.Time) {
	n := now.UnixNano()
	for id, until := range r.ids {
		if until <= n {
			delete(r.ids, id)
		}
	}
	if len(r.ids) == 0 {
		r.ids = nil // let the table go
	}
}

// len returns the number of records kept.
func (r *refundRecords) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// RefundOnce implements Store: the record of once.ID is kept in process memory (at most
// MaxRefundRecords; Sweep drops expired ones), then the refund is made as Refund or RefundStack
// make it. It never fails otherwise.
func (m *Memory) RefundOnce(ctx context.Context, req Request, now time.Time, once Once) (Decision, error) {
	if err := m.refunds.add(once.ID, once.Until, now); err != nil {
		return Decision{}, err
	}
	if req.Stack != nil {
		return m.RefundStack(ctx, req.Key, req.Stack, now, req.Cost, req.Limits)
	}
	return m.Refund(ctx, req.Key, req.Limiter, now, req.Cost)
}

// RefundRecords returns the number of refund records the store keeps (see MaxRefundRecords).
func (m *Memory) RefundRecords() int { return m.refunds.len() }
