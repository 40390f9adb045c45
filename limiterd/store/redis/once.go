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

// stackOnceSource is stack.lua for refunds that apply at most once (RefundOnce): it takes one
// more key, the refund's record (on the client's slot), and one more argument, the record's
// expiry in milliseconds. A record present answers the status refundedStatus and changes
// nothing; a refund made (outcome tbRefunded, not a conversion request) writes the record in
// the same script call.
var stackOnceSource = `-- RefundOnce: stack.lua with the record of a refund.
local ONCE_KEY, ONCE_TTL_MS = table.remove(KEYS), table.remove(ARGV)
if redis.call('EXISTS', ONCE_KEY) == 1 then return redis.status_reply('` + refundedStatus + `') end
local reply = (function()
` + stackSource + `
end)()
if type(reply) == 'table' and reply[` + strconv.Itoa(stReplyOutcome+1) + `] == ` + strconv.Itoa(tbRefunded) + ` then
  redis.call('SET', ONCE_KEY, '1', 'PX', ONCE_TTL_MS)
end
return reply
`

// refundedStatus is stackOnceSource's answer when the refund's record exists.
const refundedStatus = "REFUNDED"

// errRefundRecorded: the script found the reservation's record and refunded nothing.
var errRefundRecorded = errors.New("refund recorded before")

var stackOnceScript = rueidis.NewLuaScript(stackOnceSource)

// refundSuffix follows a client's key (Store.key) in the Redis key of the record of a refund
// (limiter.Once): "#refund:" and the ID in hex, on the client's slot, and no limit's key (a
// limit's name has no '#').
func refundSuffix(id [16]byte) string { return "#refund:" + hex.EncodeToString(id[:]) }

// RefundOnce implements limiter.Store: one script call checks the refund's record (the
// client's key and refundSuffix), refunds every limit (a single limit as the stack of its one
// limit, named limiter.DefaultLimitName, whose state is the single limit's) and writes the
// record with an expiry at once.Until plus limiter.RefundRecordGrace (and the expiry slack),
// atomically. With ServerClock the refund is made at the server's time. An Unlimited strategy
// has nothing to refund and keeps no record.
func (s *Store) RefundOnce(ctx context.Context, req limiter.Request, now time.Time, once limiter.Once) (limiter.Decision, error) {
	st, out := req.Stack, req.Limits
	if st == nil {
		if req.Limiter.Algorithm() == limiter.AlgorithmUnlimited {
			return req.Limiter.Refund(nil, now, req.Cost), nil
		}
		var err error
		if st, err = limiter.NewStack([]string{limiter.DefaultLimitName}, []limiter.RateLimiter{req.Limiter}); err != nil {
			return limiter.Decision{}, fmt.Errorf("redis store: policy %s: refund: %w", s.policy, err)
		}
		out = make([]limiter.Decision, 1)
	}
	// The grace covers the clock skew between this replica and one that judges the reservation
	// valid later, and a refund's delay (limiter.RefundRecordGrace).
	ttl := strconv.FormatInt(max(1, ceilMS(once.Until.Sub(now)+limiter.RefundRecordGrace)+ceilMS(s.c.opts.ExpirySlack)), 10)
	spent := false // a record found is Redis answering: no failure for the breaker
	d, err := s.throughBreaker(ctx, req.Key, func(ctx context.Context) (limiter.Decision, error) {
		cn, err := s.c.get()
		if err != nil {
			return limiter.Decision{}, err
		}
		c := s.newStackCall(req.Key, st, now, req.Cost, modeRefund)
		record := s.key(req.Key) + refundSuffix(once.ID)
		d, err := c.converge(out, func() ([]rueidis.RedisMessage, error) {
			msg, err := stackOnceScript.Exec(ctx, cn, append(c.keys[:len(c.keys):len(c.keys)], record),
				append(s.stackArgs(c), ttl)).ToMessage()
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
