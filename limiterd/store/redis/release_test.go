package redis

import (
	"context"
	_ "embed"
	"math/rand/v2"
	"regexp"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// The previous release's Lua library and entry script, as it shipped (commit f7cd87e), before
// a sliding window's head carried its newest entry. Replicas of that release and of this one
// decide on one Redis during a rolling upgrade: each must decide exactly on what the other
// wrote. Replace them by the release before a change of the state's layout or of the protocol
// (whose values they are joined with).
var (
	//go:embed testdata/previous/algorithms.lua
	previousAlgorithms string
	//go:embed testdata/previous/decide.lua
	previousDecide string

	previousLibrary = library{
		decide: joinScripts(previousWithSections, entryHead(previousDecide)),
		once:   joinScripts(previousWithSections, entry{rest: onceEntryOf(previousDecide)}),
	}
	// previousWithSections is the previous library with an empty section for each algorithm it
	// did not know (its release refused their policies on Redis), so that it joins as the
	// current one does.
	previousWithSections = previousAlgorithms + "\n-- Concurrency limits. (none: the previous release refused them)\n"
)

// previousStore returns the store of policy on c that a replica of the previous release runs:
// the same keys as c.Store(policy)'s, decided by the previous release's scripts.
func previousStore(c *Client, policy string) *Store {
	s := c.Store(policy)
	s.lib = &previousLibrary
	return s
}

// releases is a limiter.Store of replicas of two releases on one Redis: each call goes to the
// current release's store or to the previous release's, at random (Reset, Sweep and Close to
// the current one).
type releases struct {
	*Store
	previous *Store
	r        *rand.Rand
}

func (m *releases) pick() *Store {
	if m.r.IntN(2) == 0 {
		return m.previous
	}
	return m.Store
}

func (m *releases) Decide(ctx context.Context, key string, st *limiter.Stack, now time.Time, cost int64, out []limiter.Decision) (limiter.Decision, error) {
	return m.pick().Decide(ctx, key, st, now, cost, out)
}

func (m *releases) Refund(ctx context.Context, req limiter.Request, now time.Time, once limiter.Once) (limiter.Decision, error) {
	return m.pick().Refund(ctx, req, now, once)
}

func (m *releases) DecideBatch(ctx context.Context, reqs []limiter.Request, now time.Time, out []limiter.Answer) {
	m.pick().DecideBatch(ctx, reqs, now, out)
}

// carriedHead matches a sliding window's head that carries its newest entry (swNewest).
var carriedHead = regexp.MustCompile(`^sw:[0-9]{32}[0-9]+:[0-9]+$`)

// TestReleasesMixMatchesMemory runs the random comparisons with memory of TestMatchesMemory and
// TestStackMatchesMemory (decisions, peeks, refunds, batches, strategies swapped, algorithms
// converted, clock steps backwards, frequent rebases) with each call made by a replica of this
// release or of the previous one at random, on the same keys: every answer must be memory's, so
// each release decides exactly on the states the other wrote (a sliding window's head that
// carries its newest entry, which the previous release read as the fingerprint of the same
// window, and the plain head it writes back).
//
// It runs a quarter of TestMatchesMemory's seeds (-seeds): each seed decides as many steps as
// both comparisons, and the seeds are new in every run (testseed).
func TestReleasesMixMatchesMemory(t *testing.T) {
	t.Parallel()
	forEachRebaseAndSeed(t, max(1, seeds/4), func(t *testing.T, s *Store, seed uint64) {
		mix := &releases{Store: s, previous: previousStore(s.c, s.policy), r: rand.New(rand.NewPCG(seed, 13))}
		compareWithMemory(t, mix, rand.New(rand.NewPCG(seed, 7)), 2000)
		stacks := s.policy + "#stacks" // keys of their own: each comparison starts with a fresh memory
		mix = &releases{Store: s.c.Store(stacks), previous: previousStore(s.c, stacks), r: rand.New(rand.NewPCG(seed, 17))}
		compareStackWithMemory(t, mix, rand.New(rand.NewPCG(seed, 11)), 1000)
	})
}

// TestReleasesMixOnLongLog decides a long sliding-window log (costs of 1 to 50 units, and now
// and then one of half the limit or more, entries leaving the window all along, frequent
// rebases, refunds, rejections answered by a search for their retry time) in runs of 1 to 40 decisions, each
// run by a replica of this release or of the previous one, in turns, and compares every answer
// with memory. The previous release starts, so this release first decides on a log of the
// previous layout; the previous release then decides on heads that carry the newest entry
// (counted: the test fails if it never did).
func TestReleasesMixOnLongLog(t *testing.T) {
	t.Parallel()
	opts := testOptions(shared(t).Addr())
	opts.rebaseThreshold = frequentRebases
	c := newClient(t, opts)
	replicas := [2]*Store{previousStore(c, t.Name()), c.Store(t.Name())}
	mem := limiter.NewMemory(nil)
	rl := slidingWindow(t, 100_000, 3*time.Second)
	ctx := t.Context()
	r := rand.New(rand.NewPCG(36, 2))
	key := Key(t.Name(), "long")
	now := limitertest.T0
	carriedForPrevious := 0
	for i, release, run := 0, 1, 0; i < 8000; i++ {
		if run == 0 { // the other release's turn: the previous one's first
			release, run = 1-release, 1+r.IntN(40)
			if release == 0 && i > 0 && carriedHead.MatchString(do(t, c, "LINDEX", key, "0")) {
				carriedForPrevious++
			}
		}
		run--
		s := replicas[release]
		now = now.Add(time.Millisecond + time.Duration(i%7))
		cost := int64(1 + i%50)
		if r.IntN(500) == 0 { // a cost that the window may hold only after many entries left it
			cost = 50_000 + r.Int64N(50_000)
		}
		if r.IntN(20) == 0 {
			want, err := limitertest.Refund(mem, "long", limitertest.One(rl), now, cost, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := limitertest.Refund(s, "long", limitertest.One(rl), now, cost, nil)
			if err != nil || got != want {
				t.Fatalf("step %d (release %d): refund of %d: redis %+v, %v; memory %+v", i, release, cost, got, err, want)
			}
			continue
		}
		got, err := s.Decide(ctx, "long", limitertest.One(rl), now, cost, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := mem.Decide(ctx, "long", limitertest.One(rl), now, cost, nil)
		if got != want {
			t.Fatalf("step %d (release %d): decide %d: redis %+v, memory %+v", i, release, cost, got, want)
		}
	}
	if carriedForPrevious == 0 {
		t.Fatal("the previous release never decided on a head that carries the newest entry")
	}
	t.Logf("the previous release took over from this one %d times on a head that carries the newest entry", carriedForPrevious)
}

// TestPreviousReleaseConvertsCarryingLog converts, with the previous release, a sliding
// window's log whose head carries the newest entry (written by this release) to a token bucket
// and to a quota: the previous release reads the window from the head, charges the units the log
// holds in it, and answers as memory does. A head it could not read would give them back.
func TestPreviousReleaseConvertsCarryingLog(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	current, previous := c.Store(t.Name()), previousStore(c, t.Name())
	mem := limiter.NewMemory(nil)
	ctx := t.Context()
	sw := slidingWindow(t, 100, time.Minute)
	quota, err := limiter.NewQuota(100, limiter.PeriodDay, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []limiter.RateLimiter{tokenBucket(t, 100, 1, time.Second), quota} {
		client := fingerprint(other)
		now := limitertest.T0
		// 12 entries of 3 units, 10 s apart: from the 9th, 3 or more out of the window, and the
		// head carries the newest entry; the 10th drops them.
		for i := range 12 {
			now = limitertest.T0.Add(time.Duration(i) * 10 * time.Second)
			want, _ := mem.Decide(ctx, client, limitertest.One(sw), now, 3, nil)
			if got, err := current.Decide(ctx, client, limitertest.One(sw), now, 3, nil); err != nil || got != want {
				t.Fatalf("%s: decision %d: %+v, %v; want %+v", client, i, got, err, want)
			}
		}
		if head := do(t, c, "LINDEX", Key(t.Name(), client), "0"); !carriedHead.MatchString(head) {
			t.Fatalf("%s: the log's head is %q, want one that carries the newest entry", client, head)
		}
		now = now.Add(time.Second)
		for i := range 3 {
			want, _ := mem.Decide(ctx, client, limitertest.One(other), now, 30, nil)
			got, err := previous.Decide(ctx, client, limitertest.One(other), now, 30, nil)
			if err != nil || got != want {
				t.Fatalf("%s: decision %d by the previous release: %+v, %v; want %+v", client, i, got, err, want)
			}
		}
	}
}
