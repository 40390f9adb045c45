package engine_test

import (
	"fmt"
	"testing"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// capacity10 is a policy whose only tier is a token bucket of capacity 10 refilled 1/h, so
// that every admitted request is usage for the length of a test.
func capacity10(t testing.TB, name string) *policy.Policy {
	return compile(t, name, func(s *v1alpha1.RateLimitPolicySpec) {
		s.Tiers = []v1alpha1.Tier{tokenBucket("free", 10)}
		s.Overrides = nil
	})
}

// fill sends perClient requests for each of clients keys prefix-0..prefix-(clients-1) to a
// policy and returns how many were admitted.
func fill(t *testing.T, e *engine.Engine, policyID v1alpha1.PolicyID, prefix string, clients, perClient int) int {
	t.Helper()
	admitted := 0
	for i := 0; i < clients; i++ {
		admitted += allowedN(t, e, policyID, fmt.Sprintf("%s-%d", prefix, i), perClient)
	}
	return admitted
}

// A removed policy's clients leave the budget: the count stays exact across removals and
// re-adds, and the survivors do not pay for clients nobody tracks any more.
func TestRemovedPolicyReturnsItsClients(t *testing.T) {
	budget := limiter.NewBudget(1000, 0)
	e := engine.New(engine.Options{Budget: budget, Clock: fixedClock()})
	pa, pb := capacity10(t, "pa"), capacity10(t, "pb")
	for cycle := 0; cycle < 4; cycle++ {
		e.Swap(set(t, pa, pb))
		fill(t, e, "team/pb", fmt.Sprintf("c%d", cycle), 900, 1)
		if got := budget.Tracked(); got != 900 {
			t.Fatalf("cycle %d: tracked %d clients after filling pb with 900", cycle, got)
		}
		e.Swap(set(t, pa)) // pb removed: its 900 clients are forgotten
		if got := budget.Tracked(); got != 0 {
			t.Fatalf("cycle %d: tracked %d clients after removing pb, want 0", cycle, got)
		}
	}
	// 300 clients × 15 requests on pa: each is admitted its capacity, none is evicted.
	if got := fill(t, e, "team/pa", "a", 300, 15); got != 3000 {
		t.Fatalf("pa admitted %d, want exactly 3000 (300 clients × capacity 10)", got)
	}
	if budget.Tracked() != 300 || budget.Evictions() != 0 {
		t.Fatalf("tracked %d evictions %d, want 300 and 0", budget.Tracked(), budget.Evictions())
	}
}

// A flood of distinct keys on one policy evicts from the flooded policy, not from another whose
// live clients fit in its share of the bound.
func TestFloodOnOnePolicySparesAnother(t *testing.T) {
	budget := limiter.NewBudget(1000, 0)
	e := engine.New(engine.Options{Budget: budget, Clock: fixedClock()})
	e.Swap(set(t, capacity10(t, "pa"), capacity10(t, "pb")))
	fill(t, e, "team/pa", "flood", 1000, 1)
	if got := budget.Tracked(); got != 1000 {
		t.Fatalf("tracked %d after the flood, want 1000", got)
	}
	// pb's 300 clients, interleaved with the flood continuing on pa.
	admitted := 0
	for round := 0; round < 15; round++ {
		for i := 0; i < 300; i++ {
			admitted += allowedN(t, e, "team/pb", fmt.Sprintf("b-%d", i), 1)
			allowedN(t, e, "team/pa", fmt.Sprintf("flood-%d-%d", round, i), 1)
		}
	}
	if admitted != 3000 {
		t.Fatalf("pb admitted %d, want exactly 3000 (300 clients × capacity 10)", admitted)
	}
	if got := budget.Tracked(); got > 1000 {
		t.Fatalf("tracked %d clients with a bound of 1000", got)
	}
	if budget.Evictions() == 0 {
		t.Fatalf("the flood's evictions were not counted")
	}
}
