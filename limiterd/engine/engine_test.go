package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/policy"
)

var ctx = context.Background()

func tokenBucket(name string, capacity int64) v1alpha1.Tier {
	return v1alpha1.Tier{Name: name, Algorithm: v1alpha1.AlgorithmTokenBucket,
		TokenBucket: &v1alpha1.TokenBucket{Capacity: capacity, RefillRate: 1, RefillPeriod: &metav1.Duration{Duration: time.Hour}}}
}

func slidingWindow(name string, limit int64) v1alpha1.Tier {
	return v1alpha1.Tier{Name: name, Algorithm: v1alpha1.AlgorithmSlidingWindow,
		SlidingWindow: &v1alpha1.SlidingWindow{Limit: limit, Window: metav1.Duration{Duration: time.Hour}}}
}

func compile(t testing.TB, name string, mutate func(*v1alpha1.RateLimitPolicySpec)) *policy.Policy {
	t.Helper()
	src := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"}, Spec: v1alpha1.RateLimitPolicySpec{
		DefaultTier: "free",
		Tiers:       []v1alpha1.Tier{tokenBucket("free", 2), tokenBucket("shadow", 1), {Name: "vip", Algorithm: v1alpha1.AlgorithmUnlimited}},
		Overrides: []v1alpha1.Override{
			{Tier: "shadow", ClientPrefixes: []string{"try-"}},
			{Tier: "vip", Clients: []string{"boss"}},
		},
	}}
	src.Spec.Tiers[1].DryRun = true
	if mutate != nil {
		mutate(&src.Spec)
	}
	p, err := policy.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func set(t testing.TB, ps ...*policy.Policy) *policy.Set {
	t.Helper()
	s, err := policy.NewSet(ps...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fixedClock() func() time.Time { return func() time.Time { return limitertest.T0 } }

func allowedN(t *testing.T, e *engine.Engine, policyID v1alpha1.PolicyID, key string, n int) int {
	t.Helper()
	admitted := 0
	for i := 0; i < n; i++ {
		r, err := e.Decide(ctx, policyID, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
	}
	return admitted
}

func TestRequestErrorsConsumeNothing(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	if _, err := e.Decide(ctx, "", "k", 1); !errors.Is(err, engine.ErrNotReady) {
		t.Fatalf("before any policy: %v", err)
	}
	e.Swap(set(t, compile(t, "a", nil)))
	if _, err := e.Decide(ctx, "", "k", -1); !errors.Is(err, engine.ErrInvalidCost) {
		t.Fatalf("cost -1: %v", err)
	}
	if _, err := e.Decide(ctx, "team/missing", "k", 1); !errors.Is(err, engine.ErrUnknownPolicy) {
		t.Fatalf("unknown policy: %v", err)
	}
	if got := allowedN(t, e, "", "k", 5); got != 2 {
		t.Fatalf("the only policy, named by omission: admitted %d of 5, want 2", got)
	}
	e.Swap(set(t, compile(t, "a", nil), compile(t, "b", nil)))
	if _, err := e.Decide(ctx, "", "k", 1); !errors.Is(err, engine.ErrPolicyRequired) {
		t.Fatalf("omitted policy with two loaded: %v", err)
	}
	if got := allowedN(t, e, "team/b", "k", 5); got != 2 {
		t.Fatalf("policies share client state: admitted %d of 5 under team/b, want 2", got)
	}
}

func TestDryRunAndUnlimitedTiers(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	e.Swap(set(t, compile(t, "a", nil)))
	var outcomes []engine.Outcome
	for i := 0; i < 3; i++ {
		r, err := e.Decide(ctx, "team/a", "try-1", 1)
		if err != nil || !r.Allowed || r.Tier.Name != "shadow" {
			t.Fatalf("dry-run decision %d: %+v %v", i, r, err)
		}
		outcomes = append(outcomes, r.Outcome)
	}
	if !slices.Equal(outcomes, []engine.Outcome{engine.Allowed, engine.DryRunRejected, engine.DryRunRejected}) {
		t.Fatalf("dry-run outcomes %v", outcomes)
	}
	if got := allowedN(t, e, "team/a", "boss", 1000); got != 1000 {
		t.Fatalf("unlimited tier admitted %d of 1000", got)
	}
}

// TestSwapRule checks the documented rule for client state across a swap.
func TestSwapRule(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	e.Swap(set(t, compile(t, "a", nil)))
	allowedN(t, e, "team/a", "c", 2) // c has used its 2 tokens

	// Unchanged parameters (another tier changed): c keeps its state.
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.Tiers[1] = tokenBucket("shadow", 7) })))
	if got := allowedN(t, e, "team/a", "c", 1); got != 0 {
		t.Fatalf("unchanged tier: c admitted %d after using its allowance", got)
	}
	// Same algorithm, bigger capacity: usage (2) carries over, 3 more fit.
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.Tiers[0] = tokenBucket("free", 5) })))
	if got := allowedN(t, e, "team/a", "c", 10); got != 3 {
		t.Fatalf("capacity 2→5: admitted %d, want 3", got)
	}
	// A new algorithm is charged the units in use (a conversion never gives usage back): the
	// bucket's 5 tokens used take 5 of the window's 8.
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.Tiers[0] = slidingWindow("free", 8) })))
	if got := allowedN(t, e, "team/a", "c", 10); got != 3 {
		t.Fatalf("token bucket→sliding window: admitted %d, want 3", got)
	}
	// One client moved to its own tier by an override.
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Tiers[0] = slidingWindow("free", 4)
		s.Overrides = append(s.Overrides, v1alpha1.Override{Tier: "vip", Clients: []string{"c"}})
	})))
	if got := allowedN(t, e, "team/a", "c", 100); got != 100 {
		t.Fatalf("client moved to unlimited: admitted %d of 100", got)
	}
	if got := allowedN(t, e, "team/a", "other", 10); got != 4 {
		t.Fatalf("other clients: admitted %d, want 4", got)
	}
	// A policy that leaves and comes back starts with fresh clients.
	e.Swap(set(t, compile(t, "b", nil)))
	e.Swap(set(t, compile(t, "a", nil), compile(t, "b", nil)))
	if got := allowedN(t, e, "team/a", "other", 10); got != 2 {
		t.Fatalf("re-added policy: admitted %d, want 2", got)
	}
}

// failingStore fails every operation, like an unreachable Redis.
type failingStore struct{}

var errDown = errors.New("store down")

func (failingStore) Decide(context.Context, string, *limiter.Stack, time.Time, int64, []limiter.Decision) (limiter.Decision, error) {
	return limiter.Decision{}, errDown
}
func (failingStore) Refund(context.Context, limiter.Request, time.Time, limiter.Once) (limiter.Decision, error) {
	return limiter.Decision{}, errDown
}
func (failingStore) DecideBatch(_ context.Context, reqs []limiter.Request, _ time.Time, out []limiter.Answer) {
	for i := range reqs {
		out[i] = limiter.Answer{Err: errDown}
	}
}
func (failingStore) Reset(context.Context, string, time.Time) error { return errDown }

func TestFailureModes(t *testing.T) {
	for mode, want := range map[v1alpha1.FailureMode]int{
		v1alpha1.FailureModeOpen:   10,
		v1alpha1.FailureModeClosed: 0,
		v1alpha1.FailureModeLocal:  2,
	} {
		t.Run(string(mode), func(t *testing.T) {
			e := engine.New(engine.Options{Clock: fixedClock(), NewStore: func(v1alpha1.PolicyID) limiter.Store { return failingStore{} }})
			e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.FailureMode = mode })))
			if got := allowedN(t, e, "team/a", "c", 10); got != want {
				t.Fatalf("admitted %d of 10, want %d", got, want)
			}
			r, err := e.Decide(ctx, "team/a", "c", 1)
			if err != nil || !errors.Is(r.StoreError, errDown) {
				t.Fatalf("store error not reported: %+v %v", r, err)
			}
			// A peek answers by the failure mode too: Local peeks at the fallback's state.
			r, err = e.Decide(ctx, "team/a", "c", 0)
			if err != nil || !errors.Is(r.StoreError, errDown) || r.Allowed != (mode == v1alpha1.FailureModeOpen) {
				t.Fatalf("peek: %+v %v, want allowed only when Open", r, err)
			}
			if mode == v1alpha1.FailureModeLocal && r.Remaining != 0 {
				t.Fatalf("peek under Local: %d remaining, want the fallback's 0", r.Remaining)
			}
		})
	}
}

// countingObserver counts the decisions recorded.
type countingObserver struct {
	engine.NopObserver
	n *int
}

func (o countingObserver) Tier(v1alpha1.PolicyID, string) engine.TierObserver { return o }
func (o countingObserver) Observe(engine.Outcome, time.Duration)              { *o.n++ }

// TestCostZeroPeeks checks that a cost of 0 answers what one unit would get, consumes nothing,
// and is not recorded as a decision.
func TestCostZeroPeeks(t *testing.T) {
	var observed int
	e := engine.New(engine.Options{Clock: fixedClock(), Observer: countingObserver{n: &observed}})
	e.Swap(set(t, compile(t, "a", nil)))
	for i := range 3 {
		r, err := e.Decide(ctx, "team/a", "k", 0)
		if err != nil || !r.Allowed || r.Remaining != 2 || r.Outcome != engine.Allowed {
			t.Fatalf("peek %d at a fresh client: %+v %v", i, r, err)
		}
	}
	if got := allowedN(t, e, "team/a", "k", 3); got != 2 {
		t.Fatalf("after the peeks: admitted %d of 3, want the whole capacity 2", got)
	}
	r, err := e.Decide(ctx, "team/a", "k", 0)
	if err != nil || r.Allowed || r.Outcome != engine.Rejected || r.RetryAfter != time.Hour {
		t.Fatalf("peek at an exhausted client: %+v %v, want rejected, one unit back in 1h", r, err)
	}
	if r, err := e.Decide(ctx, "team/a", "try-1", 0); err != nil || !r.Allowed {
		t.Fatalf("peek on a dry-run tier: %+v %v", r, err)
	}
	if observed != 3 {
		t.Fatalf("observed %d decisions, want the 3 that were not peeks", observed)
	}
}

// TestDecideWhileSwapping races decisions with swaps: every decision completes on one snapshot
// or the other, and the unchanged tier's clients never get more than their capacity.
func TestDecideWhileSwapping(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	a := compile(t, "a", nil)
	b := compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.Tiers[2] = tokenBucket("vip", 1) })
	// Both sets are built here, on the test goroutine: set fails with t.Fatal, which must not be
	// called from the swapper (it would end that goroutine, not the test).
	sets := [2]*policy.Set{set(t, b), set(t, a)}
	e.Swap(sets[1])
	stop := make(chan struct{})
	swapperDone := make(chan struct{})
	go func() {
		defer close(swapperDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			e.Swap(sets[i%2])
		}
	}()
	var (
		deciders sync.WaitGroup
		mu       sync.Mutex
		admitted int
	)
	for w := 0; w < 8; w++ {
		deciders.Add(1)
		go func() {
			defer deciders.Done()
			for i := 0; i < 500; i++ {
				r, err := e.Decide(ctx, "team/a", "shared", 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	deciders.Wait()
	close(stop)
	<-swapperDone
	if admitted != 2 {
		t.Fatalf("admitted %d on a tier of capacity 2 while swapping", admitted)
	}
}

// BenchmarkSwapWithManyClients measures a swap while 1M clients are tracked: it must not depend
// on their number.
func BenchmarkSwapWithManyClients(b *testing.B) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	a := compile(b, "a", nil)
	e.Swap(set(b, a))
	for i := 0; i < 1_000_000; i++ {
		if _, err := e.Decide(ctx, "team/a", fmt.Sprintf("client-%07d", i), 1); err != nil {
			b.Fatal(err)
		}
	}
	if got := e.Budget().Tracked(); got != 1_000_000 {
		b.Fatalf("tracked %d", got)
	}
	next := []*policy.Set{
		set(b, compile(b, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.Tiers[0] = tokenBucket("free", 3) })),
		set(b, a),
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.Swap(next[i%2])
	}
}
