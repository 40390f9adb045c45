package limiter

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"time"
)

// one returns the stack of the single limit rl, named DefaultLimitName: the form of a tier of
// one limit. It panics on a strategy no stack holds.
func one(rl RateLimiter) *Stack {
	st, err := NewStack([]string{DefaultLimitName}, []RateLimiter{rl})
	if err != nil {
		panic(err)
	}
	return st
}

// refundIDs numbers the refunds of refundNoRecord.
var refundIDs atomic.Uint64

// refundNoRecord refunds amount units by st through Store.Refund under an ID of its own, so
// that no earlier refund's record stands in its way.
func refundNoRecord(s Store, key string, st *Stack, now time.Time, amount int64, out []Decision) (Decision, error) {
	var id [16]byte
	binary.BigEndian.PutUint64(id[:8], 1<<63|refundIDs.Add(1)) // apart from the IDs tests pick
	return s.Refund(context.Background(), Request{Key: key, Stack: st, Cost: amount, Limits: out}, now,
		Once{ID: id, Until: now.Add(time.Hour), Issued: now})
}
