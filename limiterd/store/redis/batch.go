package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
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
// A few requests are sent again after the pipeline, in further rounds of one pipeline each,
// in order, within a Timeout of their own (see batchPiece.resend): those whose script Redis did
// not know (NOSCRIPT, after a restart, a failover or SCRIPT FLUSH; the piece loads the scripts
// once first) and those of a token bucket whose state another strategy wrote (converted as
// Decide converts). Neither changed the client's state in the pipeline, so they are decided on
// the state the pipeline left; only if another caller loads the script, or converts the state,
// during the pipeline can a later request on the same key have been decided before them.
func (s *Store) DecideBatch(ctx context.Context, reqs []limiter.Request, now time.Time, out []limiter.Answer) {
	var epoch uint64
	if s.cache != nil {
		epoch = s.c.trust.epoch.Load() // before the round trip: see cacheTrust
	}
	now = limiter.ClampInstant(now)
	pending := make([]int, 0, len(reqs)) // the requests Redis decides
	for i, r := range reqs {
		if r.Cost < 0 { // refused before Redis, alone (limiter.ErrInvalidCost)
			out[i] = limiter.Answer{Err: limiter.ErrInvalidCost}
			continue
		}
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
// order, each within Options.Timeout of its own (one more for the requests it sends again:
// see runBatch) and through the circuit breaker as one call. A
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
			err = s.runBatch(ctx, reqs, piece, limits, now, out)
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

// runBatch decides a piece's requests: one pipeline within Options.Timeout, then, for the
// requests it left undecided, rounds of their own (see resend). Request i's limits are answered
// in limits[i] (nil: nowhere).
func (s *Store) runBatch(ctx context.Context, reqs []limiter.Request, pending []int, limits [][]limiter.Decision, now time.Time, out []limiter.Answer) error {
	cn, err := s.c.get()
	if err != nil {
		return err
	}
	p := &batchPiece{s: s, cn: cn, reqs: reqs, pending: pending, limits: limits, out: out,
		calls: make([]*call, len(pending))}
	all := make([]int, len(pending))
	for j, i := range pending {
		mode, cost := decideMode(reqs[i].Cost)
		p.calls[j] = s.newCall(reqs[i].Key, reqs[i].Stack, now, cost, mode)
		all[j] = j
	}
	timed, cancel := context.WithTimeout(ctx, s.c.opts.Timeout)
	again := p.send(timed, all)
	cancel()
	if len(again) > 0 {
		p.resend(ctx, again)
	}
	return nil
}

// batchPiece is a piece of a batch being decided: its requests' calls, by index into pending.
type batchPiece struct {
	s       *Store
	cn      *conn
	reqs    []limiter.Request
	pending []int
	limits  [][]limiter.Decision
	out     []limiter.Answer
	calls   []*call

	missing []*script // the scripts Redis answered NOSCRIPT for in the last round
	loaded  []*script // the scripts the piece loaded (SCRIPT LOAD)
}

// send sends the calls which (indices into pending, in order) in one pipeline, answers those
// Redis decided or failed, and returns those left undecided, in order: those whose script
// Redis did not know (NOSCRIPT, gathered in missing), and those whose token-bucket states
// another strategy wrote (converted now, in the calls' arguments).
func (p *batchPiece) send(ctx context.Context, which []int) (again []int) {
	cmds := make(rueidis.Commands, 0, len(which))
	for _, j := range which {
		c := p.calls[j]
		cmds = append(cmds, p.cn.B().Evalsha().Sha1(p.s.lib.decide.of(c).sha).Numkeys(int64(len(c.keys))).Key(c.keys...).Arg(p.s.callArgs(c)...).Build())
	}
	p.missing = p.missing[:0]
	for k, res := range p.cn.DoMulti(ctx, cmds...) {
		j := which[k]
		i := p.pending[j]
		arr, err := res.ToArray()
		if err != nil {
			if rerr, ok := rueidis.IsRedisErr(err); ok && rerr.IsNoScript() {
				sc := p.s.lib.decide.of(p.calls[j])
				if slices.Contains(p.loaded, sc) { // lost again since the piece loaded it
					p.out[i] = limiter.Answer{Err: fmt.Errorf("decision script: lost again after SCRIPT LOAD: %w", err)}
					continue
				}
				if !slices.Contains(p.missing, sc) {
					p.missing = append(p.missing, sc)
				}
				again = append(again, j)
				continue
			}
			p.out[i] = limiter.Answer{Err: fmt.Errorf("decision script: %w", err)}
			continue
		}
		d, done, err := p.calls[j].answer(arr, p.limits[i])
		if err == nil && !done {
			again = append(again, j) // converted now, decided in the next round
			continue
		}
		p.out[i] = limiter.Answer{Decision: d, Err: err}
	}
	return again
}

// resend decides the calls again that the piece's pipeline left undecided, within an
// Options.Timeout of their own: reloading the scripts is the store's own housekeeping after a
// restart, a failover or a SCRIPT FLUSH, and must never by itself make a piece run out of time
// (under failure mode Open, its requests would be admitted). Once, if Redis lost a script, it
// loads the scripts the piece missed (SCRIPT LOAD on every node); then each round re-sends the
// calls still undecided in one pipeline, in their order, so that requests on one key are decided
// in order. A conversion takes a round (the first call on a key converts and writes the state;
// those after it find the state their own), and may need the full script, loaded in its turn;
// after maxConversionAttempts rounds the rest fail with errContended. A call whose script Redis
// loses again after the piece loaded it, or that fails after the reload, fails with a store
// error: a fault of Redis's, which the policy's failure mode answers.
func (p *batchPiece) resend(ctx context.Context, again []int) {
	timed, cancel := context.WithTimeout(ctx, p.s.c.opts.Timeout)
	defer cancel()
	for round := 1; len(again) > 0; round++ {
		if round > maxConversionAttempts {
			p.fail(again, errContended)
			return
		}
		if len(p.missing) > 0 { // at most once a script: those loaded are not missed again
			if err := loadScripts(timed, p.cn, p.missing); err != nil {
				p.fail(again, fmt.Errorf("decision script: load after NOSCRIPT: %w", err))
				return
			}
			p.loaded = append(p.loaded, p.missing...)
		}
		again = p.send(timed, again)
	}
}

// fail answers the calls which with err.
func (p *batchPiece) fail(which []int, err error) {
	for _, j := range which {
		p.out[p.pending[j]] = limiter.Answer{Err: err}
	}
}

// loadScripts loads scripts on every node of cn (SCRIPT LOAD), one round trip a node, the
// nodes at once.
func loadScripts(ctx context.Context, cn *conn, scripts []*script) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for addr, node := range cn.Nodes() {
		wg.Go(func() {
			cmds := make(rueidis.Commands, len(scripts))
			for k, sc := range scripts {
				cmds[k] = node.B().ScriptLoad().Script(sc.source).Build()
			}
			for _, res := range node.DoMulti(ctx, cmds...) {
				if err := res.Error(); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", addr, err))
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
