package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// onceScripts are the decision scripts for refunds that apply at most once (Refund): each takes
// one more key, the refund's record (on the client's slot), and one more argument, the record's
// expiry in milliseconds. A record present answers the status refundedStatus and changes
// nothing; a refund made (outcome outcomeRefunded, not a conversion request) writes the record
// in the same script call.
var onceScripts = joinScripts(onceEntry)

// onceEntry is the entry script of onceScripts: decide.lua's, within the record's check and write.
var onceEntry = `-- Refund: decide.lua with the record of a refund.
local ONCE_KEY, ONCE_TTL_MS = table.remove(KEYS), table.remove(ARGV)
if redis.call('EXISTS', ONCE_KEY) == 1 then return redis.status_reply('` + refundedStatus + `') end
local reply = (function()
` + decideEntry + `
end)()
if type(reply) == 'table' and reply[REPLY_OUTCOME] == OUTCOME_REFUNDED then
  redis.call('SET', ONCE_KEY, '1', 'PX', ONCE_TTL_MS)
end
return reply
`

// refundedStatus is onceScripts' answer when the refund's record exists.
const refundedStatus = "REFUNDED"

// errRefundRecorded: the script found the reservation's record and refunded nothing.
var errRefundRecorded = errors.New("refund recorded before")

// refundSuffix follows a client's key (Store.key) in the Redis key of the record of a refund
// (limiter.Once): "#refund:" and the ID in hex, on the client's slot, and no limit's key (a
// limit's name has no '#').
func refundSuffix(id [16]byte) string { return "#refund:" + hex.EncodeToString(id[:]) }

// Refund implements limiter.Store: one script call checks the refund's record (the client's
// key and refundSuffix), refunds every limit and writes the record with an expiry at
// once.Until plus limiter.RefundRecordGrace (and the expiry slack), atomically. With
// ServerClock the refund is made at the server's time. With a reject cache, the refund then
// tells every replica to forget the client's cached rejection, as Reset does, since the client
// may now be admitted before the cached retry time.
func (s *Store) Refund(ctx context.Context, req limiter.Request, now time.Time, once limiter.Once) (limiter.Decision, error) {
	st, out := req.Stack, req.Limits
	// The grace covers the clock skew between this replica and one that judges the reservation
	// valid later, and a refund's delay (limiter.RefundRecordGrace).
	ttl := strconv.FormatInt(max(1, ceilMS(once.Until.Sub(now)+limiter.RefundRecordGrace)+ceilMS(s.c.opts.ExpirySlack)), 10)
	spent := false // a record found is Redis answering: no failure for the breaker
	d, err := s.throughBreaker(ctx, req.Key, func(ctx context.Context) (limiter.Decision, error) {
		cn, err := s.c.get()
		if err != nil {
			return limiter.Decision{}, err
		}
		c := s.newCall(req.Key, st, now, req.Cost, modeRefund)
		record := s.key(req.Key) + refundSuffix(once.ID)
		d, err := c.converge(out, func() ([]rueidis.RedisMessage, error) {
			msg, err := onceScripts.of(c).lua.Exec(ctx, cn, append(c.keys[:len(c.keys):len(c.keys)], record),
				append(s.callArgs(c), ttl)).ToMessage()
			if err != nil {
				return nil, fmt.Errorf("refund record: %w", err)
			}
			if status, err := msg.ToString(); err == nil && status == refundedStatus {
				return nil, errRefundRecorded
			}
			return msg.ToArray()
		})
		if errors.Is(err, errRefundRecorded) {
			spent = true
			return limiter.Decision{}, nil
		}
		return d, err
	})
	switch {
	case err == nil && spent:
		return limiter.Decision{}, limiter.ErrRefunded
	case err != nil:
		return limiter.Decision{}, fmt.Errorf("redis store: policy %s: refund: %w", s.policy, err)
	}
	s.refunded(ctx, req.Key)
	return d, nil
}
