package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// TestConcurrencyRefused checks that, until its scripts decide concurrency limits, the store
// refuses every call that names one (a decision, a peek, a batch item, a refund, a lease's
// release or extension) with ErrConcurrencyUnsupported, before Redis: the client here has no
// server to reach, and would otherwise answer ErrNotConnected. A batch refuses the item alone.
func TestConcurrencyRefused(t *testing.T) {
	c := newClient(t, Options{Addrs: []string{"127.0.0.1:1"}, Timeout: 50 * time.Millisecond})
	s := c.Store("default/concurrency")
	cc, err := limiter.NewConcurrency(3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := limiter.NewTokenBucket(3, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	now := limitertest.T0
	for _, st := range []*limiter.Stack{limitertest.One(cc), limitertest.Stack("rate", tb, "inflight", cc)} {
		for _, cost := range []int64{1, 0} {
			if _, err := s.Decide(ctx, "k", st, now, cost, nil); !errors.Is(err, ErrConcurrencyUnsupported) {
				t.Errorf("decide of cost %d by %d limits: %v, want ErrConcurrencyUnsupported", cost, st.Len(), err)
			}
		}
		for _, op := range []limiter.OnceOp{limiter.OpRefund, limiter.OpRelease, limiter.OpExtend} {
			once := limiter.Once{Op: op, ID: [16]byte{1}, Issued: now, Until: now.Add(time.Minute), Cost: 1}
			if _, err := s.Refund(ctx, limiter.Request{Key: "k", Stack: st, Cost: 1}, now, once); !errors.Is(err, ErrConcurrencyUnsupported) {
				t.Errorf("%v by %d limits: %v, want ErrConcurrencyUnsupported", op, st.Len(), err)
			}
		}
	}
	reqs := []limiter.Request{{Key: "k", Stack: limitertest.One(cc), Cost: 1}, {Key: "k", Stack: limitertest.One(tb), Cost: -1}}
	out := make([]limiter.Answer, len(reqs))
	s.DecideBatch(ctx, reqs, now, out)
	if !errors.Is(out[0].Err, ErrConcurrencyUnsupported) || !errors.Is(out[1].Err, limiter.ErrInvalidCost) {
		t.Errorf("batch: %v, %v; want ErrConcurrencyUnsupported, then the other item's own answer", out[0].Err, out[1].Err)
	}
}
