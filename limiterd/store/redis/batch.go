package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// DecideBatch implements limiter.Store. The requests (decisions and peeks) that need Redis
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
		if s.cache != nil && r.Cost > 0 {
			if d, ok := s.cache.get(r.Key, r.Stack, r.Cost, now, r.Limits); ok {
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
	limits := make([][]limiter.Decision, len(reqs)) // where each request's limits are answered
	var spare []limiter.Decision                    // for those of requests that ask for none, to cache
	for _, i := range pending {
		n := reqs[i].Stack.Len()
		switch {
		case reqs[i].Limits != nil:
			limits[i] = reqs[i].Limits
		case s.cache != nil && reqs[i].Cost > 0:
			if len(spare) < n {
				spare = make([]limiter.Decision, limiter.MaxStack*min(len(pending), 64))
			}
			limits[i], spare = spare[:n:n], spare[n:]
		}
	}
	s.guardedBatch(ctx, reqs, pending, limits, now, out)
	for _, i := range pending {
		if out[i].Err != nil {
			out[i].Err = fmt.Errorf("redis store: policy %s: decide: %w", s.policy, out[i].Err)
			continue
		}
		if s.cache != nil && reqs[i].Cost > 0 {
			s.cache.put(reqs[i].Key, reqs[i].Stack, reqs[i].Cost, now, out[i].Decision, limits[i], epoch)
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
	return r.Stack.Len() * (1 + len(r.Key)/keyBytesPerWeight)
}

// guardedBatch runs a batch's pending requests in pieces of at most pieceWeight work, in
// order, each within Options.Timeout of its own and through the circuit breaker as one call. A
// piece that fails fails its requests; a piece that times out starts (or joins) a health check
// of Redis, and the batch goes on only if Redis answers it: otherwise its remaining requests
// fail with errUnhealthy, unsent. So the work of one call to Redis is bounded whatever the
// batch's size, and a caller's slow batch cannot open the breaker (see breaker).
func (s *Store) guardedBatch(ctx context.Context, reqs []limiter.Request, pending []int, limits [][]limiter.Decision, now time.Time, out []limiter.Answer) {
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
			err = s.runBatch(timed, reqs, piece, limits, now, out)
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
// round trips (see DecideBatch). Request i's limits are answered in limits[i] (nil: nowhere).
func (s *Store) runBatch(ctx context.Context, reqs []limiter.Request, pending []int, limits [][]limiter.Decision, now time.Time, out []limiter.Answer) error {
	cn, err := s.c.get()
	if err != nil {
		return err
	}
	cmds := make(rueidis.Commands, 0, len(pending))
	calls := make([]*call, len(pending))
	for j, i := range pending {
		r := reqs[i]
		mode, cost := decideMode(r.Cost)
		c := s.newCall(r.Key, r.Stack, now, cost, mode)
		calls[j] = c
		cmds = append(cmds, cn.B().Evalsha().Sha1(decideScripts.of(c).sha).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(s.callArgs(c)...).Build())
	}
	var again []int // decided after the pipeline, in order (indices into pending)
	for j, res := range cn.DoMulti(ctx, cmds...) {
		i := pending[j]
		arr, err := res.ToArray()
		if err != nil {
			if rerr, ok := rueidis.IsRedisErr(err); ok && rerr.IsNoScript() {
				again = append(again, j)
				continue
			}
			out[i] = limiter.Answer{Err: fmt.Errorf("decision script: %w", err)}
			continue
		}
		d, done, err := calls[j].answer(arr, limits[i])
		if err == nil && !done {
			again = append(again, j) // converted now, decided after the pipeline
			continue
		}
		out[i] = limiter.Answer{Decision: d, Err: err}
	}
	for _, j := range again {
		d, err := s.run(ctx, cn, calls[j], limits[pending[j]])
		out[pending[j]] = limiter.Answer{Decision: d, Err: err}
	}
	return nil
}
