package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

var (
	//go:embed stack.lua
	stackSource string

	stackScript = rueidis.NewLuaScript(stackSource)
	stackSHA    = scriptSHA(stackSource)
)

// DecideStack implements limiter.Store: every limit of the stack, each on its own key of the
// client's slot, is decided in one script, all or nothing (stack.lua), so a rejected request
// charges no limit whichever replica races it. A cost of 0 is a peek. With ServerClock, now is
// ignored. Stacked decisions are not answered from the reject cache.
func (s *Store) DecideStack(ctx context.Context, key string, st *limiter.Stack, now time.Time, cost int64, out []limiter.Decision) (limiter.Decision, error) {
	mode := modeDecide
	if cost == 0 {
		mode, cost = modePeek, 1
	}
	d, err := s.guardedStack(ctx, key, st, now, cost, mode, out)
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("redis store: policy %s: decide: %w", s.policy, err)
	}
	return d, nil
}

// RefundStack implements limiter.Store: one script returns the units to every limit, atomically
// with the client's decisions. With a reject cache, every replica's cache then forgets the
// client, as after Refund.
func (s *Store) RefundStack(ctx context.Context, key string, st *limiter.Stack, now time.Time, amount int64, out []limiter.Decision) (limiter.Decision, error) {
	d, err := s.guardedStack(ctx, key, st, now, amount, modeRefund, out)
	if err != nil {
		return limiter.Decision{}, fmt.Errorf("redis store: policy %s: refund: %w", s.policy, err)
	}
	s.refunded(ctx, key)
	return d, nil
}

// guardedStack runs the stack script within the timeout, through the circuit breaker.
func (s *Store) guardedStack(ctx context.Context, key string, st *limiter.Stack, now time.Time, cost int64, mode mode, out []limiter.Decision) (limiter.Decision, error) {
	return s.throughBreaker(ctx, key, func(ctx context.Context) (limiter.Decision, error) {
		return s.runStack(ctx, key, st, now, cost, mode, out)
	})
}

// stackCall is one stack request's script call: its keys, and the conversions of token-bucket
// states that other parameters wrote, made after a first call answered them.
type stackCall struct {
	st       *limiter.Stack
	keys     []string
	mode     mode
	cost     int64
	nowS     string
	nowN     string
	converts []conversion // by limit; nil: none yet
}

// conversion is a token bucket's state converted by Go: the state read (from: "" for none) and
// the TAT it converts to at the instant the script read it (empty: fresh, which the script
// reads as no TAT).
type conversion struct {
	from string
	tat  [3]string
}

func (s *Store) newStackCall(key string, st *limiter.Stack, now time.Time, cost int64, mode mode) *stackCall {
	c := &stackCall{st: st, keys: make([]string, st.Len()), mode: mode, cost: cost}
	k := s.key(key)
	for i := range c.keys {
		c.keys[i] = k + limitSuffix(st.Name(i))
	}
	c.nowS, c.nowN = s.c.nowArgs(now)
	return c
}

// runStack decides, peeks or refunds a stack by the stack script: a second call, and rarely
// more, when token-bucket states need converting first.
func (s *Store) runStack(ctx context.Context, key string, st *limiter.Stack, now time.Time, cost int64, mode mode, out []limiter.Decision) (limiter.Decision, error) {
	cn, err := s.c.get()
	if err != nil {
		return limiter.Decision{}, err
	}
	return s.callStack(ctx, cn, s.newStackCall(key, st, now, cost, mode), out)
}

// callStack runs a stack call until its answer needs no conversion.
func (s *Store) callStack(ctx context.Context, cn *conn, c *stackCall, out []limiter.Decision) (limiter.Decision, error) {
	return c.converge(out, func() ([]rueidis.RedisMessage, error) {
		return stackScript.Exec(ctx, cn, c.keys, s.stackArgs(c)).ToArray()
	})
}

// converge runs exec, the call's script on its keys and arguments as they stand, until the
// answer needs no conversion (each answer that needs one updates the call's arguments).
func (c *stackCall) converge(out []limiter.Decision, exec func() ([]rueidis.RedisMessage, error)) (limiter.Decision, error) {
	for range maxConversionAttempts {
		arr, err := exec()
		if err != nil {
			return limiter.Decision{}, fmt.Errorf("stack script: %w", err)
		}
		d, done, err := c.answer(arr, out)
		if err != nil || done {
			return d, err
		}
	}
	return limiter.Decision{}, errContended
}

// stackArgs returns the stack script's arguments for a call.
func (s *Store) stackArgs(c *stackCall) []string {
	n := c.st.Len()
	args := make([]string, stArgs+n*stLimitArgs)
	args[stArgMode], args[stArgNowS], args[stArgNowN] = string(c.mode), c.nowS, c.nowN
	args[stArgCost], args[stArgSlackMS], args[stArgRebase] = strconv.FormatInt(c.cost, 10), s.c.slackMS, rebaseThreshold
	args[stArgLimits] = strconv.Itoa(n)
	for i := range n {
		a := args[stArgs+i*stLimitArgs : stArgs+(i+1)*stLimitArgs]
		rl := c.st.Limiter(i)
		p := s.c.prepare(rl)
		a[stLimitFingerprint] = p.fp
		switch rl := rl.(type) {
		case *limiter.TokenBucket:
			inc := tokenBucketCost(rl, p, c.cost, c.mode)
			a[stLimitAlgorithm], a[stLimitRate] = stTokenBucket, p.rate
			a[stLimitTauS], a[stLimitTauN], a[stLimitTauF] = p.tau[0], p.tau[1], p.tau[2]
			a[stLimitCostS], a[stLimitCostN], a[stLimitCostF] = inc[0], inc[1], inc[2]
			if c.converts != nil && c.converts[i].from != "" {
				cv := &c.converts[i]
				a[stLimitConvertFrom] = cv.from
				a[stLimitConvertS], a[stLimitConvertN], a[stLimitConvertF] = cv.tat[0], cv.tat[1], cv.tat[2]
			}
		case *limiter.SlidingWindow:
			a[stLimitAlgorithm], a[stLimitLimit], a[stLimitWindow] = stSlidingWindow, p.limit, p.window
		}
	}
	return args
}

// answer reads the stack script's answer into out and returns the stack's decision; done is
// false when token-bucket states must be converted first (c.converts is then set, for the next
// call).
func (c *stackCall) answer(arr []rueidis.RedisMessage, out []limiter.Decision) (d limiter.Decision, done bool, err error) {
	n := c.st.Len()
	if len(arr) != stReplyLimits+n*stLimitReply {
		return d, false, fmt.Errorf("stack script: malformed answer: %d elements for %d limits", len(arr), n)
	}
	head, err := integers(arr, stReplyLimits)
	if err != nil {
		return d, false, fmt.Errorf("stack script: malformed answer: %w", err)
	}
	outcome := head[stReplyOutcome]
	switch {
	case outcome == tbConvert:
	case c.mode == modeDecide && (outcome == tbAdmitted || outcome == tbRejected),
		c.mode == modePeek && outcome == stPeeked, c.mode == modeRefund && outcome == tbRefunded:
	default:
		return d, false, fmt.Errorf("stack script: outcome %d in mode %s", outcome, c.mode)
	}
	at := time.Unix(head[stReplyNowS], head[stReplyNowN])
	var states [limiter.MaxStack]limiter.State // the token buckets' states decided on
	allowed := true
	for i := range n {
		block := arr[stReplyLimits+i*stLimitReply : stReplyLimits+(i+1)*stLimitReply]
		switch rl := c.st.Limiter(i).(type) {
		case *limiter.TokenBucket:
			state, raw, err := stackTokenBucketState(block, rl)
			if err != nil {
				return d, false, fmt.Errorf("stack script: limit %q: %w", c.st.Name(i), err)
			}
			if outcome == tbConvert {
				if raw != nil {
					if c.converts == nil {
						c.converts = make([]conversion, n)
					}
					c.converts[i] = conversionOf(rl, *raw, at)
				}
				continue
			}
			states[i] = state
			out[i] = applyOn(rl, &state, at, c.cost, c.mode)
		case *limiter.SlidingWindow:
			ints, err := integers(block, stLimitReply)
			if err == nil && ints[stReplyAdmitted] != swAdmitted && ints[stReplyAdmitted] != swRejected {
				err = fmt.Errorf("admitted is %d", ints[stReplyAdmitted])
			}
			if err != nil {
				return d, false, fmt.Errorf("stack script: limit %q: malformed answer: %w", c.st.Name(i), err)
			}
			out[i] = limiter.Decision{
				Allowed:    ints[stReplyAdmitted] == swAdmitted,
				Limit:      rl.Limit(),
				Remaining:  ints[stReplyRemaining],
				ResetAfter: time.Duration(ints[stReplyResetAfter]),
				RetryAfter: time.Duration(ints[stReplyRetryAfter]),
			}
		}
		allowed = allowed && out[i].Allowed
	}
	if outcome == tbConvert {
		if c.converts == nil {
			return d, false, errors.New("stack script: asks for a conversion of no state")
		}
		return d, false, nil
	}
	if c.mode == modeDecide {
		if allowed != (outcome == tbAdmitted) {
			return d, false, fmt.Errorf("%w: the stack script says %d, the limits %+v", errInconsistent, outcome, out[:n])
		}
		if !allowed { // nothing was charged: a bucket that admitted answers its state as it is
			for i := range n {
				if rl, ok := c.st.Limiter(i).(*limiter.TokenBucket); ok && out[i].Allowed {
					out[i] = limiter.UnchargedDecision(rl, &states[i], at)
				}
			}
		}
	}
	d, _ = limiter.Combine(out[:n])
	return d, true, nil
}

// stackTokenBucketState reads a token bucket's block of the stack script's answer: the state
// decided on, or the raw state another strategy wrote.
func stackTokenBucketState(block []rueidis.RedisMessage, rl *limiter.TokenBucket) (limiter.State, *string, error) {
	state, err := block[stReplyState].AsInt64()
	if err != nil {
		return limiter.State{}, nil, fmt.Errorf("malformed state: %w", err)
	}
	switch state {
	case tbStateFresh:
		return limiter.State{}, nil, nil
	case tbStateRaw:
		raw, err := block[stReplyRaw].ToString()
		if err != nil {
			return limiter.State{}, nil, fmt.Errorf("malformed raw state: %w", err)
		}
		return limiter.State{}, &raw, nil
	case tbStateTAT:
		st, err := stateAtTAT(rl, block[stReplyTATS:])
		if err != nil {
			return limiter.State{}, nil, fmt.Errorf("malformed state: %w", err)
		}
		return st, nil, nil
	}
	return limiter.State{}, nil, fmt.Errorf("state %d", state)
}

// conversionOf converts a raw state another strategy wrote to rl's parameters at the instant the
// script read it, as limiter.TokenBucket converts it: a state no known token bucket wrote is
// fresh.
func conversionOf(rl *limiter.TokenBucket, raw string, at time.Time) conversion {
	old, known := parseTokenBucketState(raw)
	if !known {
		return conversion{from: raw}
	}
	converted := rl.Convert(old, at)
	return conversion{from: raw, tat: limbs(converted.TAT())}
}
