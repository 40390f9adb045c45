package engine_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
)

// outcomeCounter counts outcomes by policy, tier and outcome.
type outcomeCounter struct {
	engine.NopObserver
	mu     sync.Mutex
	counts map[string]int
}

func (o *outcomeCounter) Tier(id v1alpha1.PolicyID, tier string) engine.TierObserver {
	return tierCounter{o: o, prefix: string(id) + "/" + tier}
}

type tierCounter struct {
	o      *outcomeCounter
	prefix string
}

func (c tierCounter) Observe(out engine.Outcome, _ time.Duration) {
	c.o.mu.Lock()
	defer c.o.mu.Unlock()
	if c.o.counts == nil {
		c.o.counts = make(map[string]int)
	}
	c.o.counts[c.prefix+" "+out.String()]++
}

var errKinds = []error{engine.ErrUnknownPolicy, engine.ErrPolicyRequired, engine.ErrInvalidCost, engine.ErrNotReady}

func errKind(err error) error {
	for _, k := range errKinds {
		if errors.Is(err, k) {
			return k
		}
	}
	return err
}

// checkBatchMatchesDecide decides items in one batch on one engine and one by one on another
// built alike, and requires the same answers and the same observations.
func checkBatchMatchesDecide(t *testing.T, newEngine func(engine.Observer) *engine.Engine, items []engine.BatchItem) {
	t.Helper()
	var batchObs, serialObs outcomeCounter
	batched, serial := newEngine(&batchObs), newEngine(&serialObs)
	out := make([]engine.BatchResult, len(items))
	if err := batched.DecideBatch(ctx, items, out); err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		want, werr := serial.Decide(ctx, it.Policy, it.Key, it.Cost)
		got := out[i]
		if k := errKind(werr); (k == nil) != (got.Err == nil) || (k != nil && !errors.Is(got.Err, k)) {
			t.Fatalf("item %d %+v: batch error %v, one by one %v", i, it, got.Err, werr)
		}
		if werr != nil {
			continue
		}
		if got.Decision != want.Decision || got.Outcome != want.Outcome || got.Tier.Name != want.Tier.Name ||
			got.Policy.ID != want.Policy.ID || (got.StoreError == nil) != (want.StoreError == nil) ||
			!slices.Equal(got.Limits, want.Limits) || got.Binding != want.Binding {
			t.Fatalf("item %d %+v:\n batch      %+v %s %s %v %+v %d\n one by one %+v %s %s %v %+v %d", i, it,
				got.Decision, got.Outcome, got.Tier.Name, got.StoreError, got.Limits, got.Binding,
				want.Decision, want.Outcome, want.Tier.Name, want.StoreError, want.Limits, want.Binding)
		}
	}
	if fmt.Sprint(batchObs.counts) != fmt.Sprint(serialObs.counts) {
		t.Fatalf("observed\n batch      %v\n one by one %v", batchObs.counts, serialObs.counts)
	}
}

func TestDecideBatchMatchesDecide(t *testing.T) {
	newEngine := func(o engine.Observer) *engine.Engine {
		e := engine.New(engine.Options{Clock: fixedClock(), Observer: o})
		e.Swap(set(t, compile(t, "a", nil), compile(t, "b", func(s *v1alpha1.RateLimitPolicySpec) { s.Tiers[0] = slidingWindow("free", 3) })))
		return e
	}
	var items []engine.BatchItem
	for i := range 40 {
		p := v1alpha1.PolicyID("team/a")
		if i%3 == 0 {
			p = "team/b"
		}
		items = append(items, engine.BatchItem{Policy: p, Key: fmt.Sprintf("c%d", i%4), Cost: int64(i % 3)}) // 0: a peek
	}
	items = append(items,
		engine.BatchItem{Policy: "team/missing", Key: "c0", Cost: 1},
		engine.BatchItem{Policy: "", Key: "c0", Cost: 1}, // two policies loaded: one must be named
		engine.BatchItem{Policy: "team/a", Key: "c0", Cost: -1},
		engine.BatchItem{Policy: "team/a", Key: "c1", Cost: 0}, // peeks: not observed
		engine.BatchItem{Policy: "team/b", Key: "c0", Cost: 0},
		engine.BatchItem{Policy: "team/a", Key: "fresh", Cost: 0},
		engine.BatchItem{Policy: "team/a", Key: "try-1", Cost: 1}, // dry-run tier, capacity 1
		engine.BatchItem{Policy: "team/a", Key: "try-1", Cost: 1},
		engine.BatchItem{Policy: "team/a", Key: "boss", Cost: 1000}, // unlimited
		engine.BatchItem{Policy: "team/a", Key: "fresh", Cost: 3},   // above the capacity
		engine.BatchItem{Policy: "team/b", Key: "fresh", Cost: 3},
		engine.BatchItem{Policy: "team/a", Key: "fresh", Cost: 2},
	)
	checkBatchMatchesDecide(t, newEngine, items)
}

// TestDecideBatchFailureModes runs a batch on a store that fails and is no BatchStore: the
// items go one by one to it and the failure mode decides each, in order.
func TestDecideBatchFailureModes(t *testing.T) {
	for _, mode := range []v1alpha1.FailureMode{v1alpha1.FailureModeOpen, v1alpha1.FailureModeClosed, v1alpha1.FailureModeLocal} {
		t.Run(string(mode), func(t *testing.T) {
			newEngine := func(o engine.Observer) *engine.Engine {
				e := engine.New(engine.Options{Clock: fixedClock(), Observer: o,
					NewStore: func(v1alpha1.PolicyID) limiter.Store { return failingStore{} }})
				e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.FailureMode = mode })))
				return e
			}
			var items []engine.BatchItem
			for i := range 10 {
				items = append(items, engine.BatchItem{Policy: "team/a", Key: fmt.Sprintf("c%d", i%2), Cost: 1})
			}
			checkBatchMatchesDecide(t, newEngine, items)
		})
	}
}

func TestDecideBatchBeforeAnyPolicy(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	out := make([]engine.BatchResult, 1)
	if err := e.DecideBatch(ctx, []engine.BatchItem{{Key: "k", Cost: 1}}, out); !errors.Is(err, engine.ErrNotReady) {
		t.Fatalf("before any policy: %v", err)
	}
}
