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
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// TestBreakerStates walks the breaker through its states on a fake clock.
func TestBreakerStates(t *testing.T) {
	now := time.Unix(0, 0)
	b := newBreaker(3, time.Second, slog.New(slog.DiscardHandler))
	b.now = func() time.Time { return now }
	call := func(failed bool) error {
		probe, err := b.allow()
		if err != nil {
			return err
		}
		b.done(probe, failed)
		return nil
	}
	// Failures not in a row keep it closed.
	for _, failed := range []bool{true, true, false, true, true} {
		if err := call(failed); err != nil || b.open() {
			t.Fatalf("closed breaker: %v, open %t", err, b.open())
		}
	}
	if err := call(true); err != nil || !b.open() || b.trips.Load() != 1 {
		t.Fatalf("third failure in a row: %v, open %t, trips %d", err, b.open(), b.trips.Load())
	}
	if err := call(false); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("open breaker: %v, want ErrBreakerOpen", err)
	}
	// After the backoff one call probes; the others still fail at once.
	now = now.Add(time.Second)
	probe, err := b.allow()
	if err != nil || !probe {
		t.Fatalf("after the backoff: probe %t, %v", probe, err)
	}
	if _, err := b.allow(); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("during the probe: %v, want ErrBreakerOpen", err)
	}
	b.done(true, true) // failed probe: twice the backoff
	now = now.Add(1999 * time.Millisecond)
	if err := call(false); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("before the doubled backoff: %v", err)
	}
	now = now.Add(time.Millisecond)
	probe, err = b.allow()
	if err != nil || !probe {
		t.Fatalf("after the doubled backoff: probe %t, %v", probe, err)
	}
	b.abandon(probe) // the caller gave up: the next call probes
	if err := call(false); err != nil || b.open() {
		t.Fatalf("successful probe: %v, open %t", err, b.open())
	}
	// Closed again with the first backoff.
	for range 3 {
		_ = call(true)
	}
	now = now.Add(time.Second)
	if probe, err := b.allow(); err != nil || !probe {
		t.Fatalf("reopened: probe %t %v, want a probe after the first backoff", probe, err)
	}
	// A negative threshold never opens.
	never := newBreaker(-1, time.Second, slog.New(slog.DiscardHandler))
	for range 100 {
		probe, _ := never.allow()
		never.done(probe, true)
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
				_, err := s.Decide(t.Context(), fmt.Sprintf("k-%d-%d", w, i%50), rl, time.Now(), 1)
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
