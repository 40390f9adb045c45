package redis

import (
	"context"
	"crypto/sha1" //nolint:gosec // Redis names scripts by their SHA-1
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

var _ limiter.BatchStore = (*Store)(nil)

// The SHA-1 digests EVALSHA names the decision scripts by.
var (
	tokenBucketSHA   = scriptSHA(tokenBucketSource)
	slidingWindowSHA = scriptSHA(slidingWindowSource)
)

func scriptSHA(source string) string {
	sum := sha1.Sum([]byte(source)) //nolint:gosec // not for security: the script's name in Redis
	return hex.EncodeToString(sum[:])
}

// DecideBatch implements limiter.BatchStore. The requests (decisions and peeks) that need Redis
// are sent in pieces of bounded work (see guardedBatch), one after the other, each as one
// pipeline of EVALSHA calls of the decision scripts, in their order: one write and one round
// trip for a single server, one for each node a Redis Cluster spreads its keys over. Redis runs
// a connection's commands in order, so requests on one key (one slot, one node) are decided in
// order. Unlimited requests and rejections in the reject cache are answered without Redis, as
// Decide answers them. Each piece has an Options.Timeout of its own and goes through the
// circuit breaker as one call: a piece that fails or times out fails its own requests (the
// engine answers them by the policy's failure mode, as it answers a single decision that timed
// out), the requests after a timed-out piece are sent only if Redis answers a health check,
// and a batch's size never makes a piece time out.
//
// A few requests take their own round trips, in order, after the pipeline: those whose script
// Redis did not know (NOSCRIPT, after a restart or SCRIPT FLUSH; they run as Decide runs,
// loading it) and those of a token bucket whose state another strategy wrote (converted as
// Decide converts). Neither changed the client's state in the pipeline, so they are decided on
// the state the pipeline left; only if another caller loads the script, or converts the state,
// during the pipeline can a later request on the same key have been decided before them.
func (s *Store) DecideBatch(ctx context.Context, reqs []limiter.Request, now time.Time, out []limiter.Answer) {
	var epoch uint64
	if s.cache != nil {
		epoch = s.c.trust.epoch.Load() // before the round trip: see cacheTrust
	}
	pending := make([]int, 0, len(reqs)) // the requests Redis decides
	for i, r := range reqs {
		if r.Stack != nil {
			pending = append(pending, i)
			continue
		}
		if r.Limiter.Algorithm() == limiter.AlgorithmUnlimited {
			if r.Cost == 0 {
				out[i] = limiter.Answer{Decision: r.Limiter.Peek(nil, now)}
			} else {
				out[i] = limiter.Answer{Decision: r.Limiter.Decide(nil, now, r.Cost)}
			}
			continue
		}
		if s.cache != nil && r.Cost > 0 {
			if d, ok := s.cache.get(r.Key, r.Limiter, r.Cost, now); ok {
				s.c.cacheHits.Add(1)
				out[i] = limiter.Answer{Decision: d}
				continue
			}
		}
		pending = append(pending, i)
	}
	if len(pending) == 0 {
		return
	}
	s.guardedBatch(ctx, reqs, pending, now, out)
	for _, i := range pending {
		if out[i].Err != nil {
			out[i].Err = fmt.Errorf("redis store: policy %s: decide: %w", s.policy, out[i].Err)
			continue
		}
		if d := out[i].Decision; s.cache != nil && reqs[i].Stack == nil && reqs[i].Cost > 0 && !d.Allowed && d.RetryAfter > 0 {
			s.cache.put(reqs[i].Key, reqs[i].Limiter, reqs[i].Cost, now, d, epoch)
		}
	}
}

// A batch is decided in pieces of bounded work. A request's work is its weight: its limits (one,
// or a stack's) times 1 + len(key)/keyBytesPerWeight, since Redis's time for a limit grows with
// the bytes of its key. A piece holds at most maxPieceWeight, fewer when Options.Timeout is
// short: a piece of pieceCost per weight must fit a quarter of the timeout. Measured (on 2
// shared cores under a load of 25, so at least 5× a quiet machine): a 4-limit stack on a key of
// 1,024 '{' (escaped to 3 KiB; weight 20) took 150-500 µs of Redis time, short keys about a
// fifth of that a limit; so a piece of the costliest requests takes a few ms of a 50 ms
// timeout. The bound also keeps one batch from holding a shared connection for long: other
// decisions go out between its pieces.
const (
	maxPieceWeight    = 128
	keyBytesPerWeight = 256
	pieceCost         = 50 * time.Microsecond
)

// pieceWeight returns the weight a piece of a batch may hold under timeout; a request heavier
// than that goes in a piece of its own.
func pieceWeight(timeout time.Duration) int {
	return int(max(1, min(maxPieceWeight, timeout/4/pieceCost)))
}

// requestWeight returns the work of a batch's request.
func requestWeight(r limiter.Request) int {
	limits := 1
	if r.Stack != nil {
		limits = r.Stack.Len()
	}
	return limits * (1 + len(r.Key)/keyBytesPerWeight)
}

// guardedBatch runs a batch's pending requests in pieces of at most pieceWeight work, in
// order, each within Options.Timeout of its own and through the circuit breaker as one call. A
// piece that fails fails its requests; a piece that times out starts (or joins) a health check
// of Redis, and the batch goes on only if Redis answers it: otherwise its remaining requests
// fail with errUnhealthy, unsent. So the work of one call to Redis is bounded whatever the
// batch's size, and a caller's slow batch cannot open the breaker (see breaker).
func (s *Store) guardedBatch(ctx context.Context, reqs []limiter.Request, pending []int, now time.Time, out []limiter.Answer) {
	budget := pieceWeight(s.c.opts.Timeout)
	for len(pending) > 0 {
		n, weight := 1, requestWeight(reqs[pending[0]]) // a request heavier than budget goes alone
		for n < len(pending) && weight+requestWeight(reqs[pending[n]]) <= budget {
			weight += requestWeight(reqs[pending[n]])
			n++
		}
		piece := pending[:n]
		pending = pending[n:]
		err := s.c.breaker.allow()
		if err == nil {
			timed, cancel := context.WithTimeout(ctx, s.c.opts.Timeout)
			err = s.runBatch(timed, reqs, piece, now, out)
			cancel()
		}
		if err != nil {
			for _, i := range piece {
				out[i] = limiter.Answer{Err: err}
			}
			if errors.Is(err, ErrBreakerOpen) {
				continue // the other pieces fail at once too
			}
		}
		failure := err
		for _, i := range piece {
			if failure == nil {
				failure = out[i].Err
			}
		}
		o := classify(ctx, failure)
		if o == succeeded {
			s.c.breaker.done(succeeded, "")
			continue
		}
		check := s.c.breaker.done(o, s.key(reqs[piece[0]].Key))
		if err := ctx.Err(); err != nil { // the caller gave up: send nothing more
			for _, i := range pending {
				out[i] = limiter.Answer{Err: err}
			}
			return
		}
		if check == nil || len(pending) == 0 {
			continue
		}
		select {
		case <-check.done:
		case <-ctx.Done():
		}
		if err := ctx.Err(); err != nil || check.err != nil {
			if err == nil {
				err = fmt.Errorf("%w: %w", errUnhealthy, check.err)
			}
			for _, i := range pending {
				out[i] = limiter.Answer{Err: err}
			}
			return
		}
	}
}

// runBatch decides a piece's requests: one pipeline, then the requests that need their own
// round trips (see DecideBatch).
func (s *Store) runBatch(ctx context.Context, reqs []limiter.Request, pending []int, now time.Time, out []limiter.Answer) error {
	cn, err := s.c.get()
	if err != nil {
		return err
	}
	nowS, nowN := s.c.nowArgs(now)
	cmds := make(rueidis.Commands, 0, len(pending))
	sent := make([]int, 0, len(pending)) // the requests of cmds
	var stacks map[int]*stackCall        // the stack calls of stacked requests
	for _, i := range pending {
		r := reqs[i]
		mode, cost := requestMode(r)
		if r.Stack != nil {
			c := s.newStackCall(r.Key, r.Stack, now, cost, mode)
			if stacks == nil {
				stacks = make(map[int]*stackCall)
			}
			stacks[i] = c
			cmds = append(cmds, cn.B().Evalsha().Sha1(stackSHA).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(s.stackArgs(c)...).Build())
			sent = append(sent, i)
			continue
		}
		k, p := s.key(r.Key), s.c.prepare(r.Limiter)
		switch rl := r.Limiter.(type) {
		case *limiter.TokenBucket:
			args := tokenBucketArgs(mode, p, nowS, nowN, tokenBucketCost(rl, p, cost, mode), s.c.slackMS)
			cmds = append(cmds, cn.B().Evalsha().Sha1(tokenBucketSHA).Numkeys(1).Key(k).Arg(args...).Build())
		case *limiter.SlidingWindow:
			args := s.slidingWindowArgs(p, nowS, nowN, cost, mode)
			cmds = append(cmds, cn.B().Evalsha().Sha1(slidingWindowSHA).Numkeys(1).Key(k).Arg(args...).Build())
		default:
			out[i] = limiter.Answer{Err: fmt.Errorf("unsupported algorithm %s", r.Limiter.Algorithm())}
			continue
		}
		sent = append(sent, i)
	}
	var again []int // decided after the pipeline, in order
	for j, res := range cn.DoMulti(ctx, cmds...) {
		i := sent[j]
		arr, err := res.ToArray()
		if err != nil {
			if rerr, ok := rueidis.IsRedisErr(err); ok && rerr.IsNoScript() {
				again = append(again, i)
				continue
			}
			out[i] = limiter.Answer{Err: fmt.Errorf("%s script: %w", scriptName(reqs[i]), err)}
			continue
		}
		if c := stacks[i]; c != nil {
			d, done, err := c.answer(arr, reqs[i].Limits)
			if err == nil && !done {
				again = append(again, i) // converted now, decided after the pipeline
				continue
			}
			out[i] = limiter.Answer{Decision: d, Err: err}
			continue
		}
		var d limiter.Decision
		switch rl := reqs[i].Limiter.(type) {
		case *limiter.TokenBucket:
			var raw *string
			mode, cost := requestMode(reqs[i])
			d, raw, _, err = tokenBucketAnswer(arr, rl, cost, mode)
			if err == nil && raw != nil {
				again = append(again, i)
				continue
			}
		case *limiter.SlidingWindow:
			d, err = slidingWindowAnswer(arr, rl)
		}
		out[i] = limiter.Answer{Decision: d, Err: err}
	}
	for _, i := range again {
		if c := stacks[i]; c != nil {
			d, err := s.callStack(ctx, cn, c, reqs[i].Limits)
			out[i] = limiter.Answer{Decision: d, Err: err}
			continue
		}
		mode, cost := requestMode(reqs[i])
		d, err := s.run(ctx, reqs[i].Key, reqs[i].Limiter, now, cost, mode)
		out[i] = limiter.Answer{Decision: d, Err: err}
	}
	return nil
}

// scriptName names the script of a batch's request, for errors.
func scriptName(r limiter.Request) string {
	if r.Stack != nil {
		return "stack"
	}
	return r.Limiter.Algorithm().String()
}

// requestMode returns the script mode and cost of a batch's request: a peek of one unit for a
// cost of 0.
func requestMode(r limiter.Request) (mode, int64) {
	if r.Cost == 0 {
		return modePeek, 1
	}
	return modeDecide, r.Cost
}
