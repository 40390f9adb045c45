package replicastatus

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/source"
)

// Tally counts, per policy, the decisions of its dry-run tiers that would have been rejected
// since its current generation was swapped in. It is an engine.Observer wrapping another one
// (the metrics): give it to the engine, and swap sets through Track so that it learns each
// set's generations before the engine asks for the tiers' observers.
//
// Decisions of tiers that are not dry-run go straight to the wrapped observer, so a Tally costs
// them nothing; a dry-run tier's decision costs one more atomic add when it would have been
// rejected.
type Tally struct {
	inner engine.Observer

	mu    sync.Mutex
	cells map[v1alpha1.PolicyID]*cell // by policy ID: the generation last swapped in
}

// cell is the tally of one generation of one policy.
type cell struct {
	generation int64
	dryRun     map[string]bool // names of the dry-run tiers
	rejected   atomic.Uint64
}

var _ engine.Observer = (*Tally)(nil)

// NewTally returns a tally that forwards every observation to inner (nil: to none).
func NewTally(inner engine.Observer) *Tally {
	if inner == nil {
		inner = engine.NopObserver{}
	}
	return &Tally{inner: inner, cells: make(map[v1alpha1.PolicyID]*cell)}
}

// Track returns a source.Target that records the generations of each set and then swaps it into
// target. Sets must be swapped one at a time (a source.Pipeline does).
func (t *Tally) Track(target source.Target) source.Target { return tracker{tally: t, target: target} }

type tracker struct {
	tally  *Tally
	target source.Target
}

// Swap implements source.Target.
func (tr tracker) Swap(set *policy.Set) {
	t := tr.tally
	t.mu.Lock()
	cells := make(map[v1alpha1.PolicyID]*cell, set.Len())
	for _, p := range set.All() {
		c := t.cells[p.ID]
		if c == nil || c.generation != p.Generation {
			c = &cell{generation: p.Generation}
		}
		dryRun := make(map[string]bool)
		for _, tier := range p.Tiers {
			if tier.DryRun {
				dryRun[tier.Name] = true
			}
		}
		// A cell's tiers are read only under t.mu: replace the map rather than edit it.
		c.dryRun = dryRun
		cells[p.ID] = c
	}
	t.cells = cells
	t.mu.Unlock()
	tr.target.Swap(set) // asks t.Tier for the tiers' observers
}

// DryRunRejected returns how many decisions of the dry-run tiers of policy ID at generation
// would have been rejected since that generation was swapped in; 0 when another generation
// (or none) is in service.
func (t *Tally) DryRunRejected(id v1alpha1.PolicyID, generation int64) uint64 {
	t.mu.Lock()
	c := t.cells[id]
	t.mu.Unlock()
	if c == nil || c.generation != generation {
		return 0
	}
	return c.rejected.Load()
}

// Tier implements engine.Observer.
func (t *Tally) Tier(policyID v1alpha1.PolicyID, tier string) engine.TierObserver {
	inner := t.inner.Tier(policyID, tier)
	t.mu.Lock()
	c := t.cells[policyID]
	dryRun := c != nil && c.dryRun[tier]
	t.mu.Unlock()
	if !dryRun {
		return inner
	}
	return &dryRunObserver{inner: inner, rejected: &c.rejected}
}

// Policy implements engine.Observer.
func (t *Tally) Policy(policyID v1alpha1.PolicyID) engine.PolicyObserver {
	return t.inner.Policy(policyID)
}

// Leases implements engine.Observer.
func (t *Tally) Leases(policyID v1alpha1.PolicyID, tier string) engine.LeaseObserver {
	return t.inner.Leases(policyID, tier)
}

// Forget implements engine.Observer. The tally itself keeps only the policies of the last set.
func (t *Tally) Forget(policyID v1alpha1.PolicyID, tier string) { t.inner.Forget(policyID, tier) }

type dryRunObserver struct {
	inner    engine.TierObserver
	rejected *atomic.Uint64
}

// Observe implements engine.TierObserver.
func (o *dryRunObserver) Observe(outcome engine.Outcome, elapsed time.Duration) {
	if outcome == engine.DryRunRejected {
		o.rejected.Add(1)
	}
	o.inner.Observe(outcome, elapsed)
}
