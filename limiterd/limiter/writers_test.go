package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
)

// TestShardWritersCountTheirStates drives a store with random decisions, peeks, refunds,
// stacks, parameter changes, resets, sweeps and evictions, and checks every few steps that
// each shard's writers count exactly the token-bucket states that name them: a writer dropped
// too early would let its place be taken by another strategy, under which a client's state
// would then be read.
func TestShardWritersCountTheirStates(t *testing.T) {
	ctx := context.Background()
	rng := testseed.Rand(t, 8)
	var strategies []RateLimiter
	for i := range int64(6) {
		tb, err := NewTokenBucket(3+i, 1+i%2, time.Duration(50+i)*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		strategies = append(strategies, tb)
	}
	for i := range int64(2) {
		sw, err := NewSlidingWindow(3+i, time.Duration(70+i)*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		strategies = append(strategies, sw)
	}
	stack, err := NewStack([]string{"burst", "steady"}, []RateLimiter{strategies[0], strategies[6]})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMemory(NewBudget(150, 0)) // fewer than the keys: evictions
	now := time.Unix(1_700_000_000, 0)
	out := make([]Decision, MaxStack)
	for step := range 40_000 {
		now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
		key := fmt.Sprint("k", rng.IntN(200))
		rl := strategies[rng.IntN(len(strategies))]
		switch op := rng.IntN(100); {
		case op < 55:
			m.Decide(ctx, key, one(rl), now, 1+rng.Int64N(2), nil)
		case op < 65:
			m.Decide(ctx, key, one(rl), now, 0, nil)
		case op < 75:
			refundNoRecord(m, key, one(rl), now, 1, nil)
		case op < 90:
			m.Decide(ctx, key, stack, now, int64(rng.IntN(2)), out)
		case op < 93:
			refundNoRecord(m, key, stack, now, 1, out)
		case op < 98:
			m.Reset(ctx, key, now)
		default:
			m.Sweep(now)
		}
		if step%25 == 0 { // a miscount stays: checking every step only finds it sooner
			if err := checkWriters(m); err != nil {
				t.Fatalf("by step %d: %v", step, err)
			}
		}
	}
	if err := checkWriters(m); err != nil {
		t.Fatalf("at the end: %v", err)
	}
	if m.Len() == 0 {
		t.Fatal("no client tracked at the end: the walk checked nothing")
	}
	m.Close()
	if err := checkWriters(m); err != nil {
		t.Fatalf("after Close: %v", err)
	}
}

// checkWriters reports the first shard whose writers do not count its token-bucket states.
func checkWriters(m *Memory) error {
	shards := m.shards.Load()
	if shards == nil {
		return nil
	}
	for i := range shards {
		sh := &shards[i]
		sh.Lock()
		counts := make([]int, len(sh.writers))
		var err error
		for j, tag := range sh.buckets.tags {
			by := sh.buckets.slots[j].state.by
			switch {
			case tag == 0 || by == 0:
			case int(by) > len(sh.writers) || sh.writers[by-1].stamp == nil:
				err = fmt.Errorf("shard %d: slot %d names writer %d, which is not there", i, j, by)
			default:
				counts[by-1]++
			}
		}
		for j, w := range sh.writers {
			if err == nil && w.states != counts[j] {
				err = fmt.Errorf("shard %d: writer %d counts %d states, the table holds %d", i, j+1, w.states, counts[j])
			}
		}
		if n := len(sh.writers); err == nil && n > 0 && sh.writers[n-1].stamp == nil {
			err = fmt.Errorf("shard %d: an empty writer at the end of %d", i, n)
		}
		sh.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}
