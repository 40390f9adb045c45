package redis

import (
	"runtime"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/limiter"
)

// TestPreparedForgetsCollectedStrategies: the prepared script arguments of 2,000 strategies that
// nothing uses any more are dropped once the strategies are collected, instead of keeping them
// (and, through them, the limiter's intern table) forever.
func TestPreparedForgetsCollectedStrategies(t *testing.T) {
	c := &Client{}
	for i := range 1000 {
		tb, err := limiter.NewTokenBucket(int64(i+1), 7, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		sw, err := limiter.NewSlidingWindow(int64(i+1), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.prepare(tb)
		c.prepare(sw)
	}
	kept := func() (n int) {
		c.prepared.Range(func(any, any) bool { n++; return true })
		return n
	}
	if n := kept(); n == 0 {
		t.Fatal("nothing prepared")
	}
	testsupport.Eventually(t, 10*time.Second, "prepared arguments of collected strategies to go", func() bool {
		runtime.GC()
		return kept() == 0
	})
}

// TestPreparedMatchesItsStrategy: a strategy rebuilt with the same stamp finds the same
// arguments, and different parameters never share them.
func TestPreparedMatchesItsStrategy(t *testing.T) {
	c := &Client{}
	a, _ := limiter.NewTokenBucket(10, 1, time.Second)
	b, _ := limiter.NewTokenBucket(10, 2, time.Second)
	pa, pb := c.prepare(a), c.prepare(b)
	if pa == pb || pa.rate != "1" || pb.rate != "2" {
		t.Fatalf("prepared %+v and %+v for different rates", pa, pb)
	}
	if again := c.prepare(a); again != pa {
		t.Fatal("the same strategy was prepared twice")
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}
