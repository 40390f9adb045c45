package redis

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// TestBreakerStates walks the breaker through its states on a fake clock, with a health check
// whose answers the test gives.
func TestBreakerStates(t *testing.T) {
	now := time.Unix(0, 0)
	health := make(chan error)
	b := newBreaker(3, time.Second, slog.New(slog.DiscardHandler), func(string) error { return <-health })
	b.now = func() time.Time { return now }
	call := func(o outcome) (*healthCheck, error) {
		if err := b.allow(); err != nil {
			return nil, err
		}
		return b.done(o, "k"), nil
	}
	// Failures not in a row keep it closed.
	for _, o := range []outcome{failed, failed, succeeded, failed, failed} {
		if _, err := call(o); err != nil || b.open() {
			t.Fatalf("closed breaker: %v, open %t", err, b.open())
		}
	}
	// Neither a caller giving up nor a timeout counts by itself: a timeout starts a health
	// check, which the next timeouts join; only its failure counts.
	if _, err := call(abandoned); err != nil || b.open() {
		t.Fatalf("abandoned call: %v, open %t", err, b.open())
	}
	check, _ := call(timedOut)
	if again, _ := call(timedOut); check == nil || again != check || b.checks.Load() != 1 {
		t.Fatalf("timeouts started checks %p and %p, %d in all: want one", check, again, b.checks.Load())
	}
	if b.open() {
		t.Fatal("a timeout opened the breaker before its health check answered")
	}
	health <- nil
	<-check.done
	if b.open() || b.failures.Load() != 0 {
		t.Fatalf("a successful check: open %t, %d failures counted", b.open(), b.failures.Load())
	}
	for range 2 {
		_, _ = call(failed)
	}
	check, _ = call(timedOut)
	health <- errors.New("no answer")
	<-check.done
	if !b.open() || b.trips.Load() != 1 {
		t.Fatalf("third failure in a row (a failed check): open %t, trips %d", b.open(), b.trips.Load())
	}
	if _, err := call(succeeded); !errors.Is(err, ErrBreakerOpen) || b.checks.Load() != 2 {
		t.Fatalf("open breaker before its backoff: %v, %d checks: want ErrBreakerOpen and no check", err, b.checks.Load())
	}
	// After the backoff the next call starts a health check; every call fails at once.
	now = now.Add(time.Second)
	if _, err := call(succeeded); !errors.Is(err, ErrBreakerOpen) || b.checks.Load() != 3 {
		t.Fatalf("after the backoff: %v, %d checks: want ErrBreakerOpen and a check", err, b.checks.Load())
	}
	if _, err := call(succeeded); !errors.Is(err, ErrBreakerOpen) || b.checks.Load() != 3 {
		t.Fatalf("during the check: %v, %d checks", err, b.checks.Load())
	}
	check = b.checking
	health <- errors.New("no answer") // failed check: twice the backoff
	<-check.done
	now = now.Add(1999 * time.Millisecond)
	if _, err := call(succeeded); !errors.Is(err, ErrBreakerOpen) || b.checks.Load() != 3 {
		t.Fatalf("before the doubled backoff: %v, %d checks", err, b.checks.Load())
	}
	now = now.Add(time.Millisecond)
	_, _ = call(succeeded)
	check = b.checking
	if check == nil {
		t.Fatal("no check after the doubled backoff")
	}
	health <- nil
	<-check.done
	if _, err := call(succeeded); err != nil || b.open() {
		t.Fatalf("after a successful check: %v, open %t", err, b.open())
	}
	// Reopened, it starts again from the first backoff.
	for range 3 {
		_, _ = call(failed)
	}
	if !b.open() || b.trips.Load() != 2 {
		t.Fatalf("three failures: open %t, trips %d", b.open(), b.trips.Load())
	}
	now = now.Add(time.Second)
	if _, _ = call(succeeded); b.checking == nil {
		t.Fatal("reopened: no check after the first backoff")
	}
	check = b.checking
	health <- nil
	<-check.done
	// A negative threshold never opens.
	never := newBreaker(-1, time.Second, slog.New(slog.DiscardHandler), func(string) error { return nil })
	for range 100 {
		if err := never.allow(); err == nil {
			never.done(failed, "k")
		}
	}
	if never.open() {
		t.Error("a breaker with a negative threshold opened")
	}
}

// TestBreakerDuringPause pauses redis-server (SIGSTOP) under load: once the breaker opens,
// decisions fail at once instead of waiting for the timeout, only probes wait, and decisions
// succeed again after SIGCONT.
func TestBreakerDuringPause(t *testing.T) {
	srv := redistest.Start(t)
	const (
		timeout = 200 * time.Millisecond
		backoff = 250 * time.Millisecond
		window  = 2 * time.Second
		workers = 8
	)
	c, err := New(Options{Addrs: []string{srv.Addr()}, Timeout: timeout, BreakerFailures: 3, BreakerBackoff: backoff})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := c.Store(t.Name())
	rl := tokenBucket(t, 1_000_000, 1_000_000, time.Second)

	var (
		counting         atomic.Bool
		ok, fast, waited atomic.Int64 // while counting: successes, ErrBreakerOpen, others
		stop             = make(chan struct{})
		wg               sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.Decide(t.Context(), fmt.Sprintf("k-%d-%d", w, i%50), limitertest.One(rl), time.Now(), 1, nil)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrBreakerOpen):
					if counting.Load() {
						fast.Add(1)
					}
					time.Sleep(time.Millisecond)
				default:
					if counting.Load() {
						waited.Add(1)
					}
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	testsupport.Eventually(t, 10*time.Second, "decisions succeed", func() bool { return ok.Load() > 100 })

	srv.Pause(t)
	testsupport.Eventually(t, 10*time.Second, "breaker opens", c.BreakerOpen)
	counting.Store(true)
	time.Sleep(window)
	counting.Store(false)
	// Without a breaker each worker waits the timeout on every call: window/timeout calls
	// each. With it, only probes wait: at most one per backoff (which doubles).
	maxWaited := int64(window/backoff) + workers
	t.Logf("in %v of pause: %d decisions failed at once, %d waited for redis (at most %d allowed; %d without a breaker)",
		window, fast.Load(), waited.Load(), maxWaited, int64(workers)*int64(window/timeout))
	if waited.Load() > maxWaited {
		t.Errorf("%d decisions waited for paused redis, want at most %d (probes)", waited.Load(), maxWaited)
	}
	if fast.Load() < 100 {
		t.Errorf("%d decisions failed at once, want the breaker to answer most", fast.Load())
	}

	srv.Resume(t)
	okAt := ok.Load()
	testsupport.Eventually(t, 20*time.Second, "decisions succeed after SIGCONT", func() bool { return ok.Load() > okAt+100 && !c.BreakerOpen() })
	if c.BreakerTrips() < 1 {
		t.Errorf("trips %d, want at least 1", c.BreakerTrips())
	}
}
