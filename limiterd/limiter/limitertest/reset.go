package limitertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// CraftedKeys are client keys made to look like each other's stored keys, limit keys or key
// patterns in the stores: one that is a prefix of another, 0xFF (memory's stack key separator,
// doubled in a stored key), ':', '}', '%', NUL (Redis' limit suffix, hash tag and escapes) and
// the glob characters of a Redis MATCH pattern. A Reset of any of them must forget no other's
// state.
var CraftedKeys = []string{
	"a", "a\xff", "a\xffburst", "a\xff\xffburst", "a\xff\xff", "\xff", "\xffa",
	"a:burst", "a}", "a}:burst", "a%7D", "a%7D:burst", "a\x00", "a\x00burst",
	"a*", "a?", "a[a]", "a[", "a\\", "a\\*", "*", "?", "ab", "b",
}

// RunReset holds a store made by newStore to Reset's contract, for stacks:
//   - a client's state under a limit that a policy edit removed from its stack is forgotten
//     too, so that when the edit is undone the client's next request is decided as its first;
//   - a reset forgets no other client's state, for every pair of CraftedKeys.
func RunReset(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	ctx := context.Background()
	tb := must(limiter.NewTokenBucket(3, 1, time.Hour))
	burst := must(limiter.NewTokenBucket(2, 1, time.Hour))
	window := must(limiter.NewSlidingWindow(4, time.Hour))
	full := Stack(limiter.DefaultLimitName, tb, "burst", burst, "hourly", window)
	edited := One(tb) // the edit that removes "burst" and "hourly"

	decide := func(t *testing.T, store limiter.Store, key string, st *limiter.Stack, cost int64) []limiter.Decision {
		t.Helper()
		out := make([]limiter.Decision, st.Len())
		if _, err := store.Decide(ctx, key, st, T0, cost, out); err != nil {
			t.Fatalf("decide %q: %v", key, err)
		}
		return out
	}

	t.Run("a reset forgets the limits a policy edit removed", func(t *testing.T) {
		store := newStore(t)
		decide(t, store, "k", full, 1)
		decide(t, store, "k", full, 1)
		decide(t, store, "k", edited, 1) // the edit: only the default limit is decided
		if err := store.Reset(ctx, "k", T0); err != nil {
			t.Fatal(err)
		}
		// The edit undone: every limit answers the client's first request.
		got := decide(t, store, "k", full, 1)
		for i, want := range []int64{2, 1, 3} {
			if !got[i].Allowed || got[i].Remaining != want {
				t.Fatalf("limit %s after the reset: %+v, want the first request's (%d remaining)", full.Name(i), got[i], want)
			}
		}
	})

	t.Run("a reset forgets no other client's state", func(t *testing.T) {
		st := Stack("burst", burst, "hourly", window, limiter.DefaultLimitName, tb)
		for i, victim := range CraftedKeys {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				store := newStore(t)
				for _, key := range CraftedKeys {
					decide(t, store, key, st, 1)
				}
				if err := store.Reset(ctx, victim, T0); err != nil {
					t.Fatal(err)
				}
				for _, key := range CraftedKeys {
					got := decide(t, store, key, st, 0)
					for j, d := range got {
						wantRemaining := st.Limiter(j).Peek(&limiter.State{}, T0).Remaining
						if key != victim {
							wantRemaining-- // charged once, and kept
						}
						if d.Remaining != wantRemaining {
							t.Fatalf("after the reset of %q, client %q's limit %s: %+v, want %d remaining",
								victim, key, st.Name(j), d, wantRemaining)
						}
					}
				}
			})
		}
	})
}
