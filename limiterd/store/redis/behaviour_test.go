package redis

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

func tokenBucket(t *testing.T, capacity, rate int64, period time.Duration) *limiter.TokenBucket {
	t.Helper()
	tb, err := limiter.NewTokenBucket(capacity, rate, period)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func slidingWindow(t *testing.T, limit int64, window time.Duration) *limiter.SlidingWindow {
	t.Helper()
	sw, err := limiter.NewSlidingWindow(limit, window)
	if err != nil {
		t.Fatal(err)
	}
	return sw
}

func decide(t *testing.T, s limiter.Store, key string, rl limiter.RateLimiter, now time.Time, cost int64) limiter.Decision {
	t.Helper()
	d, err := s.Decide(t.Context(), key, limitertest.One(rl), now, cost, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// do runs one command on the client's connection.
func do(t *testing.T, c *Client, args ...string) string {
	t.Helper()
	cn, err := c.get()
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cn.Do(t.Context(), cn.B().Arbitrary(args[0]).Args(args[1:]...).Build()).ToMessage()
	if err != nil {
		t.Fatalf("%s: %v", args[0], err)
	}
	if v, err := msg.AsInt64(); err == nil {
		return strconv.FormatInt(v, 10)
	}
	v, _ := msg.ToString()
	return v
}

// TestExpiry checks that a client's key expires when its state is fresh again, and not before:
// PTTL is the ResetAfter of the last admission, and the key is gone once it has passed.
func TestExpiry(t *testing.T) {
	t.Parallel()
	c := newClient(t, Options{Addrs: []string{shared(t).Addr()}, Timeout: 10 * time.Second}) // server clock, no slack
	s := c.Store(t.Name())
	for _, tc := range []struct {
		rl   limiter.RateLimiter
		cost int64
	}{
		{tokenBucket(t, 10, 10, time.Second), 7},         // 700ms until full
		{slidingWindow(t, 10, 1500*time.Millisecond), 4}, // 1.5s until empty
		{tokenBucket(t, 3, 1, 24*time.Hour), 1},          // a day: never waited for
	} {
		key := "expiry-" + fingerprint(tc.rl)
		d := decide(t, s, key, tc.rl, time.Time{}, tc.cost)
		pttl, err := strconv.ParseInt(do(t, c, "PTTL", Key(t.Name(), key)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		reset := d.ResetAfter.Milliseconds()
		// The key was written at most a few ms before PTTL ran: PTTL is in (reset - that, reset].
		if pttl > reset+1 || pttl < reset-2000 {
			t.Fatalf("%s: PTTL %dms after a decision with ResetAfter %v", fingerprint(tc.rl), pttl, d.ResetAfter)
		}
		if d.ResetAfter > 2*time.Second {
			continue
		}
		deadline := time.Now().Add(d.ResetAfter + 10*time.Second)
		for do(t, c, "EXISTS", Key(t.Name(), key)) != "0" {
			if time.Now().After(deadline) {
				t.Fatalf("%s: key still exists %v after its state became fresh", fingerprint(tc.rl), time.Until(deadline))
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Fresh again: the next decision sees a full allowance.
		if d := decide(t, s, key, tc.rl, time.Time{}, 1); !d.Allowed || d.Remaining != tc.rl.Limit()-1 {
			t.Fatalf("%s: after expiry got %+v, want a fresh client", fingerprint(tc.rl), d)
		}
	}
}

// TestServerClock checks that with ServerClock the caller's instants are ignored: callers whose
// clocks disagree by years still share one allowance.
func TestServerClock(t *testing.T) {
	t.Parallel()
	c := newClient(t, Options{Addrs: []string{shared(t).Addr()}, Timeout: 10 * time.Second})
	s := c.Store(t.Name())
	for _, rl := range []limiter.RateLimiter{tokenBucket(t, 5, 1, time.Hour), slidingWindow(t, 5, time.Hour)} {
		admitted := 0
		for i := range 20 {
			skewed := limitertest.T0.Add(time.Duration(i%3-1) * 24 * 365 * time.Hour)
			// A key per strategy: another algorithm's state would be charged (its usage carried).
			if decide(t, s, "skewed-"+fingerprint(rl), rl, skewed, 1).Allowed {
				admitted++
			}
		}
		if admitted != 5 {
			t.Errorf("%s: callers with skewed clocks were admitted %d times, want 5", fingerprint(rl), admitted)
		}
	}
}

// TestStackOnServerClock checks a stack on the server's clock: callers whose clocks disagree by
// years share one allowance of each limit, a parameter change converts a token bucket's state
// (its second round trip), and every limit's key expires when its state is fresh again.
func TestStackOnServerClock(t *testing.T) {
	t.Parallel()
	c := newClient(t, Options{Addrs: []string{shared(t).Addr()}, Timeout: 10 * time.Second})
	s := c.Store(t.Name())
	st := limitertest.Stack("burst", tokenBucket(t, 5, 1, time.Hour), "daily", slidingWindow(t, 4, 1500*time.Millisecond))
	out := make([]limiter.Decision, st.Len())
	admitted := 0
	for i := range 20 {
		skewed := limitertest.T0.Add(time.Duration(i%3-1) * 24 * 365 * time.Hour)
		d, err := s.Decide(t.Context(), "skewed", st, skewed, 1, out)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 4 || out[0].Remaining != 1 || out[1].Remaining != 0 {
		t.Fatalf("callers with skewed clocks were admitted %d times, limits %+v; want 4, 1 and 0 remaining", admitted, out)
	}
	// The bucket's parameters change: its state is converted (4 tokens used) and decided on.
	st = limitertest.Stack("burst", tokenBucket(t, 10, 1, time.Hour), "daily", slidingWindow(t, 4, 1500*time.Millisecond))
	if d, err := s.Decide(t.Context(), "skewed", st, time.Time{}, 0, out); err != nil || out[0].Remaining != 6 {
		t.Fatalf("after the bucket's change: %+v, limits %+v, %v; want 6 remaining in the bucket", d, out, err)
	}
	// Once the window is empty, the converted bucket admits and writes its state.
	testsupport.Eventually(t, 10*time.Second, "the window admits again", func() bool {
		d, err := s.Decide(t.Context(), "skewed", st, time.Time{}, 1, out)
		return err == nil && d.Allowed
	})
	if out[0].Remaining != 5 {
		t.Fatalf("the converted bucket admitted with %d remaining, want 5", out[0].Remaining)
	}
	for i, want := range []time.Duration{5 * time.Hour, 1500 * time.Millisecond} {
		pttl, err := strconv.ParseInt(do(t, c, "PTTL", LimitKey(t.Name(), "skewed", st.Name(i))), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		// Written at most a few ms before PTTL ran, and at most a second before (Eventually).
		if got := time.Duration(pttl) * time.Millisecond; got > want || got < want-2*time.Second {
			t.Errorf("limit %q expires in %v, want about %v", st.Name(i), got, want)
		}
	}
}

// TestRejectCache checks that cached rejections answer without Redis until the retry time,
// never admit more than the limit, and yield to a new strategy and to Reset.
func TestRejectCache(t *testing.T) {
	srv := shared(t)
	opts := testOptions(srv.Addr())
	opts.RejectCache = 100
	c := newClient(t, opts)
	s := c.Store(t.Name())
	rl := tokenBucket(t, 3, 1, time.Second)
	evals := func() int64 {
		v := srv.Info(t, "commandstats", "cmdstat_evalsha")
		v, _, _ = strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	now := limitertest.T0
	decide(t, s, "warm-up", rl, now, 1) // the script is in Redis's cache: one EVALSHA a decision
	before := evals()
	admitted := 0
	for range 1000 {
		if decide(t, s, "hot", rl, now, 1).Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d, want the capacity 3", admitted)
	}
	// 3 admissions and 1 rejection went to Redis; the other 996 rejections did not.
	if n := evals() - before; n != 4 {
		t.Fatalf("Redis ran %d scripts for 1000 decisions, want 4", n)
	}
	// Aged answers: half the retry time later.
	d := decide(t, s, "hot", rl, now.Add(500*time.Millisecond), 1)
	if d.Allowed || d.RetryAfter != 500*time.Millisecond || d.ResetAfter != 2500*time.Millisecond {
		t.Fatalf("cached rejection 500ms later: %+v", d)
	}
	if n := evals() - before; n != 4 {
		t.Fatalf("cached rejection went to Redis")
	}
	// At the retry time, Redis decides again and admits one.
	if d := decide(t, s, "hot", rl, now.Add(time.Second), 1); !d.Allowed {
		t.Fatalf("at the retry time: %+v, want admitted", d)
	}
	// Another cost is not answered from the cache.
	if d := decide(t, s, "hot", rl, now.Add(time.Second), 2); d.Allowed {
		t.Fatalf("cost 2 on an empty bucket admitted: %+v", d)
	}
	before = evals()
	decide(t, s, "hot", rl, now.Add(time.Second), 1) // rejected, cached
	// A new strategy decides in Redis at once (its usage carried over).
	bigger := tokenBucket(t, 10, 1, time.Second)
	if d := decide(t, s, "hot", bigger, now.Add(time.Second), 1); !d.Allowed {
		t.Fatalf("after a swap to a larger bucket: %+v, want admitted", d)
	}
	if n := evals() - before; n != 3 {
		t.Fatalf("Redis ran %d scripts, want 3 (the rejection; the new strategy's read and its conversion's write)", n)
	}
	// Reset forgets the cached rejection.
	for decide(t, s, "hot", bigger, now.Add(time.Second), 1).Allowed {
	}
	if err := s.Reset(t.Context(), "hot", now); err != nil {
		t.Fatal(err)
	}
	if d := decide(t, s, "hot", bigger, now.Add(time.Second), 1); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("after Reset: %+v, want a fresh client", d)
	}
}

// TestRejectCacheConcurrent checks that the cache never admits more than the limit when many
// goroutines hammer one client.
func TestRejectCacheConcurrent(t *testing.T) {
	t.Parallel()
	opts := testOptions(shared(t).Addr())
	opts.RejectCache = 10
	c := newClient(t, opts)
	limitertest.RunConcurrent(t, c.Store(t.Name()), 32, 50, 100)
}

// TestSlidingWindowLongLog admits thousands of distinct instants into one window, with a low
// rebase threshold so that the log is rewritten several times, and compares every answer, and
// the retry search over the long log, with limiter.Memory. It reports the memory a client takes.
func TestSlidingWindowLongLog(t *testing.T) {
	t.Parallel()
	opts := testOptions(shared(t).Addr())
	opts.rebaseThreshold = frequentRebases
	c := newClient(t, opts)
	s := c.Store(t.Name())
	mem := limiter.NewMemory(nil)
	rl := slidingWindow(t, 100_000, 3*time.Second)
	ctx := t.Context()
	const entries = 6000
	now := limitertest.T0
	for i := range entries + 200 {
		now = now.Add(time.Millisecond + time.Duration(i%7)) // 6000 entries span 6s: expiries too
		cost := int64(1 + i%50)
		got, err := s.Decide(ctx, "long", limitertest.One(rl), now, cost, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := mem.Decide(ctx, "long", limitertest.One(rl), now, cost, nil)
		if got != want {
			t.Fatalf("step %d: redis %+v, memory %+v", i, got, want)
		}
	}
	// A cost that waits for many entries to leave: the binary search over a long log.
	for _, cost := range []int64{50_000, 99_999, 100_000} {
		got, _ := s.Decide(ctx, "long", limitertest.One(rl), now, 0, nil)
		want, _ := mem.Decide(ctx, "long", limitertest.One(rl), now, 0, nil)
		if got != want {
			t.Fatalf("peek: redis %+v, memory %+v", got, want)
		}
		got, err := s.Decide(ctx, "long", limitertest.One(rl), now, cost, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ = mem.Decide(ctx, "long", limitertest.One(rl), now, cost, nil)
		if got != want {
			t.Fatalf("cost %d: redis %+v, memory %+v", cost, got, want)
		}
	}
	if epoch := do(t, c, "LINDEX", Key(t.Name(), "long"), "1"); epoch == strconv.FormatInt(limitertest.T0.Unix(), 10) {
		t.Fatalf("the log was never rebased (epoch %s)", epoch)
	}
	n, _ := strconv.Atoi(do(t, c, "LLEN", Key(t.Name(), "long")))
	bytes, _ := strconv.Atoi(do(t, c, "MEMORY", "USAGE", Key(t.Name(), "long")))
	t.Logf("a sliding-window client with %d entries takes %d bytes in Redis (%.1f bytes an entry)", (n-3)/2, bytes, float64(bytes)/float64((n-3)/2))
}

// TestOverflow runs the overflow table of limitertest on Redis: costs up to math.MaxInt64,
// which the scripts take as doubles, refunds of huge amounts, batches whose costs sum beyond
// int64, on strategies at the corners of their bounds.
func TestOverflow(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunOverflow(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

// TestClockJumps runs limitertest.RunClockJumps on Redis on the caller's clock: a replica's
// clock stepped back or jumping forward never lets a client's state admit more than the limit
// on the clock of its latest admission.
func TestClockJumps(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunClockJumps(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) }, testseed.Seed(t))
}

// TestOverflowMatchesMemory decides random sequences on the strategies at the corners of their
// bounds (limitertest.OverflowLimits) in Redis and in limiter.Memory, and requires the same
// answer to every decision, peek and refund: the scripts, whose numbers are doubles (exact below
// 2^53), split instants and intervals into limbs so that a full refill of almost a year (3.2e16
// ns, above 2^53), fractions of 1/1e9 ns and costs up to 1e9 lose nothing.
func TestOverflowMatchesMemory(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	base := testseed.Seed(t)
	for name, rl := range limitertest.OverflowLimits() {
		t.Run(name, func(t *testing.T) {
			s := c.Store(t.Name())
			mem := limiter.NewMemory(nil)
			st := limitertest.One(rl)
			limit, window := rl.Limit(), rl.Window()
			r := rand.New(rand.NewPCG(base, uint64(len(name))))
			now := limitertest.T0
			for i := range 400 {
				switch r.IntN(4) {
				case 0: // the same instant
				case 1:
					now = now.Add(time.Duration(r.Int64N(1000))) // nanoseconds: the fractions
				default:
					now = now.Add(time.Duration(r.Int64N(int64(max(window/5, 1)))))
				}
				cost := []int64{1, limit, limit - 1, limit/2 + 1, 1 + r.Int64N(limit), 1 + r.Int64N(limit), math.MaxInt64, 1<<53 + 1}[r.IntN(8)]
				cost = max(cost, 1)
				var got, want limiter.Decision
				var gotErr, wantErr error
				op := "decide"
				switch r.IntN(10) {
				case 0:
					op, cost = "peek", 0
					got, gotErr = s.Decide(t.Context(), "k", st, now, 0, nil)
					want, wantErr = mem.Decide(t.Context(), "k", st, now, 0, nil)
				case 1:
					op = "refund"
					got, gotErr = limitertest.Refund(s, "k", st, now, cost, nil)
					want, wantErr = limitertest.Refund(mem, "k", st, now, cost, nil)
				default:
					got, gotErr = s.Decide(t.Context(), "k", st, now, cost, nil)
					want, wantErr = mem.Decide(t.Context(), "k", st, now, cost, nil)
				}
				if gotErr != nil || wantErr != nil {
					t.Fatalf("step %d: %s %d at %v: redis %v, memory %v", i, op, cost, now.Sub(limitertest.T0), gotErr, wantErr)
				}
				if got != want {
					t.Fatalf("step %d (seed %d): %s %d at %v:\n redis  %+v\n memory %+v", i, base, op, cost, now.Sub(limitertest.T0), got, want)
				}
			}
		})
	}
}

// TestFarInstants runs limitertest.RunFarInstants on Redis on the caller's clock: a clock near
// or past the ends of int64 nanoseconds is decided at limiter.ClampInstant's bound, as in
// memory, instead of failing (a store error, which failure mode Open admits) or admitting
// everything. The scripts clamp the server's clock to the same bounds (decide.lua, TIME);
// TestScriptsClampTheServerClock checks that they carry them.
func TestFarInstants(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	limitertest.RunFarInstants(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

// TestScriptsClampTheServerClock checks that every decision script clamps Redis TIME to the
// bounds of limiter.ClampInstant, written as the literals of limiter's instants.
func TestScriptsClampTheServerClock(t *testing.T) {
	latestS, latestN := split(limiter.LatestInstant.UnixNano())
	earliestS, earliestN := split(limiter.EarliestInstant.UnixNano())
	want := fmt.Sprintf("if nows > %d or (nows == %d and nown > %d) then", latestS, latestS, latestN)
	wantEarly := fmt.Sprintf("elseif nows < %d or (nows == %d and nown < %d) then", earliestS, earliestS, earliestN)
	for set := withTokenBucket; set <= withAll; set++ {
		for full := range 2 {
			src := decideScripts[set][full].source
			if !strings.Contains(src, want) || !strings.Contains(src, wantEarly) {
				t.Fatalf("decision script of set %d (full %d) does not clamp TIME to %v and %v", set, full, limiter.EarliestInstant, limiter.LatestInstant)
			}
		}
	}
}

// TestExpirySlack checks that every algorithm's write adds ExpirySlack to its key's expiry:
// with a slack of 10 hours, a state fresh again within a day expires after more than 10 hours
// plus half of that, and not after 10 hours plus a day. (The bounds leave minutes between the
// write and PTTL.)
func TestExpirySlack(t *testing.T) {
	const slack = 10 * time.Hour
	c := newClient(t, Options{Addrs: []string{shared(t).Addr()}, Timeout: 10 * time.Second, ExpirySlack: slack})
	s := c.Store(t.Name())
	for _, tc := range []struct {
		rl    limiter.RateLimiter
		fresh time.Duration // at least, at most a day
	}{
		{tokenBucket(t, 2, 1, 2*time.Hour), time.Hour}, // one token of two owed: an hour
		{slidingWindow(t, 10, time.Hour), time.Hour},
		{quota(t, 10, limiter.PeriodDay, "UTC"), 0}, // the rest of today
	} {
		key := "slack-" + fingerprint(tc.rl)
		if d := decide(t, s, key, tc.rl, time.Time{}, 1); !d.Allowed {
			t.Fatalf("%s: %+v", fingerprint(tc.rl), d)
		}
		pttl, err := strconv.ParseInt(do(t, c, "PTTL", Key(t.Name(), key)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Duration(pttl) * time.Millisecond; got < slack+tc.fresh/2 || got > slack+24*time.Hour {
			t.Errorf("%s: PTTL %v with a slack of %v, want in [%v, %v]", fingerprint(tc.rl), got, slack, slack+tc.fresh/2, slack+24*time.Hour)
		}
	}
}
