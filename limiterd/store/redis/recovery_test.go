package redis

import (
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// TestBreakerRecovery pauses redis-server (SIGSTOP) under load until the breaker has been open
// for 3.5 s (its backoff grown to the maximum), resumes it, and measures by polling how long
// decisions keep failing: with failure mode Closed that is how long limiterd keeps rejecting
// after the fault ended. The breaker must close within its documented schedule, with the
// default parameters: the current backoff (at most 8 × DefaultBreakerBackoff) plus one health
// check (Timeout), plus slack for a loaded machine and Redis's backlog after SIGCONT.
func TestBreakerRecovery(t *testing.T) {
	srv := redistest.Start(t)
	const (
		timeout = 50 * time.Millisecond
		open    = 3500 * time.Millisecond
		slack   = 2 * time.Second
	)
	c := newClient(t, Options{Addrs: []string{srv.Addr()}, Timeout: timeout})
	s := c.Store(t.Name())
	rl := tokenBucket(t, 1_000_000, 1_000_000, time.Second)
	l := startLoad(s, rl, 4)
	defer l.halt()
	testsupport.Eventually(t, 10*time.Second, "decisions succeed", func() bool { return l.ok.Load() > 100 })

	srv.Pause(t)
	testsupport.Eventually(t, 20*time.Second, "breaker opens", c.BreakerOpen)
	time.Sleep(open)
	okAt := l.ok.Load()
	srv.Resume(t)
	resumed := time.Now()
	testsupport.Eventually(t, 30*time.Second, "decisions succeed after SIGCONT", func() bool {
		return l.ok.Load() > okAt && !c.BreakerOpen()
	})
	recovery := time.Since(resumed)
	bound := maxBreakerBackoffFactor*DefaultBreakerBackoff + timeout + slack
	t.Logf("decisions failed for %v after redis resumed (bound %v: backoff at most %v, a check within %v, slack %v)",
		recovery, bound, maxBreakerBackoffFactor*DefaultBreakerBackoff, timeout, slack)
	if recovery > bound {
		t.Errorf("decisions kept failing for %v after redis resumed, want at most %v", recovery, bound)
	}
}
