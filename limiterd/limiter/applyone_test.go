package limiter

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
)

// TestApplyOneMatchesStack: the one-limit path of the memory store (applyOne) answers and keeps
// exactly what the stack path (applyStack) does for the same stack of one limit, over random
// decisions, peeks and refunds with costs up to above the limit, algorithm and parameter changes
// under one client, and time moving by steps from a nanosecond to past every window.
func TestApplyOneMatchesStack(t *testing.T) {
	tbA, _ := NewTokenBucket(5, 2, time.Second)
	tbB, _ := NewTokenBucket(3, 1, 100*time.Millisecond)
	sw, _ := NewSlidingWindow(4, time.Second)
	quota, _ := NewQuota(6, PeriodDay, time.UTC)
	stacks := []*Stack{one(tbA), one(tbB), one(sw), one(quota)}
	steps := []time.Duration{0, 1, time.Millisecond, 90 * time.Millisecond, 700 * time.Millisecond, 3 * time.Second, 25 * time.Hour}
	base := testseed.Seed(t)
	for seed := base; seed < base+50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 21))
		fast, slow := NewMemory(nil), NewMemory(nil)
		now := time.Date(2026, 12, 5, 23, 59, 0, 0, time.UTC)
		for step := range 400 {
			now = now.Add(steps[rng.IntN(len(steps))])
			st := stacks[rng.IntN(len(stacks))]
			key := []string{"a", "b"}[rng.IntN(2)]
			cost := int64(rng.IntN(8))
			o := op(rng.IntN(3))
			if o != opDecide && cost == 0 {
				cost = 1
			}
			if o == opDecide && cost == 0 {
				o, cost = opPeek, 1
			}
			var got Decision
			if st.one != nil { // as Memory.Decide chooses
				got, _ = fast.applyOne(key, st.one, now, cost, o)
			} else {
				got, _ = fast.applyStacked(key, st, now, cost, o, nil)
			}
			var limits [MaxStack]stackLimit
			var out [MaxStack]Decision
			slow.applyStack(key, st, now, cost, o, limits[:], out[:], nil)
			if want := out[0]; got != want {
				t.Fatalf("seed %d step %d: %v op %d cost %d on %s (%v): one-limit path %+v, stack path %+v",
					seed, step, st.limits[0].Algorithm(), o, cost, key, now, got, want)
			}
			if fast.Len() != slow.Len() {
				t.Fatalf("seed %d step %d: one-limit path keeps %d clients, stack path %d", seed, step, fast.Len(), slow.Len())
			}
		}
	}
}

// TestStackOne: the memory store's fast case (Stack.one, decided by applyOne) is exactly a stack
// of one compact limit (a token bucket or a quota) named DefaultLimitName, whose state is the
// client's key alone. A limit of another name keeps its state under a stack key, and a sliding
// window's state is not compact: applyStack decides those.
func TestStackOne(t *testing.T) {
	tb, _ := NewTokenBucket(5, 2, time.Second)
	sw, _ := NewSlidingWindow(4, time.Second)
	quota, _ := NewQuota(6, PeriodDay, time.UTC)
	for _, tc := range []struct {
		name   string
		names  []string
		limits []RateLimiter
		want   RateLimiter
	}{
		{"a token bucket named default", []string{DefaultLimitName}, []RateLimiter{tb}, tb},
		{"a quota named default", []string{DefaultLimitName}, []RateLimiter{quota}, quota},
		{"a sliding window named default", []string{DefaultLimitName}, []RateLimiter{sw}, nil},
		{"a token bucket of another name", []string{"burst"}, []RateLimiter{tb}, nil},
		{"two limits, the first a token bucket named default", []string{DefaultLimitName, "daily"}, []RateLimiter{tb, quota}, nil},
	} {
		st, err := NewStack(tc.names, tc.limits)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if st.one != tc.want {
			t.Errorf("%s: the fast case's limit is %v, want %v", tc.name, st.one, tc.want)
		}
	}
}
