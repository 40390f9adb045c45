package replicastatus

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/source"
)

func TestCutError(t *testing.T) {
	if got := cutError(nil); got != "" {
		t.Errorf("cutError(nil) = %q", got)
	}
	msg := strings.Repeat("é", maxErrorBytes) // 2 bytes each
	got := cutError(errors.New(msg))
	if len(got) > maxErrorBytes || !strings.HasSuffix(got, "...") || !strings.HasPrefix(msg, strings.TrimSuffix(got, "...")) {
		t.Errorf("cutError kept %d bytes: %q", len(got), got)
	}
}

func TestLeaseDuration(t *testing.T) {
	for interval, want := range map[time.Duration]time.Duration{
		5 * time.Second:         15 * time.Second,
		time.Second:             3 * time.Second,
		300 * time.Millisecond:  time.Second,
		100 * time.Millisecond:  time.Second,
		1500 * time.Millisecond: 5 * time.Second,
	} {
		if got := LeaseDuration(interval); got != want {
			t.Errorf("LeaseDuration(%v) = %v, want %v", interval, got, want)
		}
	}
}

// compiled returns policy ns/name at generation with a dry-run default tier of capacity 1 and a
// tier "hard" of capacity 1 for the client "hard".
func compiled(t *testing.T, name string, generation int64) *policy.Policy {
	t.Helper()
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Generation: generation},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "shadow",
			Tiers: []v1alpha1.Tier{
				{Name: "shadow", Algorithm: v1alpha1.AlgorithmTokenBucket, DryRun: true,
					TokenBucket: &v1alpha1.TokenBucket{Capacity: 1, RefillRate: 1, RefillPeriod: &metav1.Duration{Duration: time.Hour}}},
				{Name: "hard", Algorithm: v1alpha1.AlgorithmTokenBucket,
					TokenBucket: &v1alpha1.TokenBucket{Capacity: 1, RefillRate: 1, RefillPeriod: &metav1.Duration{Duration: time.Hour}}},
			},
			Overrides: []v1alpha1.Override{{Tier: "hard", Clients: []string{"hard"}}},
		},
	}
	c, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func set(t *testing.T, ps ...*policy.Policy) *policy.Set {
	t.Helper()
	s, err := policy.NewSet(ps...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// countingObserver counts the outcomes it is given, per policy.
type countingObserver struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *countingObserver) Tier(policyID v1alpha1.PolicyID, tier string) engine.TierObserver {
	return observeFunc(func(o engine.Outcome) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.counts[policyID.String()+" "+tier+" "+o.String()]++
	})
}

func (c *countingObserver) Policy(v1alpha1.PolicyID) engine.PolicyObserver {
	return engine.NopObserver{}
}
func (c *countingObserver) Leases(v1alpha1.PolicyID, string) engine.LeaseObserver {
	return engine.NopObserver{}
}
func (c *countingObserver) Forget(v1alpha1.PolicyID, string) {}

type observeFunc func(engine.Outcome)

func (f observeFunc) Observe(o engine.Outcome, _ time.Duration) { f(o) }

func decide(t *testing.T, e *engine.Engine, id v1alpha1.PolicyID, key string, n int) {
	t.Helper()
	for range n {
		if _, err := e.Decide(t.Context(), id, key, 1); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTallyCountsDryRunRejectionsPerGeneration(t *testing.T) {
	inner := &countingObserver{counts: map[string]int{}}
	tally := NewTally(inner)
	e := engine.New(engine.Options{Observer: tally})
	target := tally.Track(e)

	target.Swap(set(t, compiled(t, "a", 1)))
	decide(t, e, "ns/a", "client", 4) // 1 admitted, 3 would have been rejected
	decide(t, e, "ns/a", "hard", 3)   // enforced tier: rejections are not dry-run
	if got := tally.DryRunRejected("ns/a", 1); got != 3 {
		t.Errorf("DryRunRejected(ns/a, 1) = %d, want 3", got)
	}
	if got := inner.counts["ns/a shadow dry_run_rejected"]; got != 3 {
		t.Errorf("wrapped observer saw %d dry-run rejections, want 3 (every observation is forwarded)", got)
	}
	if got := inner.counts["ns/a hard rejected"]; got != 2 {
		t.Errorf("wrapped observer saw %d rejections of the enforced tier, want 2", got)
	}
	if got := tally.DryRunRejected("ns/a", 2); got != 0 {
		t.Errorf("DryRunRejected of a generation not served = %d, want 0", got)
	}

	// Another policy arriving keeps a's generation, and its count.
	target.Swap(set(t, compiled(t, "a", 1), compiled(t, "b", 1)))
	decide(t, e, "ns/a", "client", 1)
	if got := tally.DryRunRejected("ns/a", 1); got != 4 {
		t.Errorf("after an unrelated swap: DryRunRejected(ns/a, 1) = %d, want 4", got)
	}

	// A new generation starts from zero.
	target.Swap(set(t, compiled(t, "a", 2), compiled(t, "b", 1)))
	if got := tally.DryRunRejected("ns/a", 2); got != 0 {
		t.Errorf("new generation: DryRunRejected(ns/a, 2) = %d, want 0", got)
	}
	decide(t, e, "ns/a", "client", 1) // the client's state survives the swap: still empty
	if got := tally.DryRunRejected("ns/a", 2); got != 1 {
		t.Errorf("DryRunRejected(ns/a, 2) = %d, want 1", got)
	}

	// A removed policy is forgotten.
	target.Swap(set(t, compiled(t, "b", 1)))
	if got := tally.DryRunRejected("ns/a", 2); got != 0 {
		t.Errorf("removed policy: DryRunRejected = %d, want 0", got)
	}
}

func TestTallyLeavesEnforcedTiersUnwrapped(t *testing.T) {
	inner := &countingObserver{counts: map[string]int{}}
	tally := NewTally(inner)
	tally.Track(engine.New(engine.Options{Observer: tally})).Swap(set(t, compiled(t, "a", 1)))
	if _, wrapped := tally.Tier("ns/a", "hard").(*dryRunObserver); wrapped {
		t.Error("an enforced tier's observer is wrapped")
	}
	if _, wrapped := tally.Tier("ns/a", "shadow").(*dryRunObserver); !wrapped {
		t.Error("a dry-run tier's observer is not wrapped")
	}
	if _, wrapped := tally.Tier("ns/unknown", "shadow").(*dryRunObserver); wrapped {
		t.Error("the tier of an untracked policy is wrapped")
	}
}

func TestCollect(t *testing.T) {
	tally := NewTally(nil)
	e := engine.New(engine.Options{Observer: tally})
	tally.Track(e).Swap(set(t, compiled(t, "a", 3), compiled(t, "b", 2)))
	decide(t, e, "ns/b", "client", 3)
	bad := errors.New("parse ConfigMap data: " + strings.Repeat("x", 400))
	got := Collect(e.Policies(), tally, []source.Rejection{
		{ConfigMap: "ns/rlp-a", PolicyID: "ns/a", Generation: 3, Err: bad}, // served at that generation since: stale
		{ConfigMap: "ns/rlp-b", PolicyID: "ns/b", Generation: 4, Err: bad}, // newer than served
		{ConfigMap: "ns/rlp-c", PolicyID: "ns/c", Generation: 1, Err: bad}, // never served
		{ConfigMap: "ns/rlp-d", PolicyID: "ns/d", Generation: 0, Err: bad}, // generation unknown
		{ConfigMap: "ns/garbage", PolicyID: "", Generation: 9, Err: bad},   // policy unknown
	})
	want := v1alpha1.ReplicaRecord{
		"ns/a": {Generation: 3, State: v1alpha1.ReplicaServing},
		"ns/b": {Generation: 4, State: v1alpha1.ReplicaRejected, ServingGeneration: 2, DryRunRejected: 2, Error: cutError(bad)},
		"ns/c": {Generation: 1, State: v1alpha1.ReplicaRejected, Error: cutError(bad)},
		"ns/d": {Generation: 0, State: v1alpha1.ReplicaRejected, Error: cutError(bad)},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Collect =\n%v\nwant\n%v", got, want)
	}
	if got := Collect(nil, nil, nil); len(got) != 0 {
		t.Errorf("Collect before any swap = %v, want empty", got)
	}
}
