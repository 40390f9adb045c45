package redis

import (
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// TestSlidingWindowRefundAfterExpiredEntries: a refund on a sliding window whose oldest entries
// left the window, under a lowered limit (a conversion that keeps the usage), drops them from
// the log (swHead) and then answers how long the client waits for one more unit, by a search of
// the log. The search read the entries by their numbers from before the drop:
// past the log's end (a Lua error, "attempt to compare number with nil", so the refund failed
// as a store error) or at the wrong entry. TestMatchesMemory found it with seed
// 15635997717236951345; it predates this session's changes (365cd4b fails too).
func TestSlidingWindowRefundAfterExpiredEntries(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	store := c.Store(t.Name())
	mem := limiter.NewMemory(nil)
	sw, err := limiter.NewSlidingWindow(10, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st := limitertest.One(sw)
	lowered, err := limiter.NewSlidingWindow(3, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t0 := limitertest.T0
	for _, s := range []struct {
		after time.Duration
		cost  int64
	}{{0, 1}, {100 * time.Millisecond, 1}, {2500 * time.Millisecond, 3}, {2800 * time.Millisecond, 3}} {
		for name, s2 := range map[string]limiter.Store{"redis": store, "memory": mem} {
			if d, err := s2.Decide(t.Context(), "k", st, t0.Add(s.after), s.cost, nil); err != nil || !d.Allowed {
				t.Fatalf("%s: charge %d at +%v: %+v %v", name, s.cost, s.after, d, err)
			}
		}
	}
	// At +3.15 s the first two entries left the window: 6 units are used, over the lowered
	// limit of 3, and 1 comes back.
	st = limitertest.One(lowered)
	at := t0.Add(3150 * time.Millisecond)
	want, err := limitertest.Refund(mem, "k", st, at, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := limitertest.Refund(store, "k", st, at, 1, nil)
	if err != nil || got != want {
		t.Fatalf("refund after expired entries:\n redis  %+v %v\n memory %+v", got, err, want)
	}
	// The log left is the memory store's: the next decisions agree too.
	for i, after := range []time.Duration{3150 * time.Millisecond, 5600 * time.Millisecond, 5900 * time.Millisecond} {
		want, _ := mem.Decide(t.Context(), "k", st, t0.Add(after), 2, nil)
		got, err := store.Decide(t.Context(), "k", st, t0.Add(after), 2, nil)
		if err != nil || got != want {
			t.Fatalf("decision %d at +%v after the refund:\n redis  %+v %v\n memory %+v", i, after, got, err, want)
		}
	}
}
