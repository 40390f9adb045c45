package limitertest

import (
	"context"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// SkewCase is one client served by several versions of its policy at once, as while replicas
// disagree on a policy (each watches on its own) or across a limit's flap on one replica: Pick
// names the version that decides the request at instant at since T0.
type SkewCase struct {
	Name     string
	Versions []*limiter.Stack
	Pick     func(at time.Duration) int
}

// SkewStep is the interval between two requests of a SkewCase, and SkewRun how long it runs
// (both ends included): 1,501 requests.
const (
	SkewStep = 2 * time.Millisecond
	SkewRun  = 3 * time.Second
)

// SkewCases returns the cases of RunSkew: two versions alternating on every request, and a flap
// (a limit lowered for a second, then restored).
func SkewCases() []SkewCase {
	tb := func(capacity, rate int64, period time.Duration) *limiter.Stack {
		return One(must(limiter.NewTokenBucket(capacity, rate, period)))
	}
	sw := func(limit int64, window time.Duration) *limiter.Stack {
		return One(must(limiter.NewSlidingWindow(limit, window)))
	}
	alternate := func(at time.Duration) int { return int(at/SkewStep) % 2 }
	flap := func(at time.Duration) int {
		if at >= time.Second && at < 2*time.Second {
			return 1
		}
		return 0
	}
	return []SkewCase{
		{"token buckets of 20 and 10 alternating", []*limiter.Stack{tb(20, 20, time.Minute), tb(10, 10, time.Minute)}, alternate},
		{"a token bucket and a sliding window of 20 a minute alternating", []*limiter.Stack{tb(20, 20, time.Minute), sw(20, time.Minute)}, alternate},
		{"sliding windows of 20 and 5 a minute alternating", []*limiter.Stack{sw(20, time.Minute), sw(5, time.Minute)}, alternate},
		{"a token bucket's flap 20, 10, 20", []*limiter.Stack{tb(20, 20, time.Minute), tb(10, 10, time.Minute)}, flap},
		{"a sliding window's flap 20, 5, 20", []*limiter.Stack{sw(20, time.Minute), sw(5, time.Minute)}, flap},
		{"an algorithm's flap: a token bucket, a sliding window, a token bucket", []*limiter.Stack{tb(20, 20, time.Minute), sw(20, time.Minute)}, flap},
	}
}

// RunSkew checks the rule for parameter changes (a conversion never gives usage back) from the
// outside: a client that requests one unit every SkewStep for SkewRun, each request decided by
// the version its case picks, is admitted no more than the most any one version alone admits
// on the same schedule (on a key of its own in the same store): the more generous version's
// allowance. For a bucket of 20 refilling 20 a minute that is 21 (20 at once, one more 3s
// later).
func RunSkew(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	for _, c := range SkewCases() {
		t.Run(c.Name, func(t *testing.T) {
			store := newStore(t)
			run := func(key string, pick func(time.Duration) int) int {
				admitted := 0
				for at := time.Duration(0); at <= SkewRun; at += SkewStep {
					st := c.Versions[pick(at)]
					d, err := store.Decide(context.Background(), key, st, T0.Add(at), 1, make([]limiter.Decision, st.Len()))
					if err != nil {
						t.Fatalf("%s at %v: %v", key, at, err)
					}
					if d.Allowed {
						admitted++
					}
				}
				return admitted
			}
			bound := 0
			for v := range c.Versions {
				bound = max(bound, run("alone-"+string(rune('a'+v)), func(time.Duration) int { return v }))
			}
			mixed := run("mixed", c.Pick)
			t.Logf("admitted %d; the more generous version alone %d", mixed, bound)
			if mixed > bound {
				t.Errorf("the versions together admitted %d, more than the more generous alone (%d)", mixed, bound)
			}
		})
	}
}
