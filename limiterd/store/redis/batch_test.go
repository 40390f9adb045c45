package redis

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// compareBatchesWithMemory decides random batches on a few keys, with strategies swapped
// between batches (so that token buckets convert within a batch) and clock steps, on store and
// on limiter.Memory: every answer must be the same.
func compareBatchesWithMemory(t *testing.T, store limiter.Store, r *rand.Rand, batches int, before func()) {
	t.Helper()
	ctx := t.Context()
	mem := limiter.NewMemory(nil)
	keys := []string{"a", "b{}", "c\x00%", "d"}
	strategies := make(map[string]*limiter.Stack)
	now := limitertest.T0
	for b := range batches {
		for _, k := range keys {
			if strategies[k] == nil || r.IntN(4) == 0 {
				strategies[k] = limitertest.One(randomStrategy(r))
			}
		}
		now = now.Add(time.Duration(r.Int64N(int64(2 * time.Second))))
		reqs := make([]limiter.Request, 1+r.IntN(40))
		for i := range reqs {
			k := keys[r.IntN(len(keys))]
			reqs[i] = limiter.Request{Key: k, Stack: strategies[k], Cost: r.Int64N(5)} // 0: a peek
		}
		want, got := make([]limiter.Answer, len(reqs)), make([]limiter.Answer, len(reqs))
		mem.DecideBatch(ctx, reqs, now, want)
		if before != nil {
			before()
		}
		store.DecideBatch(ctx, reqs, now, got)
		for i := range reqs {
			if got[i] != want[i] {
				t.Fatalf("batch %d, request %d of %d (key %q, %s, cost %d):\n redis  %+v\n memory %+v",
					b, i, len(reqs), reqs[i].Key, reqs[i].Stack.Limiter(0).Algorithm(), reqs[i].Cost, got[i], want[i])
			}
		}
	}
}

// TestBatchMatchesMemory runs random batches with duplicates of keys, parameter changes, peeks
// and costs above the capacity against Redis and limiter.Memory.
func TestBatchMatchesMemory(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	base := testseed.Seed(t)
	for seed := base; seed < base+seeds; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			compareBatchesWithMemory(t, c.Store(t.Name()), rand.New(rand.NewPCG(seed, 13)), 50, nil)
		})
	}
}

// TestBatchAfterScriptFlush flushes Redis's scripts before every batch: the pipeline's EVALSHA
// calls answer NOSCRIPT, and the batch still answers as memory does, in order.
func TestBatchAfterScriptFlush(t *testing.T) {
	c := newClient(t, testOptions(shared(t).Addr()))
	compareBatchesWithMemory(t, c.Store(t.Name()), testseed.Rand(t, 13), 20, func() { do(t, c, "SCRIPT", "FLUSH") })
}

// TestBatchRejectCache checks that a batch answers cached rejections without Redis and caches
// the rejections it gets from Redis.
func TestBatchRejectCache(t *testing.T) {
	t.Parallel()
	opts := testOptions(shared(t).Addr())
	opts.RejectCache = 100
	c := newClient(t, opts)
	s := c.Store(t.Name())
	tb := tokenBucket(t, 2, 1, time.Minute)
	st := limitertest.One(tb)
	reqs := []limiter.Request{{Key: "k", Stack: st, Cost: 1}, {Key: "k", Stack: st, Cost: 1}, {Key: "k", Stack: st, Cost: 1}}
	out := make([]limiter.Answer, len(reqs))
	s.DecideBatch(t.Context(), reqs, limitertest.T0, out)
	for i, want := range []bool{true, true, false} {
		if out[i].Err != nil || out[i].Allowed != want {
			t.Fatalf("request %d: %+v, want allowed %t", i, out[i], want)
		}
	}
	hits := c.cacheHits.Load()
	s.DecideBatch(t.Context(), reqs[2:3], limitertest.T0.Add(time.Second), out[:1])
	if out[0].Allowed || out[0].Err != nil || c.cacheHits.Load() != hits+1 {
		t.Fatalf("the rejected client again: %+v, cache hits %d → %d", out[0], hits, c.cacheHits.Load())
	}
}

// TestBatchFailsAsAWhole checks that a batch on a closed client fails every request.
func TestBatchFailsAsAWhole(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	s := c.Store(t.Name())
	c.Close()
	tb := tokenBucket(t, 2, 1, time.Minute)
	reqs := []limiter.Request{{Key: "k", Stack: limitertest.One(tb), Cost: 1}, {Key: "l", Stack: limitertest.One(tb), Cost: 0}}
	out := make([]limiter.Answer, len(reqs))
	s.DecideBatch(t.Context(), reqs, limitertest.T0, out)
	if out[0].Err == nil || out[1].Err == nil {
		t.Fatalf("answers %+v", out)
	}
}
