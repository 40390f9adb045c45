package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// load runs decisions from several goroutines until stopped, recording outcomes and the
// longest call.
type load struct {
	ok, failed atomic.Int64
	longest    atomic.Int64 // ns
	stop       chan struct{}
	wg         sync.WaitGroup
}

func startLoad(s *Store, rl limiter.RateLimiter, workers int) *load {
	l := &load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Now()
				_, err := s.Decide(context.Background(), fmt.Sprintf("load-%d-%d", w, i%100), limitertest.One(rl), start, 1, nil)
				took := time.Since(start)
				for {
					prev := l.longest.Load()
					if int64(took) <= prev || l.longest.CompareAndSwap(prev, int64(took)) {
						break
					}
				}
				if err != nil {
					l.failed.Add(1)
					time.Sleep(time.Millisecond) // an outage answers at once: do not spin
				} else {
					l.ok.Add(1)
				}
			}
		})
	}
	return l
}

func (l *load) halt() {
	close(l.stop)
	l.wg.Wait()
}

// redisProcesses ignores the goroutines that wait for redis-server processes of the tests.
var redisProcesses = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/limiterd/limiterd/limiterd/store/redis/redistest.(*Server).start.func1"),
	goleak.IgnoreAnyFunction("github.com/limiterd/limiterd/limiterd/store/redis/redistest.(*Server).start.func2"),
}

// noLeak fails the test if goroutines started since ignore was taken are still running after
// 10s: the client's own are gone at Close, and rueidis's delayed topology refresh (a sleeping
// goroutine) ends by itself within a second or two.
func noLeak(t *testing.T, ignore goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := goleak.Find(append(redisProcesses, ignore)...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}

// TestOutage stops, restarts, pauses and resumes redis-server under load: every decision answers
// (an error, during the outage) within the timeout, the client reconnects by itself, replicas
// share state again afterwards, and no goroutine is left behind.
func TestOutage(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	srv := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	// A call that hung instead of timing out would take at least the pause below; the margin
	// over the timeout absorbs the scheduling of a loaded machine under the race detector.
	const pause, bound = 4 * time.Second, timeout + 2500*time.Millisecond
	opts := Options{Addrs: []string{srv.Addr()}, Timeout: timeout}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s := c.Store(t.Name())
	rl := tokenBucket(t, 1_000_000, 1_000_000, time.Second)
	l := startLoad(s, rl, 8)

	testsupport.Eventually(t, 10*time.Second, "decisions succeed", func() bool { return l.ok.Load() > 100 })
	srv.Stop()
	failedAt := l.failed.Load()
	testsupport.Eventually(t, 10*time.Second, "decisions fail while redis is down", func() bool { return l.failed.Load() > failedAt+100 })
	if err := c.Ping(t.Context()); err == nil {
		t.Error("Ping succeeds while redis is down")
	}
	srv.Restart(t)
	okAt := l.ok.Load()
	testsupport.Eventually(t, 20*time.Second, "decisions succeed after a restart", func() bool { return l.ok.Load() > okAt+100 })
	if err := c.Ping(t.Context()); err != nil {
		t.Errorf("Ping after the restart: %v", err)
	}

	srv.Pause(t)
	failedAt = l.failed.Load()
	testsupport.Eventually(t, 10*time.Second, "decisions time out while redis is paused", func() bool { return l.failed.Load() > failedAt+50 })
	time.Sleep(pause)
	srv.Resume(t)
	okAt = l.ok.Load()
	testsupport.Eventually(t, 20*time.Second, "decisions succeed after a pause", func() bool { return l.ok.Load() > okAt+100 })
	l.halt()
	if longest := time.Duration(l.longest.Load()); longest > bound {
		t.Errorf("a decision took %v; the timeout is %v", longest, timeout)
	}
	t.Logf("%d decisions succeeded, %d failed; the longest took %v (timeout %v)",
		l.ok.Load(), l.failed.Load(), time.Duration(l.longest.Load()), timeout)

	// After recovery, two replicas share each client's allowance again.
	other, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	small := tokenBucket(t, 5, 1, time.Hour)
	admitted := 0
	for i := range 20 {
		replica := s
		if i%2 == 1 {
			replica = other.Store(t.Name())
		}
		d, err := replica.Decide(t.Context(), "shared", limitertest.One(small), time.Now(), 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("two replicas admitted %d, want the capacity 5", admitted)
	}
	other.Close()
	c.Close()
	noLeak(t, ignore)
}

// TestUnreachableAtStart checks that a client made while Redis is down fails fast, then
// connects by itself once Redis is up.
func TestUnreachableAtStart(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	srv := redistest.Start(t)
	srv.Stop()
	c, err := New(Options{Addrs: []string{srv.Addr()}, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rl := tokenBucket(t, 5, 1, time.Hour)
	start := time.Now()
	if _, err := c.Store(t.Name()).Decide(t.Context(), "k", limitertest.One(rl), start, 1, nil); err == nil {
		t.Fatal("a decision succeeded while redis is down")
	} else if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a decision took %v to fail", took)
	}
	st := limitertest.Stack("burst", rl, "daily", slidingWindow(t, 5, time.Hour))
	out := make([]limiter.Decision, st.Len())
	start = time.Now()
	if _, err := c.Store(t.Name()).Decide(t.Context(), "k", st, start, 1, out); err == nil {
		t.Fatal("a stacked decision succeeded while redis is down")
	} else if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a stacked decision took %v to fail", took)
	}
	srv.Restart(t)
	testsupport.Eventually(t, 20*time.Second, "decisions succeed once redis is up", func() bool {
		_, err := c.Store(t.Name()).Decide(t.Context(), "k", limitertest.One(rl), time.Now(), 1, nil)
		return err == nil
	})
	if d, err := c.Store(t.Name()).Decide(t.Context(), "k", st, time.Now(), 1, out); err != nil || !d.Allowed {
		t.Fatalf("a stacked decision once redis is up: %+v, %v", d, err)
	}
	c.Close()
	if _, err := c.Store(t.Name()).Decide(t.Context(), "k", limitertest.One(rl), time.Now(), 1, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
	if _, err := limitertest.Refund(c.Store(t.Name()), "k", st, time.Now(), 1, out); !errors.Is(err, ErrClosed) {
		t.Errorf("a stacked refund after Close: %v, want ErrClosed", err)
	}
	noLeak(t, ignore)
}
