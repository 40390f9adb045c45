package redis

import (
	"runtime"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/limiter"
)

// TestPreparedArgumentsGoWithTheirStrategy: a client formats a strategy's script arguments once,
// and forgets them when the strategy is freed. Before, they were kept under the strategy itself,
// which kept every strategy ever decided on in use, and package limiter's intern table with it.
func TestPreparedArgumentsGoWithTheirStrategy(t *testing.T) {
	var c Client
	const n = 2000
	func() {
		var inUse []limiter.RateLimiter
		for i := range int64(n) {
			tb, err := limiter.NewTokenBucket(i+1, 7, 41*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			sw, err := limiter.NewSlidingWindow(i+1, 43*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			inUse = append(inUse, tb, sw)
			for _, rl := range []limiter.RateLimiter{tb, sw} {
				if p := c.prepare(rl); c.prepare(rl) != p {
					t.Fatalf("%v prepared twice", rl.ID())
				}
			}
		}
		if got := preparedEntries(&c); got < 2*n {
			t.Fatalf("%d strategies in use, %d prepared", 2*n, got)
		}
		runtime.KeepAlive(inUse)
	}()
	testsupport.Eventually(t, 10*time.Second, "the prepared arguments of freed strategies to go", func() bool {
		runtime.GC()
		return preparedEntries(&c) == 0
	})
}

func preparedEntries(c *Client) int {
	n := 0
	for range c.prepared.Range {
		n++
	}
	return n
}
