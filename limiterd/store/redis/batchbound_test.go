package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// worstStack is a 4-limit stack whose first limit admits 5.
func worstStack(t *testing.T) *limiter.Stack {
	return limitertest.Stack("a", tokenBucket(t, 5, 1, time.Hour), "b", slidingWindow(t, 50, time.Minute),
		"c", tokenBucket(t, 500, 1, time.Second), "d", slidingWindow(t, 5000, 24*time.Hour))
}

// TestLargeBatchIsDecidedByRedis sends a batch far larger than one timeout's worth of Redis
// work: 20,000 decisions of a 4-limit stack on a key of 1,024 '{' (escaped to 3 KiB, four keys
// each), about 1.1 s of Redis time on a quiet machine, under a timeout of 1 s (long, so that a
// starved CPU on a shared test machine fails no piece). Every decision is Redis's, none an
// error for the failure mode to answer: the client admits exactly its limit of 5, the breaker
// never opens, and an unrelated client is decided by Redis afterwards. Before batches were cut
// into pieces, the whole batch shared one deadline: every item failed (Open admitted all), and
// a few such batches opened the breaker for every policy.
func TestLargeBatchIsDecidedByRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := newClient(t, Options{Addrs: []string{srv.Addr()}, Timeout: time.Second})
	s := c.Store(t.Name())
	st := worstStack(t)
	key := strings.Repeat("{", 1024)
	const batches, items = 1, 20_000
	admitted, failed := 0, 0
	var firstErr error
	for range batches {
		reqs := make([]limiter.Request, items)
		for i := range reqs {
			reqs[i] = limiter.Request{Key: key, Stack: st, Limits: make([]limiter.Decision, st.Len()), Cost: 1}
		}
		out := make([]limiter.Answer, len(reqs))
		s.DecideBatch(t.Context(), reqs, time.Now(), out)
		for _, a := range out {
			switch {
			case a.Err != nil:
				failed++
				if firstErr == nil {
					firstErr = a.Err
				}
			case a.Allowed:
				admitted++
			}
		}
	}
	if failed > 0 || admitted != 5 {
		t.Errorf("%d batches of %d: %d admitted by Redis, %d failed (first: %v); want 5 admitted, none failed",
			batches, items, admitted, failed, firstErr)
	}
	if c.BreakerTrips() != 0 {
		t.Errorf("the breaker opened %d times", c.BreakerTrips())
	}
	if _, err := c.Store("other").Decide(t.Context(), "unrelated", limitertest.One(tokenBucket(t, 5, 1, time.Hour)), time.Now(), 1, nil); err != nil {
		t.Errorf("an unrelated client after the batches: %v", err)
	}
}

// TestBatchPiecesKeepOrder decides a batch of many pieces on one key: the requests are decided
// in order, the first ones admitted up to the limit, across pieces.
func TestBatchPiecesKeepOrder(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	s := c.Store(t.Name())
	sw := slidingWindow(t, 300, time.Hour)
	st := limitertest.Stack("a", tokenBucket(t, 300, 1, time.Hour), "b", sw)
	reqs := make([]limiter.Request, 1000)
	for i := range reqs {
		reqs[i] = limiter.Request{Key: "k", Stack: limitertest.One(sw), Cost: 1}
		if i%2 == 1 {
			reqs[i] = limiter.Request{Key: "s", Stack: st, Limits: make([]limiter.Decision, st.Len()), Cost: 1}
		}
	}
	if n := pieceWeight(c.opts.Timeout); len(reqs) < 3*n {
		t.Fatalf("a batch of %d requests fits in %d pieces of weight %d: want several", len(reqs), len(reqs)/n, n)
	}
	out := make([]limiter.Answer, len(reqs))
	s.DecideBatch(t.Context(), reqs, limitertest.T0, out)
	for i, a := range out {
		if a.Err != nil {
			t.Fatalf("request %d: %v", i, a.Err)
		}
		if want := i/2 < 300; a.Allowed != want {
			t.Fatalf("request %d: allowed %t, want %t", i, a.Allowed, want)
		}
	}
}

// TestStallDoesNotOpenBreaker stalls Redis (CLIENT PAUSE ALL) for longer than the timeout under
// load: the calls waiting meanwhile time out, but Redis answers the health check they start, so
// the breaker stays closed and the other clients keep being decided by Redis. Before, every
// timed-out call counted as a failure, and one stall opened the breaker for every policy.
func TestStallDoesNotOpenBreaker(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 50 * time.Millisecond
	c := newClient(t, Options{Addrs: []string{srv.Addr()}, Timeout: timeout})
	s := c.Store(t.Name())
	rl := tokenBucket(t, 1_000_000, 1_000_000, time.Second)
	var (
		ok, timedOut atomic.Int64
		stop         = make(chan struct{})
		wg           sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.Decide(context.Background(), fmt.Sprintf("k-%d-%d", w, i%50), limitertest.One(rl), time.Now(), 1, nil)
				if err == nil {
					ok.Add(1)
				} else {
					timedOut.Add(1)
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	// The waits are bounded so that a stall which makes no call time out fails the test with
	// its reason instead of hanging it.
	testsupport.Eventually(t, 30*time.Second, "100 decisions before the stalls", func() bool { return ok.Load() >= 100 })
	for range 3 {
		before := timedOut.Load()
		// 200 ms, four times the timeout. CLIENT PAUSE, not DEBUG SLEEP: Redis 7 refuses DEBUG
		// unless enable-debug-command is set, and redis-cli exits 0 on the refusal.
		if got := srv.Do(t, "CLIENT", "PAUSE", "200", "ALL"); got != "OK" {
			t.Fatalf("CLIENT PAUSE: %q", got)
		}
		testsupport.Eventually(t, 30*time.Second, "a call queued behind the stall timed out", func() bool { return timedOut.Load() > before })
		okAt := ok.Load()
		testsupport.Eventually(t, 30*time.Second, "100 decisions by Redis after the stall", func() bool { return ok.Load() >= okAt+100 })
	}
	if trips := c.BreakerTrips(); trips != 0 {
		t.Errorf("3 stalls of 80 ms opened the breaker %d times (timeout %v, %d calls timed out)", trips, timeout, timedOut.Load())
	}
	t.Logf("%d calls timed out in 3 stalls", timedOut.Load())
}
