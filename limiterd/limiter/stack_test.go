package limiter_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

func TestNewStackRejectsInvalidStacks(t *testing.T) {
	tb, sw := mustTB(t, 2, 1, time.Second), mustSW(t, 2, time.Second)
	for _, tc := range []struct {
		name   string
		names  []string
		limits []limiter.RateLimiter
		want   string
	}{
		{"no limit", nil, nil, "at least one"},
		{"names and limits differ", []string{"a"}, []limiter.RateLimiter{tb, sw}, "1 names for 2 limits"},
		{"too many", []string{"a", "b", "c", "d", "e"}, []limiter.RateLimiter{tb, sw, tb, sw, tb}, "at most 4"},
		{"unnamed", []string{""}, []limiter.RateLimiter{tb}, "no name"},
		{"nil", []string{"a"}, []limiter.RateLimiter{nil}, "nil"},
		{"unlimited", []string{"a"}, []limiter.RateLimiter{limiter.Unlimited}, "not Unlimited"},
		{"named twice", []string{"a", "a"}, []limiter.RateLimiter{tb, sw}, "named twice"},
		{"0xFF in a name", []string{"a\xffb"}, []limiter.RateLimiter{tb}, "no byte 0xFF"},
	} {
		if _, err := limiter.NewStack(tc.names, tc.limits); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewStack = %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	names, limits := []string{"a", "b"}, []limiter.RateLimiter{tb, sw}
	st, err := limiter.NewStack(names, limits)
	if err != nil {
		t.Fatal(err)
	}
	names[0], limits[0] = "x", sw
	if st.Len() != 2 || st.Name(0) != "a" || st.Limiter(0) != tb || st.Name(1) != "b" || st.Limiter(1) != sw {
		t.Fatalf("the stack is not the limits it was built from, or shares their slices")
	}
}

func TestCombine(t *testing.T) {
	const s = time.Second
	d := func(allowed bool, remaining int64, reset, retry time.Duration) limiter.Decision {
		return limiter.Decision{Allowed: allowed, Limit: 100 + remaining, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
	}
	for _, tc := range []struct {
		name    string
		ds      []limiter.Decision
		binding int
		allowed bool
		retry   time.Duration
	}{
		{"one limit", []limiter.Decision{d(true, 3, s, 0)}, 0, true, 0},
		{"admitted: the least remaining", []limiter.Decision{d(true, 5, s, 0), d(true, 2, s, 0), d(true, 9, s, 0)}, 1, true, 0},
		{"admitted, equally close: the longer reset", []limiter.Decision{d(true, 2, s, 0), d(true, 2, 5*s, 0), d(true, 2, 3*s, 0)}, 1, true, 0},
		{"admitted, a tie: the first", []limiter.Decision{d(true, 2, s, 0), d(true, 2, s, 0)}, 0, true, 0},
		{"rejected: the rejecting limit, not the one with less remaining", []limiter.Decision{d(true, 0, s, 0), d(false, 4, s, 2*s)}, 1, false, 2 * s},
		{"rejected: the longest wait", []limiter.Decision{d(false, 0, s, 2*s), d(false, 1, s, 7*s), d(false, 0, s, 3*s)}, 1, false, 7 * s},
		{"rejected: never admitted waits longest", []limiter.Decision{d(false, 0, s, 9*s), d(false, 5, 0, 0)}, 1, false, 0},
		{"rejected, equal waits: the least remaining", []limiter.Decision{d(false, 3, s, 2*s), d(false, 1, s, 2*s)}, 1, false, 2 * s},
		{"rejected, never twice: the least remaining", []limiter.Decision{d(false, 3, 0, 0), d(false, 1, s, 0), d(true, 0, s, 0)}, 1, false, 0},
	} {
		got, binding := limiter.Combine(tc.ds)
		want := tc.ds[tc.binding]
		want.Allowed, want.RetryAfter = tc.allowed, tc.retry
		if binding != tc.binding || got != want {
			t.Errorf("%s: Combine = %+v, binding %d; want %+v, binding %d", tc.name, got, binding, want, tc.binding)
		}
	}
}

// event is one step of a limit's history that changed, or may have changed, its state.
type event struct {
	rl     limiter.RateLimiter
	at     time.Time
	cost   int64
	refund bool
}

// replay returns the state a history leaves, by the single-limit code.
func replay(history []event) *limiter.State {
	s := &limiter.State{}
	for _, e := range history {
		if e.refund {
			e.rl.Refund(s, e.at, e.cost)
		} else {
			e.rl.Decide(s, e.at, e.cost)
		}
	}
	return s
}

func randomLimit(r *rand.Rand) limiter.RateLimiter {
	periods := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 3 * time.Second, time.Minute}
	if r.IntN(2) == 0 {
		tb, err := limiter.NewTokenBucket(1+r.Int64N(10), 1+r.Int64N(7), periods[r.IntN(len(periods))])
		if err != nil {
			panic(err)
		}
		return tb
	}
	sw, err := limiter.NewSlidingWindow(1+r.Int64N(10), periods[r.IntN(len(periods))])
	if err != nil {
		panic(err)
	}
	return sw
}

// randomStack returns 1 to 4 random limits named from a small set, so that swaps keep, change
// and drop names, "default" among them.
func randomStack(r *rand.Rand) *limiter.Stack {
	pool := []string{limiter.DefaultLimitName, "a", "b", "c", "d"}
	r.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	n := 1 + r.IntN(limiter.MaxStack)
	limits := make([]limiter.RateLimiter, n)
	for i := range limits {
		limits[i] = randomLimit(r)
	}
	st, err := limiter.NewStack(pool[:n], limits)
	if err != nil {
		panic(err)
	}
	return st
}

// TestStackMatchesReplay runs random stacked decisions, peeks and refunds, with swaps of the
// stack and single-limit calls on the state of the limit named "default", random costs and
// clock steps (backwards too), on a few clients, against a model: each limit's state is
// replayed from the history of what its store applied (admitted stacks, refunds, single-limit
// decisions), with the single-limit code, and a stack admits only if every replayed state
// admits. The memory store must answer the model's decisions exactly: all or nothing, each
// limit on its own state, and a rejected stack leaving every state as it was.
func TestStackMatchesReplay(t *testing.T) {
	base := testseed.Seed(t)
	for seed := base; seed < base+30; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 13))
			ctx := t.Context()
			m := limiter.NewMemory(nil)
			histories := map[string][]event{} // by key and limit name
			st := randomStack(r)
			single := randomLimit(r)
			now := limitertest.T0
			keys := []string{"x", "y\x00z", "é"}
			for step := range 600 {
				switch r.IntN(30) {
				case 0, 1:
					st = randomStack(r)
				case 2:
					single = randomLimit(r)
				}
				switch r.IntN(8) {
				case 0:
					now = now.Add(-time.Duration(r.Int64N(int64(time.Second))))
				case 1, 2, 3:
				default:
					now = now.Add(time.Duration(r.Int64N(int64(2 * time.Second))))
				}
				key := keys[r.IntN(len(keys))]
				cost := []int64{1, 1, 2, 3, 5, 11}[r.IntN(6)]
				op := r.IntN(10)
				if op == 0 { // a single-limit call on the state the limit named default shares
					h := key + "/" + limiter.DefaultLimitName
					want := single.Decide(replay(histories[h]), now, cost)
					got, _ := m.Decide(ctx, key, limitertest.One(single), now, cost, nil)
					if got != want {
						t.Fatalf("step %d: single-limit decision of %d for %q at %v:\n got  %+v\n want %+v", step, cost, key, now, got, want)
					}
					if want.Allowed { // a rejection changes nothing, not even a conversion
						histories[h] = append(histories[h], event{rl: single, at: now, cost: cost})
					}
					continue
				}
				n := st.Len()
				want := make([]limiter.Decision, n)
				got := make([]limiter.Decision, n)
				switch op {
				case 1: // a peek
					for i := range n {
						want[i] = st.Limiter(i).Peek(replay(histories[key+"/"+st.Name(i)]), now)
					}
					_, _ = m.Decide(ctx, key, st, now, 0, got)
				case 2: // a refund
					for i := range n {
						h := key + "/" + st.Name(i)
						// A refund changes only a state of its own algorithm (the store keeps
						// another's as it is, and answers as a peek on it would).
						if hs := histories[h]; len(hs) > 0 && hs[len(hs)-1].rl.Algorithm() == st.Limiter(i).Algorithm() {
							want[i] = st.Limiter(i).Refund(replay(histories[h]), now, cost)
							histories[h] = append(hs, event{rl: st.Limiter(i), at: now, cost: cost, refund: true})
						} else {
							want[i] = st.Limiter(i).Peek(replay(histories[h]), now)
						}
					}
					_, _ = limitertest.Refund(m, key, st, now, cost, got)
				default:
					all := true
					for i := range n {
						want[i] = st.Limiter(i).Decide(replay(histories[key+"/"+st.Name(i)]), now, cost)
						all = all && want[i].Allowed
					}
					for i := range n {
						h := key + "/" + st.Name(i)
						switch {
						case all:
							histories[h] = append(histories[h], event{rl: st.Limiter(i), at: now, cost: cost})
						case want[i].Allowed:
							want[i] = limiter.UnchargedDecision(st.Limiter(i), replay(histories[h]), now)
						}
					}
					_, _ = m.Decide(ctx, key, st, now, cost, got)
				}
				for i := range n {
					if got[i] != want[i] {
						t.Fatalf("step %d (op %d, cost %d, key %q at %v), limit %q by %v:\n got  %+v\n want %+v",
							step, op, cost, key, now, st.Name(i), st.Limiter(i).Algorithm(), got[i], want[i])
					}
				}
			}
		})
	}
}

// TestMemoryStackBookkeeping checks that each limit of a stack counts as a client of the budget,
// that Sweep drops the fresh ones, that Reset forgets the named ones, and that a rejected stack
// tracks no new client.
func TestMemoryStackBookkeeping(t *testing.T) {
	ctx := t.Context()
	budget := limiter.NewBudget(0, 0)
	m := limiter.NewMemory(budget)
	t0 := limitertest.T0
	st := limitertest.Stack(limiter.DefaultLimitName, mustTB(t, 2, 1, time.Second),
		"hourly", mustSW(t, 5, time.Hour), "burst", mustTB(t, 3, 1, time.Minute))
	out := make([]limiter.Decision, st.Len())
	if d, _ := m.Decide(ctx, "k", st, t0, 3, out); d.Allowed || m.Len() != 0 || budget.Bytes() != 0 {
		t.Fatalf("a rejected stack: %+v, %d clients, %d bytes; want nothing tracked", d, m.Len(), budget.Bytes())
	}
	if d, _ := m.Decide(ctx, "k", st, t0, 0, out); !d.Allowed || m.Len() != 0 {
		t.Fatalf("a peek: %+v, %d clients; want nothing tracked", d, m.Len())
	}
	if d, _ := m.Decide(ctx, "k", st, t0, 1, out); !d.Allowed || m.Len() != 3 {
		t.Fatalf("an admitted stack of 3 limits: %+v, %d clients tracked, want 3", d, m.Len())
	}
	bytes := budget.Bytes()
	if d, _ := m.Decide(ctx, "k", st, t0, 1, out); !d.Allowed || m.Len() != 3 || budget.Bytes() < bytes {
		t.Fatalf("a second decision: %+v, %d clients, %d bytes (was %d)", d, m.Len(), budget.Bytes(), bytes)
	}
	// 2 seconds later the default bucket is full, 2 minutes later the burst bucket: swept.
	m.Sweep(t0.Add(2 * time.Second))
	if m.Len() != 2 || budget.Dropped() != 1 {
		t.Fatalf("after 2s: %d clients, %d dropped; want 2, 1", m.Len(), budget.Dropped())
	}
	m.Sweep(t0.Add(2 * time.Minute))
	if m.Len() != 1 {
		t.Fatalf("after 2 minutes: %d clients, want 1 (the hourly window)", m.Len())
	}
	// The window kept its usage: 2 of 5 used.
	if d, _ := m.Decide(ctx, "k", st, t0.Add(2*time.Minute), 0, out); out[1].Remaining != 3 {
		t.Fatalf("after the sweeps, the hourly window says %+v (stack %+v), want 3 remaining", out[1], d)
	}
	if err := m.Reset(ctx, "k", t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if m.Len() != 0 || budget.Tracked() != 0 || budget.Bytes() != 0 {
		t.Fatalf("after Reset: %d clients, %d tracked, %d bytes", m.Len(), budget.Tracked(), budget.Bytes())
	}
	// A stack on a closed store answers, as for a new client, and keeps nothing.
	m.Close()
	if d, _ := m.Decide(ctx, "late", st, t0, 1, out); !d.Allowed || m.Len() != 0 || budget.Tracked() != 0 {
		t.Fatalf("a stack after Close: %+v, %d clients", d, m.Len())
	}
}

// TestMemoryStackKeysAreNotClientKeys checks that a stacked limit's state is no single-limit
// client's state, even for client keys that look like stack keys (0xFF is in no UTF-8 key, but
// the store does not rely on it), and that such keys have states of their own.
func TestMemoryStackKeysAreNotClientKeys(t *testing.T) {
	ctx := t.Context()
	t0 := limitertest.T0
	tb := mustTB(t, 1, 1, time.Hour)
	st := limitertest.Stack("a", tb)
	out := make([]limiter.Decision, 1)
	for _, client := range []string{"k", "k\xff", "k\xffa", "\xff\xff"} {
		// Many stores, so that keys meet in one shard (one in 256) in some of them.
		for range 512 {
			m := limiter.NewMemory(nil)
			m.Decide(ctx, client, st, t0, 1, out)
			for _, key := range []string{client + "a", client + "\xffa", client + "\xff\xffa", client + "\x00a", client + "/a", client + "\xff"} {
				if d, _ := m.Decide(ctx, key, limitertest.One(tb), t0, 1, nil); !d.Allowed {
					t.Fatalf("client %q was charged by the stack of client %q", key, client)
				}
			}
			if d, _ := m.Decide(ctx, client+"\xffa", limitertest.One(tb), t0, 1, nil); d.Allowed {
				t.Fatalf("client %q keeps no state of its own", client+"\xffa")
			}
			if _, _ = m.Decide(ctx, client, st, t0, 0, out); out[0].Allowed {
				t.Fatalf("the stack of client %q lost its state: %+v", client, out[0])
			}
			if err := m.Reset(ctx, client+"\xffa", t0); err != nil || m.Len() != 1+5 {
				t.Fatalf("reset of client %q: %v, %d clients left, want 6", client+"\xffa", err, m.Len())
			}
		}
	}
}

// TestMemoryRemovedLimitIsSwept drops a limit from a client's stack (a policy edit): the state
// it left is read by no decision any more, and is swept once fresh, when a limit still in the
// stack would be, however the client keeps deciding on the stack without it.
func TestMemoryRemovedLimitIsSwept(t *testing.T) {
	ctx := t.Context()
	t0 := limitertest.T0
	tb := mustTB(t, 5, 1, time.Hour)
	full := limitertest.Stack(limiter.DefaultLimitName, tb, "burst", mustTB(t, 2, 1, time.Second), "window", mustSW(t, 2, time.Second))
	edited := limitertest.One(tb)
	m := limiter.NewMemory(nil)
	out := make([]limiter.Decision, full.Len())
	if d, _ := m.Decide(ctx, "k", full, t0, 1, out); !d.Allowed || m.Len() != 3 {
		t.Fatalf("first decision: %+v, %d states; want 3", d, m.Len())
	}
	for i := range 2 { // the edit: only the default limit is decided, and nothing refreshes the others
		at := t0.Add(time.Duration(i) * 500 * time.Millisecond)
		m.Decide(ctx, "k", edited, at, 1, nil)
		m.Sweep(at)
	}
	if m.Len() != 3 {
		t.Fatalf("before the removed limits are fresh: %d states, want 3", m.Len())
	}
	m.Sweep(t0.Add(time.Second))
	if m.Len() != 1 {
		t.Fatalf("once the removed limits are fresh: %d states, want the default limit's only", m.Len())
	}
}
