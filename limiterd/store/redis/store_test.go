package redis

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// newClient returns a client of addrs closed when the test ends.
func newClient(t *testing.T, opts Options) *Client {
	t.Helper()
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// testOptions decide at the caller's instants, with keys that outlive the real time a test
// takes.
func testOptions(addrs ...string) Options {
	// The flush delay that limiterd runs with, so that the tests decide as production does.
	return Options{Addrs: addrs, Clock: CallerClock, ExpirySlack: time.Hour, Timeout: 10 * time.Second,
		MaxFlushDelay: DefaultMaxFlushDelay}
}

// frequentRebases is a sliding-window rebase threshold (Options.rebaseThreshold) for tests that
// exercise rewrites: instants 5s after the epoch, a rewrite every few seconds.
const frequentRebases = 5_000_000_000

func TestConformance(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.Run(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

func TestConcurrent(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunConcurrent(t, c.Store(t.Name()), 32, 40, 200)
}

func TestConcurrentAsTheClockMoves(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunConcurrentMovingClock(t, c.Store(t.Name()), 32, 40, 200)
}

// seeds is how many random sequences TestMatchesMemory runs (go test -args -seeds N).
var seeds = uint64(16)

func init() {
	flag.Uint64Var(&seeds, "seeds", seeds, "random sequences TestMatchesMemory runs")
}

// TestMatchesMemory runs random decisions, peeks and refunds, with random strategies swapped in and out,
// random costs and random clock steps (backwards too), on a few clients, against Redis and
// against limiter.Memory: every answer must be the same.
func TestMatchesMemory(t *testing.T) {
	t.Parallel()
	forEachRebaseAndSeed(t, seeds, func(t *testing.T, s *Store, seed uint64) {
		compareWithMemory(t, s, rand.New(rand.NewPCG(seed, 7)), 2000)
	})
}

// forEachRebaseAndSeed runs compare for n seeds, with the default sliding-window rebase
// threshold and with frequent rebases, each time on a store of its own.
func forEachRebaseAndSeed(t *testing.T, n uint64, compare func(t *testing.T, s *Store, seed uint64)) {
	for _, tc := range []struct {
		name   string
		rebase int64
	}{
		{"default", 0},
		{"frequent sliding window rebases", frequentRebases},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := testOptions(shared(t).Addr())
			opts.rebaseThreshold = tc.rebase
			c := newClient(t, opts)
			base := testseed.Seed(t)
			for seed := base; seed < base+n; seed++ {
				t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
					compare(t, c.Store(t.Name()), seed)
				})
			}
		})
	}
}

func randomStrategy(r *rand.Rand) limiter.RateLimiter {
	periods := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 3 * time.Second, time.Minute, 24 * time.Hour}
	switch r.IntN(5) {
	case 4: // quotas: periods that the clock steps cross, in zones with offset changes
		zones := []string{"UTC", "America/New_York", "Australia/Lord_Howe", "America/Havana"}
		loc, err := time.LoadLocation(zones[r.IntN(len(zones))])
		if err != nil {
			panic(err)
		}
		q, err := limiter.NewQuota([]int64{1, 3, 10, limiter.MaxQuotaLimit}[r.IntN(4)], limiter.CalendarPeriod(1+r.IntN(4)), loc)
		if err != nil {
			panic(err)
		}
		return q
	case 0: // small buckets: frequent rejections and fractions
		tb, err := limiter.NewTokenBucket(1+r.Int64N(10), 1+r.Int64N(7), periods[r.IntN(4)])
		if err != nil {
			panic(err)
		}
		return tb
	case 1: // huge parameters: products far beyond 2^53
		for {
			capacity := []int64{1, 999_999_937, 1_000_000_000}[r.IntN(3)]
			rate := []int64{1, 3, 999_999_937, 1_000_000_000}[r.IntN(4)]
			if tb, err := limiter.NewTokenBucket(capacity, rate, periods[r.IntN(len(periods))]); err == nil {
				return tb
			}
		}
	default:
		sw, err := limiter.NewSlidingWindow([]int64{1, 3, 10, 100_000}[r.IntN(4)], periods[r.IntN(4)])
		if err != nil {
			panic(err)
		}
		return sw
	}
}

func compareWithMemory(t *testing.T, store limiter.Store, r *rand.Rand, steps int) {
	t.Helper()
	ctx := t.Context()
	mem := limiter.NewMemory(nil)
	rl := randomStrategy(r)
	now := limitertest.T0.Add(time.Duration(r.Int64N(int64(time.Hour))))
	keys := []string{"a", "b{}", "c\x00%"}
	ok := func(d limiter.Decision, err error) limiter.Decision {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := range steps {
		if r.IntN(25) == 0 {
			rl = randomStrategy(r)
		}
		switch r.IntN(10) {
		case 0: // the clock jumps backwards
			now = now.Add(-time.Duration(r.Int64N(int64(2 * time.Second))))
		case 1, 2: // far ahead
			now = now.Add(time.Duration(r.Int64N(int64(48 * time.Hour))))
		case 3, 4: // same instant
		default:
			now = now.Add(time.Duration(r.Int64N(int64(300 * time.Millisecond))))
		}
		key := keys[r.IntN(len(keys))]
		limit := max(1, rl.Limit())
		cost := []int64{1, 1, 1, 2, limit / 3, limit, limit + 1, 1 + r.Int64N(limit)}[r.IntN(8)]
		cost = max(1, cost)
		if r.IntN(6) == 0 {
			want, err := limitertest.Refund(mem, key, limitertest.One(rl), now, cost, nil)
			if errors.Is(err, limiter.ErrRefundTooLate) {
				continue // see refundTooLateForMemory
			}
			want = ok(want, err)
			got := ok(limitertest.Refund(store, key, limitertest.One(rl), now, cost, nil))
			if got != want {
				t.Fatalf("step %d: refund %q of %d by %s at %v:\n redis  %+v\n memory %+v", i, key, cost, fingerprint(rl), now, got, want)
			}
			continue
		}
		if r.IntN(6) == 0 {
			want := ok(mem.Decide(ctx, key, limitertest.One(rl), now, 0, nil))
			got := ok(store.Decide(ctx, key, limitertest.One(rl), now, 0, nil))
			if got != want {
				t.Fatalf("step %d: peek %q by %s at %v:\n redis  %+v\n memory %+v", i, key, fingerprint(rl), now, got, want)
			}
			continue
		}
		want := ok(mem.Decide(ctx, key, limitertest.One(rl), now, cost, nil))
		got := ok(store.Decide(ctx, key, limitertest.One(rl), now, cost, nil))
		if got != want {
			t.Fatalf("step %d: decide %q cost %d by %s at %v:\n redis  %+v\n memory %+v", i, key, cost, fingerprint(rl), now, got, want)
		}
	}
}

func TestKey(t *testing.T) {
	for _, tc := range []struct{ policy, client, want string }{
		{"default/api", "user-1", "limiterd:{default/api\x00user-1}"},
		{"default/api", "a}b{c", "limiterd:{default/api\x00a%7Db%7Bc}"},
		{"default/api", "100%\x00", "limiterd:{default/api\x00100%25%00}"},
	} {
		if got := Key(tc.policy, tc.client); got != tc.want {
			t.Errorf("Key(%q, %q) = %q, want %q", tc.policy, tc.client, got, tc.want)
		}
	}
	// Distinct pairs, distinct keys; the hash tag is the whole escaped pair.
	clients := []string{"", "a", "a}", "a%7D", "}", "{", "%", "\x00", "a\x00b", "{a}"}
	seen := make(map[string]string)
	for _, p := range []string{"p", "p\x00a"} {
		for _, c := range clients {
			k := Key(p, c)
			if prev, dup := seen[k]; dup {
				t.Errorf("Key(%q, %q) = Key of %s", p, c, prev)
			}
			seen[k] = fmt.Sprintf("(%q, %q)", p, c)
			open, close := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
			if open != len(KeyPrefix) || close != len(k)-1 {
				t.Errorf("Key(%q, %q) = %q: hash tag is not the whole pair", p, c, k)
			}
		}
	}
}

func TestLimitKey(t *testing.T) {
	if got, want := LimitKey("default/api", "a}b", "daily"), "limiterd:{default/api\x00a%7Db}:daily"; got != want {
		t.Errorf("LimitKey = %q, want %q", got, want)
	}
	if got, want := LimitKey("default/api", "a", limiter.DefaultLimitName), Key("default/api", "a"); got != want {
		t.Errorf("the limit named default is at %q, want the client's key %q", got, want)
	}
	// A limit's key is no client's key, and has its client's hash tag.
	seen := make(map[string]string)
	for _, c := range []string{"a", "a}:b", "a:b", "}", "a\x00b"} {
		for _, name := range []string{limiter.DefaultLimitName, "b", "burst"} {
			k := LimitKey("p", c, name)
			if prev, dup := seen[k]; dup {
				t.Errorf("LimitKey(%q, %q) = the key of %s", c, name, prev)
			}
			seen[k] = fmt.Sprintf("(%q, %q)", c, name)
			if tag := k[:strings.IndexByte(k, '}')+1]; tag != Key("p", c) {
				t.Errorf("LimitKey(%q, %q) = %q: hash tag is not the client's", c, name, k)
			}
		}
	}
}

func TestFingerprint(t *testing.T) {
	tb, err := limiter.NewTokenBucket(10, 3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sw, err := limiter.NewSlidingWindow(5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, rl := range []limiter.RateLimiter{tb, sw} {
		fp := fingerprint(rl)
		back, err := parseFingerprint(fp)
		if err != nil || back != rl {
			t.Errorf("parseFingerprint(%q) = %v, %v; want the strategy back", fp, back, err)
		}
	}
	for _, bad := range []string{"", "tb:1:2", "tb:0:1:1000000", "sw:x:1", "xx:1:2"} {
		if _, err := parseFingerprint(bad); err == nil {
			t.Errorf("parseFingerprint(%q) succeeded", bad)
		}
	}
}

// TestRefundOnce runs the refund-once table on Redis: the record and the refund in one script.
func TestRefundOnce(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunRefundOnce(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

// TestRefundCharge runs the table of refunds bounded by their charge on Redis: the script
// applies the interval Go bounds, as the memory store does.
func TestRefundCharge(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunRefundCharge(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

// randomStack returns 1 to 4 limits of randomStrategy but Unlimited, named from a small set, so
// that swaps keep, change and drop names, "default" among them.
func randomStack(r *rand.Rand) *limiter.Stack {
	pool := []string{limiter.DefaultLimitName, "a", "b", "c", "d"}
	r.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	n := 1 + r.IntN(limiter.MaxStack)
	limits := make([]limiter.RateLimiter, 0, n)
	for len(limits) < n {
		if rl := randomStrategy(r); rl.Algorithm() != limiter.AlgorithmUnlimited {
			limits = append(limits, rl)
		}
	}
	return limitertest.Stack(func() []any {
		var args []any
		for i, rl := range limits {
			args = append(args, pool[i], rl)
		}
		return args
	}()...)
}

// TestStackMatchesMemory runs random stacked decisions, peeks, refunds and batches, with random
// stacks swapped in and out (names kept, changed and dropped; token buckets converted) and
// single-limit calls on the state of the limit named "default", random costs and clock steps
// (backwards too), on a few clients, against Redis and against limiter.Memory: every limit's
// answer must be the same.
func TestStackMatchesMemory(t *testing.T) {
	t.Parallel()
	forEachRebaseAndSeed(t, seeds, func(t *testing.T, s *Store, seed uint64) {
		compareStackWithMemory(t, s, rand.New(rand.NewPCG(seed, 11)), 1000)
	})
}

// refundTooLateForMemory: after a few steps of the clock backwards in a row, a refund may be
// more than limiter.RefundRecordGrace behind the newest instant. limiter.Memory refuses it
// (ErrRefundTooLate, which its contract allows, and Redis's does not), so the comparisons make
// such a refund on neither store.
func compareStackWithMemory(t *testing.T, store limiter.Store, r *rand.Rand, steps int) {
	t.Helper()
	ctx := t.Context()
	mem := limiter.NewMemory(nil)
	st := randomStack(r)
	single := randomStrategy(r)
	now := limitertest.T0.Add(time.Duration(r.Int64N(int64(time.Hour))))
	keys := []string{"a", "b{}", "c\x00%"}
	for i := range steps {
		switch r.IntN(30) {
		case 0, 1:
			st = randomStack(r)
		case 2:
			single = randomStrategy(r)
		}
		switch r.IntN(10) {
		case 0:
			now = now.Add(-time.Duration(r.Int64N(int64(2 * time.Second))))
		case 1:
			now = now.Add(time.Duration(r.Int64N(int64(48 * time.Hour))))
		case 2, 3, 4:
		default:
			now = now.Add(time.Duration(r.Int64N(int64(300 * time.Millisecond))))
		}
		key := keys[r.IntN(len(keys))]
		limit := int64(1)
		for j := range st.Len() {
			limit = max(limit, st.Limiter(j).Limit())
		}
		cost := max(1, []int64{1, 1, 1, 2, limit / 3, limit, limit + 1, 1 + r.Int64N(limit)}[r.IntN(8)])
		want, got := make([]limiter.Decision, st.Len()), make([]limiter.Decision, st.Len())
		var (
			wantD, gotD limiter.Decision
			err         error
			op          string
		)
		switch r.IntN(10) {
		case 0: // a single-limit decision on the state the limit named default shares
			wantD, _ = mem.Decide(ctx, key, limitertest.One(single), now, cost, nil)
			if gotD, err = store.Decide(ctx, key, limitertest.One(single), now, cost, nil); err != nil {
				t.Fatal(err)
			}
			if gotD != wantD {
				t.Fatalf("step %d: single-limit decision of %d for %q by %s at %v:\n redis  %+v\n memory %+v", i, cost, key, fingerprint(single), now, gotD, wantD)
			}
			continue
		case 1:
			op = "peek"
			wantD, _ = mem.Decide(ctx, key, st, now, 0, want)
			gotD, err = store.Decide(ctx, key, st, now, 0, got)
		case 2:
			op = "refund"
			if wantD, err = limitertest.Refund(mem, key, st, now, cost, want); errors.Is(err, limiter.ErrRefundTooLate) {
				continue // see refundTooLateForMemory
			}
			gotD, err = limitertest.Refund(store, key, st, now, cost, got)
		case 3: // a batch: the stack twice and a single-limit request between
			// (on another key: in one batch, the engine sends a key one tier's requests)
			op = "batch"
			reqs := []limiter.Request{
				{Key: key, Stack: st, Cost: cost, Limits: got},
				{Key: "single:" + key, Stack: limitertest.One(single), Cost: 1},
				{Key: key, Stack: st, Cost: 1, Limits: make([]limiter.Decision, st.Len())},
			}
			out := make([]limiter.Answer, len(reqs))
			store.DecideBatch(ctx, reqs, now, out)
			wantD, _ = mem.Decide(ctx, key, st, now, cost, want)
			want2 := make([]limiter.Decision, st.Len())
			mem.Decide(ctx, "single:"+key, limitertest.One(single), now, 1, nil)
			mem.Decide(ctx, key, st, now, 1, want2)
			for j, a := range out {
				if a.Err != nil {
					t.Fatalf("step %d: batch item %d: %v", i, j, a.Err)
				}
			}
			for j := range want2 {
				if reqs[2].Limits[j] != want2[j] {
					t.Fatalf("step %d: the batch's second stacked decision, limit %q by %s:\n redis  %+v\n memory %+v",
						i, st.Name(j), fingerprint(st.Limiter(j)), reqs[2].Limits[j], want2[j])
				}
			}
			gotD = out[0].Decision
		default:
			op = "decide"
			wantD, _ = mem.Decide(ctx, key, st, now, cost, want)
			gotD, err = store.Decide(ctx, key, st, now, cost, got)
		}
		if err != nil {
			t.Fatalf("step %d: %s: %v", i, op, err)
		}
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("step %d: %s %q of %d at %v, limit %q by %s:\n redis  %+v\n memory %+v",
					i, op, key, cost, now, st.Name(j), fingerprint(st.Limiter(j)), got[j], want[j])
			}
		}
		if gotD != wantD {
			t.Fatalf("step %d: %s: the stack answered %+v, memory %+v", i, op, gotD, wantD)
		}
	}
}

// skewRuns numbers TestSkew's runs: each on policies of its own, since the shared redis-server
// keeps the states of a previous run (go test -count) at the same instants.
var skewRuns atomic.Int64

// TestSkew: replicas on different versions of a policy, alternating on one key of one Redis,
// and a limit's flap, give a client at most the more generous version's allowance (issue 34).
func TestSkew(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	run := skewRuns.Add(1)
	limitertest.RunSkew(t, func(t *testing.T) limiter.Store { return c.Store(fmt.Sprintf("%s#%d", t.Name(), run)) })
}
