package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// onceScripts are the decision scripts for refunds that apply at most once (Refund): each takes
// two more keys, the refund's record and the client's reset mark (resetSuffix; both on the
// client's slot), and three more arguments, the record's expiry in milliseconds and the instant
// of the charge refunded (s, n). A record present answers the status refundedStatus and changes
// nothing; else a reset mark at or after the charge's instant answers resetStatus and changes
// nothing (the reset deleted the charge); a refund made (outcome outcomeRefunded, not a
// conversion request) writes the record in the same script call. A lease's release or
// extension (modeRelease, modeExtend) passes an empty expiry: it keeps no record (the lease's
// member in its limits' sets is its record), and the record's key is not read.
var onceScripts = joinScripts(algorithmsSource, entry{rest: onceEntry})

// onceEntry is the entry script of onceScripts: decide.lua's, within the record's check and write.
var onceEntry = onceEntryOf(decideEntry)

// onceEntryOf returns the entry script of the refunds that apply at most once around the
// decision entry script decide.
func onceEntryOf(decide string) string {
	return `-- Refund: decide.lua with the record of a refund and the check of the client's resets.
local RESET_KEY, ISSUED_N, ISSUED_S = table.remove(KEYS), tonumber(table.remove(ARGV)), tonumber(table.remove(ARGV))
local ONCE_KEY, ONCE_TTL_MS = table.remove(KEYS), table.remove(ARGV)
if ONCE_TTL_MS ~= '' and redis.call('EXISTS', ONCE_KEY) == 1 then return redis.status_reply('` + refundedStatus + `') end
local reset = redis.call('GET', RESET_KEY)
if reset then
  local rs, rn = string.match(reset, '^(-?%d+) (%d+)$')
  rs, rn = tonumber(rs), tonumber(rn)
  if not rs or not rn or ISSUED_S < rs or ISSUED_S == rs and ISSUED_N <= rn then
    return redis.status_reply('` + resetStatus + `')
  end
end
local reply = (function()
` + decide + `
end)()
if ONCE_TTL_MS ~= '' and type(reply) == 'table' and reply[REPLY_OUTCOME] == OUTCOME_REFUNDED then
  redis.call('SET', ONCE_KEY, '1', 'PX', ONCE_TTL_MS)
end
return reply
`
}

// refundedStatus is onceScripts' answer when the refund's record exists; resetStatus when the
// client was reset at or after the charge refunded.
const (
	refundedStatus = "REFUNDED"
	resetStatus    = "RESET"
)

// errRefundRecorded: the script found the reservation's record and refunded nothing.
var errRefundRecorded = errors.New("refund recorded before")

// errResetSince: the script found the client reset since the charge and refunded nothing.
var errResetSince = errors.New("client reset since the charge")

// resetSuffix follows a client's key (Store.key) in the Redis key of its reset mark (see
// reset.lua): on the client's slot, no limit's key (a limit's name has no '#') and no refund's.
const resetSuffix = "#reset"

// issuedArgs returns the instant of the charge a refund returns (once.Issued) as the once
// scripts take it: Unix seconds and nanoseconds, the zero time as the earliest instant.
func issuedArgs(once *limiter.Once) (sec, ns string) {
	i := int64(math.MinInt64)
	if !once.Issued.IsZero() {
		i = once.Issued.UnixNano()
	}
	s, n := split(i)
	return strconv.FormatInt(s, 10), strconv.FormatInt(n, 10)
}

// refundSuffix follows a client's key (Store.key) in the Redis key of the record of a refund
// (limiter.Once): "#refund:" and the ID in hex, on the client's slot, and no limit's key (a
// limit's name has no '#').
func refundSuffix(id [16]byte) string { return "#refund:" + hex.EncodeToString(id[:]) }

// Refund implements limiter.Store: one script call checks the refund's record (the client's
// key and refundSuffix), refunds every limit and writes the record with an expiry at
// once.Until plus limiter.RefundRecordGrace (and the expiry slack), atomically; before it
// refunds, the same call checks the client's reset mark (Reset), refusing with limiter.ErrReset
// a refund of a charge made (once.Issued) at or before the client's latest reset. With
// ServerClock the refund is made at the server's time. With a reject cache, the refund then
// tells every replica to forget the client's cached rejection, as Reset does, since the client
// may now be admitted before the cached retry time. A cost below 1 is refused with
// limiter.ErrInvalidCost before Redis, recording nothing.
//
// A lease's release or extension (limiter.Once.Op) keeps no record, as limiter.Memory: it fails
// first with limiter.ErrNoLease or limiter.ErrLeaseExpired (before Redis), then with
// limiter.ErrReset as a refund would, then ends or moves, in the same script call, the lease
// named by once.Lease in each concurrency limit's set of leases; a lease that no limit holds
// any more (released, extended, expired or dropped by a reset) fails with limiter.ErrRefunded,
// changing nothing. On the caller's clock a limit's lease is also the one expiring a lease
// timeout after once.Issued, as in memory; on the server's clock its seq alone names it (the
// lease counter gives no seq twice to a client).
func (s *Store) Refund(ctx context.Context, req limiter.Request, now time.Time, once limiter.Once) (limiter.Decision, error) {
	if req.Cost < 1 {
		return limiter.Decision{}, limiter.ErrInvalidCost
	}
	now = limiter.ClampInstant(now)
	if !once.Issued.IsZero() {
		once.Issued = limiter.ClampInstant(once.Issued)
	}
	m := modeRefund
	switch once.Op {
	case limiter.OpRefund:
	case limiter.OpRelease, limiter.OpExtend:
		if !req.Stack.HasLeases() || once.Issued.IsZero() || once.Lease == 0 {
			return limiter.Decision{}, limiter.ErrNoLease
		}
		if !req.Stack.LeaseExpiry(once.Issued).After(now) {
			return limiter.Decision{}, limiter.ErrLeaseExpired
		}
		m = modeRelease
		if once.Op == limiter.OpExtend {
			m = modeExtend
		}
	default:
		return limiter.Decision{}, fmt.Errorf("redis store: policy %s: unknown operation %v", s.policy, once.Op)
	}
	st, out := req.Stack, req.Limits
	// The grace covers the clock skew between this replica and one that judges the reservation
	// valid later, and a refund's delay (limiter.RefundRecordGrace). A lease keeps no record.
	ttl := strconv.FormatInt(max(1, ceilMS(once.Until.Sub(now)+limiter.RefundRecordGrace)+ceilMS(s.c.opts.ExpirySlack)), 10)
	if m != modeRefund {
		ttl = ""
	}
	refunded := req.Refunded
	if refunded == nil && m != modeRefund {
		refunded = make([]int64, st.Len()) // whether a limit held the lease
	}
	issuedS, issuedN := issuedArgs(&once)
	spent, void := false, false // a record or reset mark found is Redis answering: no failure for the breaker
	d, err := s.throughBreaker(ctx, req.Key, func(ctx context.Context) (limiter.Decision, error) {
		cn, err := s.c.get()
		if err != nil {
			return limiter.Decision{}, err
		}
		c := s.newCall(req.Key, st, now, req.Cost, m)
		c.refundOf, c.refundAt, c.refunded, c.lease = &once, now, refunded, once.Lease
		k := s.key(req.Key)
		record, mark := k+refundSuffix(once.ID), k+resetSuffix
		if m != modeRefund {
			record = k + leaseSuffix // not read: no record
		}
		d, err := c.converge(out, func() ([]rueidis.RedisMessage, error) {
			msg, err := s.lib.once.of(c).lua.Exec(ctx, cn, append(c.keys[:len(c.keys):len(c.keys)], record, mark),
				append(s.callArgs(c), ttl, issuedS, issuedN)).ToMessage()
			if err != nil {
				return nil, fmt.Errorf("refund record: %w", err)
			}
			if status, err := msg.ToString(); err == nil {
				switch status {
				case refundedStatus:
					return nil, errRefundRecorded
				case resetStatus:
					return nil, errResetSince
				}
			}
			return msg.ToArray()
		})
		switch {
		case errors.Is(err, errRefundRecorded):
			spent = true
			return limiter.Decision{}, nil
		case errors.Is(err, errResetSince):
			void = true
			return limiter.Decision{}, nil
		}
		return d, err
	})
	switch {
	case err == nil && spent:
		return limiter.Decision{}, limiter.ErrRefunded
	case err == nil && void:
		return limiter.Decision{}, limiter.ErrReset
	case err != nil:
		return limiter.Decision{}, fmt.Errorf("redis store: policy %s: %v: %w", s.policy, once.Op, err)
	}
	if m != modeRefund {
		// The rejections of a stack with a concurrency limit are never cached (rejectCache):
		// nothing to forget.
		for _, p := range refunded[:st.Len()] {
			if p > 0 {
				return d, nil
			}
		}
		return limiter.Decision{}, limiter.ErrRefunded // no limit holds the lease
	}
	s.refunded(ctx, req.Key)
	return d, nil
}
