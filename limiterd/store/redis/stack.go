package redis

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// Decide implements limiter.Store: every limit of the stack, each on its own key of the client's
// slot, is decided in one script, all or nothing (decide.lua), so a rejected request charges no
// limit whichever replica races it; a rejected request writes nothing. A cost of 0 is a peek.
// With ServerClock, now is ignored: the decision is made at the Redis server's time. With a
// reject cache (Options.RejectCache), a rejection is remembered for the client and the stack's
// limits until the first retry time of its rejecting limits, and the same decision (same cost,
// same limits) is answered without Redis meanwhile; peeks are never answered from it, nor are
// the decisions of a stack with a concurrency limit (rejectCache.put). A negative cost is
// refused with limiter.ErrInvalidCost before Redis (no store fault). An instant past the ends
// of limiter.ClampInstant is decided at that end, on either clock. An admission by a stack with
// a concurrency limit names its lease in Decision.Lease (the client's lease counter's next seq).
func (s *Store) Decide(ctx context.Context, key string, st *limiter.Stack, now time.Time, cost int64, out []limiter.Decision) (limiter.Decision, error) {
	if cost < 0 {
		return limiter.Decision{}, limiter.ErrInvalidCost
	}
	now = limiter.ClampInstant(now)
	m, cost := decideMode(cost)
	cacheable := s.cache != nil && m == modeDecide
	var epoch uint64
	if cacheable {
		if d, ok := s.cache.get(key, st, cost, now, out); ok {
			s.c.cacheHits.Add(1)
			return d, nil
		}
		epoch = s.c.trust.epoch.Load() // before the round trip: see cacheTrust
	}
	var own [limiter.MaxStack]limiter.Decision
	if out == nil {
		out = own[:]
	}
	d, err := s.guarded(ctx, key, st, now, cost, m, out)
	if err != nil {
		op := "decide"
		if m == modePeek {
			op = "peek"
		}
		return limiter.Decision{}, fmt.Errorf("redis store: policy %s: %s: %w", s.policy, op, err)
	}
	if cacheable {
		s.cache.put(key, st, cost, now, d, out, epoch)
	}
	return d, nil
}

// decideMode returns the mode of a decision of cost units and the cost the script takes: a peek
// of one unit for a cost of 0.
func decideMode(cost int64) (mode, int64) {
	if cost == 0 {
		return modePeek, 1
	}
	return modeDecide, cost
}

// guarded runs the decision script within the timeout, through the circuit breaker.
func (s *Store) guarded(ctx context.Context, key string, st *limiter.Stack, now time.Time, cost int64, mode mode, out []limiter.Decision) (limiter.Decision, error) {
	return s.throughBreaker(ctx, key, func(ctx context.Context) (limiter.Decision, error) {
		cn, err := s.c.get()
		if err != nil {
			return limiter.Decision{}, err
		}
		return s.run(ctx, cn, s.newCall(key, st, now, cost, mode), out)
	})
}

// run runs a call until its answer needs no conversion.
func (s *Store) run(ctx context.Context, cn *conn, c *call, out []limiter.Decision) (limiter.Decision, error) {
	return c.converge(out, func() ([]rueidis.RedisMessage, error) {
		return s.lib.decide.of(c).lua.Exec(ctx, cn, c.keys, s.callArgs(c)).ToArray()
	})
}

// call is one request's script call: its keys, and the conversions of states that other
// parameters or another algorithm wrote, made after a first call answered them.
type call struct {
	st       *limiter.Stack
	keys     []string
	mode     mode
	cost     int64
	nowS     string
	nowN     string
	converts []conversion // by limit; nil: none yet
	// periodAt is the instant the quotas' periods are computed at: now, or the server's instant
	// that a reply asked for them at (outcomePeriod).
	periodAt time.Time
	// A refund's charge (nil: none named) and the instant, on this replica's clock, that the
	// time elapsed since it is measured at: a token bucket refunds at most what of the charge
	// has not refilled (limiter.TokenBucket.RefundInterval), the same interval in the script's
	// arguments and in the answer Go derives, whichever clock the script runs on.
	refundOf *limiter.Once
	refundAt time.Time
	// refunded, unless nil, receives what a refund added to each limit's remaining units
	// (limiter.Request.Refunded), or the places a release or an extension freed or moved.
	refunded []int64
	// lease names the lease a release or an extension ends (limiter.Once.Lease), passed with
	// its issued instant (refundOf) as the cost argument.
	lease uint64

	algorithms algorithms // of the limits: the script that decides them
}

// conversion is a limit's state converted by Go at the instant the script read it, by the rule
// for parameter changes (a conversion never gives usage back): the state read (from: "" for
// none) and the converted state's arguments (convertS, convertN, convertF): a token bucket's
// TAT (empty: fresh, which the script reads as no TAT), or a sliding window's charge of a token
// bucket's used tokens (the instant, and the units).
type conversion struct {
	from string
	args [3]string
}

func (s *Store) newCall(key string, st *limiter.Stack, now time.Time, cost int64, mode mode) *call {
	n := st.Len()
	c := &call{st: st, keys: make([]string, n, n+1), mode: mode, cost: cost}
	k := s.key(key)
	for i := range n {
		c.keys[i] = k + limitSuffix(st.Name(i))
		switch st.Limiter(i).Algorithm() {
		case limiter.AlgorithmTokenBucket:
			c.algorithms |= withTokenBucket
		case limiter.AlgorithmQuota:
			c.algorithms |= withQuota
		case limiter.AlgorithmSlidingWindow:
			c.algorithms |= withSlidingWindow
		case limiter.AlgorithmConcurrency:
			c.algorithms |= withConcurrency
		case limiter.AlgorithmUnlimited: // a stack holds none
		}
	}
	if st.HasLeases() {
		c.keys = append(c.keys, k+leaseSuffix) // the client's lease counter, last
	}
	c.nowS, c.nowN = s.c.nowArgs(now)
	c.periodAt = now
	return c
}

// converge runs exec, the call's script on its keys and arguments as they stand, until the
// answer needs no conversion (each answer that needs one updates the call's arguments).
func (c *call) converge(out []limiter.Decision, exec func() ([]rueidis.RedisMessage, error)) (limiter.Decision, error) {
	for range maxConversionAttempts {
		arr, err := exec()
		if err != nil {
			return limiter.Decision{}, fmt.Errorf("decision script: %w", err)
		}
		d, done, err := c.answer(arr, out)
		if err != nil || done {
			return d, err
		}
	}
	return limiter.Decision{}, errContended
}

// callArgs returns the decision script's arguments for a call.
func (s *Store) callArgs(c *call) []string {
	n, size := c.st.Len(), args
	for i := range n {
		switch c.st.Limiter(i).Algorithm() {
		case limiter.AlgorithmTokenBucket:
			size += tbArgs
		case limiter.AlgorithmQuota:
			size += qtArgs
		case limiter.AlgorithmSlidingWindow:
			size += swArgs
		case limiter.AlgorithmConcurrency:
			size += ccArgs
		case limiter.AlgorithmUnlimited: // a stack holds none
		}
		if c.converts != nil && c.converts[i].from != "" {
			size += convertArgs
		}
	}
	a := make([]string, args, size)
	a[argMode], a[argNowS], a[argNowN] = string(c.mode), c.nowS, c.nowN
	a[argCost], a[argSlackMS], a[argRebase] = strconv.FormatInt(c.cost, 10), s.c.slackMS, s.c.rebase
	if c.mode == modeRelease || c.mode == modeExtend { // the lease: its seq and issued instant
		sec, ns := issuedArgs(c.refundOf)
		a[argCost] = strconv.FormatUint(c.lease, 10) + " " + sec + " " + ns
	}
	for i := range n {
		rl := c.st.Limiter(i)
		p := s.c.prepare(rl)
		switch rl := rl.(type) {
		case *limiter.TokenBucket:
			inc := tokenBucketCost(rl, p, c.cost, c.mode)
			if c.mode == modeRefund && c.refundOf != nil && c.refundOf.Cost > 0 {
				inc = limbs(rl.RefundInterval(c.cost, *c.refundOf, c.refundAt))
			}
			a = append(a, algTokenBucket, p.fp, p.rate, p.tau[0], p.tau[1], p.tau[2], inc[0], inc[1], inc[2])
		case *limiter.SlidingWindow:
			a = append(a, algSlidingWindow, p.fp, p.limit, p.window)
		case *limiter.Quota:
			start, end := quotaPeriodArgs(rl, p, c.periodAt)
			a = append(a, algQuota, p.fp, p.limit, start, end)
		case *limiter.Concurrency:
			a = append(a, algConcurrency, p.fp, p.limit, p.window)
		}
	}
	for i := range c.converts {
		if cv := &c.converts[i]; cv.from != "" {
			a = append(a, strconv.Itoa(i+1), cv.from, cv.args[0], cv.args[1], cv.args[2])
		}
	}
	return a
}

// answer reads the decision script's answer into out (nil: none) and returns the decision of every limit;
// done is false when states must be converted first (c.converts is then set, for the next
// call).
func (c *call) answer(arr []rueidis.RedisMessage, out []limiter.Decision) (d limiter.Decision, done bool, err error) {
	var own [limiter.MaxStack]limiter.Decision
	if out == nil {
		out = own[:]
	}
	n := c.st.Len()
	size := replyLimits + n*limitReply
	if len(arr) < size {
		return d, false, fmt.Errorf("decision script: malformed answer: %d elements for %d limits", len(arr), n)
	}
	head, err := integers(arr, replyLimits)
	if err != nil {
		return d, false, fmt.Errorf("decision script: malformed answer: %w", err)
	}
	outcome := head[replyOutcome]
	// A refund's answer adds, after the blocks, what each sliding window's refund gave back, a
	// release's or an extension's the places each concurrency limit freed or moved; and on a
	// stack with a concurrency limit, every answer but a request for conversions or periods
	// ends with the seq of the lease taken (0: none).
	var gained []int64
	want := size
	if outcome == outcomeRefunded || outcome == outcomeReleased {
		want += n
	}
	leases := c.st.HasLeases() && outcome != outcomeConvert && outcome != outcomePeriod
	if leases {
		want++
	}
	if len(arr) != want {
		return d, false, fmt.Errorf("decision script: malformed answer: %d elements for %d limits, outcome %d", len(arr), n, outcome)
	}
	if want > size {
		if gained, err = integers(arr[size:], want-size); err != nil {
			return d, false, fmt.Errorf("decision script: malformed answer: %w", err)
		}
	}
	var seq int64 // the lease taken
	if leases {
		if seq = gained[len(gained)-1]; seq < 0 {
			return d, false, fmt.Errorf("decision script: malformed answer: lease %d", seq)
		}
		gained = gained[:len(gained)-1]
	}
	if len(gained) == 0 {
		gained = nil
	}
	leaseOp := c.mode == modeRelease || c.mode == modeExtend
	var refunded [limiter.MaxStack]int64
	decides := c.mode == modeDecide
	switch {
	case outcome == outcomeConvert:
	case outcome == outcomePeriod && decides:
		// The server's instant lies outside the periods passed: compute them at it.
		at := time.Unix(head[replyNowS], head[replyNowN])
		if at.Equal(c.periodAt) {
			return d, false, fmt.Errorf("decision script: asks for the periods at %v again", at)
		}
		c.periodAt = at
		return d, false, nil
	case decides && (outcome == outcomeAdmitted || outcome == outcomeRejected),
		c.mode == modePeek && outcome == outcomePeeked, c.mode == modeRefund && outcome == outcomeRefunded,
		leaseOp && outcome == outcomeReleased:
	default:
		return d, false, fmt.Errorf("decision script: outcome %d in mode %s", outcome, c.mode)
	}
	at := time.Unix(head[replyNowS], head[replyNowN])
	var states [limiter.MaxStack]limiter.State // the token buckets' states decided on
	allowed := true
	for i := range n {
		block := arr[replyLimits+i*limitReply : replyLimits+(i+1)*limitReply]
		switch rl := c.st.Limiter(i).(type) {
		case *limiter.TokenBucket:
			b, err := tokenBucketState(block, rl)
			if err != nil {
				return d, false, fmt.Errorf("decision script: limit %q: %w", c.st.Name(i), err)
			}
			if outcome == outcomeConvert {
				if b.raw != nil {
					c.convert(i, conversionOf(rl, b, at))
				}
				continue
			}
			states[i] = b.state
			m := c.mode
			if m == modeRefund && b.charged || leaseOp {
				m = modePeek // another algorithm's state, converted: nothing to refund; a release touches no rate
			}
			state := b.state
			if m == modeRefund && c.refundOf != nil && c.refundOf.Cost > 0 {
				ns, frac := rl.RefundInterval(c.cost, *c.refundOf, c.refundAt)
				out[i] = rl.RefundBy(&state, at, ns, frac)
			} else {
				out[i] = applyOn(rl, &state, at, c.cost, m)
			}
			if m == modeRefund {
				refunded[i] = max(0, out[i].Remaining-rl.Peek(&b.state, at).Remaining)
			}
		case *limiter.Quota:
			b, err := quotaState(block, rl)
			if err != nil {
				return d, false, fmt.Errorf("decision script: limit %q: %w", c.st.Name(i), err)
			}
			if outcome == outcomeConvert {
				if b.raw != nil {
					c.convert(i, quotaConversionOf(rl, b, at))
				}
				continue
			}
			states[i] = b.state
			m := c.mode
			if m == modeRefund && b.charged || leaseOp {
				m = modePeek // a sliding window's log, converted: nothing to refund; a release touches no rate
			}
			state := b.state
			out[i] = applyOn(rl, &state, at, c.cost, m)
			if m == modeRefund {
				refunded[i] = max(0, out[i].Remaining-rl.Peek(&b.state, at).Remaining)
			}
		case *limiter.SlidingWindow, *limiter.Concurrency:
			// A concurrency limit's block is a sliding window's: its decision, computed by the
			// script, or another algorithm's state to charge first.
			if outcome == outcomeConvert {
				raw, err := slidingWindowRaw(block)
				if err != nil {
					return d, false, fmt.Errorf("decision script: limit %q: %w", c.st.Name(i), err)
				}
				if raw != nil {
					c.convert(i, chargeOf(*raw, head[replyNowS], head[replyNowN], at))
					continue
				}
			}
			ints, err := integers(block, limitReply)
			if err == nil && ints[replyAdmitted] != swAdmitted && ints[replyAdmitted] != swRejected {
				err = fmt.Errorf("admitted is %d", ints[replyAdmitted])
			}
			if err != nil {
				return d, false, fmt.Errorf("decision script: limit %q: malformed answer: %w", c.st.Name(i), err)
			}
			out[i] = limiter.Decision{
				Allowed:    ints[replyAdmitted] == swAdmitted,
				Limit:      rl.Limit(),
				Remaining:  ints[replyRemaining],
				ResetAfter: time.Duration(ints[replyResetAfter]),
				RetryAfter: time.Duration(ints[replyRetryAfter]),
			}
			if gained != nil {
				refunded[i] = max(0, gained[i])
			}
			if _, ok := rl.(*limiter.Concurrency); ok && seq > 0 && (decides && out[i].Allowed || leaseOp && refunded[i] > 0) {
				out[i].Lease = uint64(seq) // an admission's lease, shared by the stack's, or an extension's
			}
		}
		allowed = allowed && out[i].Allowed
	}
	if outcome == outcomeConvert {
		if c.converts == nil {
			return d, false, errors.New("decision script: asks for a conversion of no state")
		}
		return d, false, nil
	}
	if decides {
		if allowed != (outcome == outcomeAdmitted) {
			return d, false, fmt.Errorf("%w: the script says %d, the limits %+v", errInconsistent, outcome, out[:n])
		}
		if !allowed { // nothing was charged: a bucket that admitted answers its state as it is
			for i := range n {
				if rl := c.st.Limiter(i); compactState(rl) && out[i].Allowed {
					out[i] = limiter.UnchargedDecision(rl, &states[i], at)
				}
			}
		}
	}
	if c.refunded != nil {
		copy(c.refunded[:n], refunded[:n])
	}
	d, _ = limiter.Combine(out[:n])
	return d, true, nil
}

// compactState reports whether Go derives rl's decision from the state the script answers (a
// token bucket, a quota), not the script (a sliding window, a concurrency limit).
func compactState(rl limiter.RateLimiter) bool {
	a := rl.Algorithm()
	return a == limiter.AlgorithmTokenBucket || a == limiter.AlgorithmQuota
}

// convert sets limit i's conversion for the next call.
func (c *call) convert(i int, cv conversion) {
	if c.converts == nil {
		c.converts = make([]conversion, c.st.Len())
	}
	c.converts[i] = cv
}

// tokenBucketBlock is a token bucket's block of the decision script's answer: the state decided
// on (charged: converted from another algorithm's state), or the raw state another strategy
// wrote, with used >= 0 the units a sliding window's log holds.
type tokenBucketBlock struct {
	state   limiter.State
	charged bool
	raw     *string
	used    int64
}

// readBlock reads what a block of the decision script's answer says of the state the script
// found, for any algorithm: none (fresh), the raw state another strategy wrote (with the units a
// sliding window's log holds), or, with own, the limit's own state (charged: converted from
// another algorithm's state), which the caller reads from the block's algorithm's fields.
func readBlock(block []rueidis.RedisMessage) (b tokenBucketBlock, own bool, err error) {
	b.used = -1
	state, err := block[replyState].AsInt64()
	if err != nil {
		return b, false, fmt.Errorf("malformed state: %w", err)
	}
	switch state {
	case stateFresh:
		return b, false, nil
	case stateRaw, stateUsed:
		raw, err := block[replyRaw].ToString()
		if err != nil {
			return b, false, fmt.Errorf("malformed raw state: %w", err)
		}
		b.raw = &raw
		if state == stateUsed {
			if b.used, err = block[replyUsed].AsInt64(); err != nil || b.used < 0 {
				return b, false, fmt.Errorf("malformed used units %d: %v", b.used, err)
			}
		}
		return b, false, nil
	case stateTAT, stateCharged:
		b.charged = state == stateCharged
		return b, true, nil
	}
	return b, false, fmt.Errorf("state %d", state)
}

// tokenBucketState reads a token bucket's block of the decision script's answer.
func tokenBucketState(block []rueidis.RedisMessage, rl *limiter.TokenBucket) (tokenBucketBlock, error) {
	b, own, err := readBlock(block)
	if err != nil || !own {
		return b, err
	}
	if b.state, err = stateAtTAT(rl, block[replyTATS:]); err != nil {
		return b, fmt.Errorf("malformed state: %w", err)
	}
	return b, nil
}

// conversionOf converts the raw state of b, which another strategy wrote, to rl's parameters at
// the instant the script read it, as limiter.TokenBucket converts it: another token bucket's
// debt carried, a sliding window's used units charged; a state no known token bucket wrote is
// fresh.
func conversionOf(rl *limiter.TokenBucket, b tokenBucketBlock, at time.Time) conversion {
	raw := *b.raw
	if used, ok := leasesUsed(raw, at); ok {
		b.used = used
	}
	if b.used > 0 {
		charged := rl.Charged(b.used, at)
		return conversion{from: raw, args: limbs(charged.TAT())}
	}
	old, known := parseState(raw)
	if b.used >= 0 || !known {
		return conversion{from: raw}
	}
	converted := rl.Convert(old, at)
	return conversion{from: raw, args: limbs(converted.TAT())}
}

// slidingWindowRaw reads, from a sliding window's block of an answer that asks for conversions,
// the raw state another algorithm wrote (nil: none to convert).
func slidingWindowRaw(block []rueidis.RedisMessage) (*string, error) {
	state, err := block[replyState].AsInt64()
	if err != nil || state != stateRaw {
		return nil, nil //nolint:nilerr // a decision, read as one by the caller
	}
	raw, err := block[replyRaw].ToString()
	if err != nil {
		return nil, fmt.Errorf("malformed raw state: %w", err)
	}
	return &raw, nil
}

// chargeOf converts a raw state a token bucket wrote under a sliding window's key, read at the
// instant (sec, ns) = at: its used tokens (limiter.UsedUnits) are charged to the window as one
// entry at that instant; a state no known token bucket wrote is fresh.
func chargeOf(raw string, sec, ns int64, at time.Time) conversion {
	var used int64
	if old, known := parseState(raw); known {
		used = limiter.UsedUnits(old, at)
	} else if u, ok := leasesUsed(raw, at); ok {
		used = u
	}
	return conversion{from: raw, args: [3]string{strconv.FormatInt(sec, 10), strconv.FormatInt(ns, 10), strconv.FormatInt(used, 10)}}
}

// quotaState reads a quota's block of the decision script's answer: as a token bucket's
// (tokenBucketBlock), with the state a count in a period.
func quotaState(block []rueidis.RedisMessage, rl *limiter.Quota) (tokenBucketBlock, error) {
	b, own, err := readBlock(block)
	if err != nil || !own {
		return b, err
	}
	ints, err := integers(block[replyQuotaEnd:], 2)
	if err == nil && (ints[1] < 0 || ints[1] > limiter.MaxQuotaLimit ||
		ints[0] > math.MaxInt64/int64(time.Second) || ints[0] < math.MinInt64/int64(time.Second)) {
		err = fmt.Errorf("count %v out of range", ints)
	}
	if err != nil {
		return b, fmt.Errorf("malformed state: %w", err)
	}
	b.state = rl.StateAt(ints[0]*int64(time.Second), ints[1])
	return b, nil
}

// quotaConversionOf converts the raw state of b, which another strategy wrote, to rl's
// parameters at the instant the script read it, as limiter.Quota converts it: another quota's
// count carried, another algorithm's used units charged (a sliding window's log, b.used); a
// state no known strategy wrote is fresh. The converted count's end is a period's boundary: whole
// seconds.
func quotaConversionOf(rl *limiter.Quota, b tokenBucketBlock, at time.Time) conversion {
	raw := *b.raw
	if used, ok := leasesUsed(raw, at); ok {
		b.used = used
	}
	var st limiter.State
	switch old, known := parseState(raw); {
	case b.used > 0:
		_, end := rl.Period(at)
		st = rl.StateAt(end*int64(time.Second), b.used)
	case b.used < 0 && known:
		st = rl.Convert(old, at)
	}
	end, used := st.TAT()
	if used == 0 {
		return conversion{from: raw} // fresh
	}
	return conversion{from: raw, args: [3]string{strconv.FormatInt(floorDiv(end, int64(time.Second)), 10), strconv.FormatUint(used, 10), ""}}
}

// leasesUsed reads a raw state that a concurrency limit wrote, as a script answers it ("cc", then
// each lease's member, "<ns> <seq> <places>", and score, the second of its expiry: ccLoad), and
// returns the places its leases hold at at, which another algorithm is charged
// (limiter.Concurrency's usedUnits); false for another state.
func leasesUsed(raw string, at time.Time) (int64, bool) {
	f := strings.Fields(raw)
	if len(f) == 0 || f[0] != "cc" || (len(f)-1)%4 != 0 {
		return 0, false
	}
	t := at.UnixNano()
	var used int64
	for i := 1; i < len(f); i += 4 {
		ns, err1 := strconv.ParseInt(f[i], 10, 64)
		places, err2 := strconv.ParseInt(f[i+2], 10, 64)
		sec, err3 := strconv.ParseInt(f[i+3], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil || places < 0 || ns < 0 || ns >= 1e9 ||
			sec > math.MaxInt64/int64(time.Second)-1 || sec < math.MinInt64/int64(time.Second)+1 {
			return 0, false
		}
		if sec*1e9+ns > t {
			used += places
		}
	}
	return used, true
}

// floorDiv returns a/b rounded down (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}
