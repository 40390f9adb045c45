// Package source loads RateLimitPolicies into the engine: from policy files (File) and from
// the operator's Kubernetes ConfigMaps (Kube).
//
// Every source feeds one Pipeline, which owns the reload sequence parse → validate → compile →
// swap. A source reports per origin (a file path, a ConfigMap's namespace/name): the policies
// an origin currently contributes (Apply), that its content could not be read or parsed (Fail),
// or that it is gone (Remove). The engine serves the merge of every origin's last good
// contribution; an invalid contribution is logged and counted, and leaves that origin's last
// good policies, and every other origin, in service.
package source

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// Target receives each new merged policy set; *engine.Engine is one.
type Target interface {
	Swap(set *policy.Set)
}

// ReloadObserver records the outcome of each contribution; *metrics.Metrics is one.
type ReloadObserver interface {
	// ReloadSucceeded counts an applied contribution (or removal) completed at the instant.
	ReloadSucceeded(at time.Time)
	// ReloadFailed counts a rejected contribution.
	ReloadFailed()
}

// ErrConflict is wrapped by the error of a contribution that defines a policy ID that another
// origin already serves. The pipeline retries such a contribution whenever the merged set
// changes, so it is applied once the other origin drops that ID.
var ErrConflict = errors.New("policy is already defined by another origin")

// PipelineOptions configure a Pipeline. The zero value logs to slog.Default, records nothing,
// uses the system clock and accepts every policy that compiles.
type PipelineOptions struct {
	Logger   *slog.Logger
	Observer ReloadObserver
	Clock    func() time.Time
	// Check, if set, is asked about every compiled policy: an error refuses it as a compile
	// error does (the contribution is rejected, its origin keeps its last good one), for what
	// a valid policy may hold but this process cannot decide, such as an algorithm its store
	// does not implement.
	Check func(*policy.Policy) error
}

// Pipeline merges the contributions of every origin and swaps the merge into a Target. It is
// safe for concurrent use; contributions are applied one at a time.
//
// The first swap happens once the merge holds at least one policy, so an engine fed only
// failures, or only empty contributions, never becomes ready — unless a source calls Synced to
// say that its initial content is complete, which swaps in even an empty set. After that every
// change swaps, even one that leaves no policy at all (the engine then answers "unknown policy").
type Pipeline struct {
	target   Target
	log      *slog.Logger
	observer ReloadObserver
	clock    func() time.Time
	check    func(*policy.Policy) error

	mu      sync.Mutex
	origins map[string]*contribution
	swapped bool // a set was swapped into the target
}

// contribution is what one origin provides.
type contribution struct {
	good       []*policy.Policy // the last applied contribution
	conflicted []*policy.Policy // a newer contribution waiting for its IDs to be free
}

type nopObserver struct{}

func (nopObserver) ReloadSucceeded(time.Time) {}
func (nopObserver) ReloadFailed()             {}

// NewPipeline returns a pipeline that swaps merged sets into target.
func NewPipeline(target Target, opts PipelineOptions) *Pipeline {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	return &Pipeline{
		target:   target,
		log:      opts.Logger,
		observer: opts.Observer,
		clock:    opts.Clock,
		check:    opts.Check,
		origins:  make(map[string]*contribution),
	}
}

// Apply makes policies the contribution of origin: it validates and compiles each policy and
// swaps the new merge into the target. If any policy is invalid or refused by the Check option,
// two of them share an ID, or one has an ID that another origin serves, nothing changes: the
// failure is logged, counted and returned, and origin keeps its last good contribution. The
// policies are not modified.
func (p *Pipeline) Apply(origin string, policies []*v1alpha1.RateLimitPolicy) error {
	compiled, err := compileAll(policies, p.check)
	if err != nil {
		p.Fail(origin, err)
		return fmt.Errorf("origin %s: %w", origin, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.origins[origin]
	if c == nil {
		c = &contribution{}
		p.origins[origin] = c
	}
	if err := p.conflictLocked(origin, compiled); err != nil {
		c.conflicted = compiled
		p.failLocked(origin, err)
		return fmt.Errorf("origin %s: %w", origin, err)
	}
	c.good, c.conflicted = compiled, nil
	p.log.Info("policy contribution applied", "origin", origin, "policies", policyIDs(compiled))
	p.commitLocked()
	return nil
}

// Fail records that origin's current content could not be turned into policies (unreadable,
// unparsable). The origin keeps its last good contribution; the failure is logged and counted.
func (p *Pipeline) Fail(origin string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.origins[origin]; c != nil {
		c.conflicted = nil // the content that conflicted was replaced by this failing one
	}
	p.failLocked(origin, err)
}

// Remove withdraws origin's contribution (its ConfigMap was deleted, say) and swaps the merge
// without it. Removing an unknown origin does nothing.
func (p *Pipeline) Remove(origin string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.origins[origin]
	if !ok {
		return
	}
	delete(p.origins, origin)
	p.log.Info("policy origin removed", "origin", origin, "policies", policyIDs(c.good))
	if len(c.good) > 0 {
		p.commitLocked()
	}
}

// Synced tells the pipeline that its sources have reported their initial content (a ConfigMap
// informer's first list, say). If no set was swapped yet, because every contribution so far was
// empty or rejected, it swaps in the empty set: the target becomes ready and answers "unknown
// policy" rather than "not ready". Otherwise, and on later calls, it does nothing.
func (p *Pipeline) Synced() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.swapped {
		return
	}
	set, err := policy.NewSet()
	if err != nil {
		// Unreachable: an empty set has no duplicate ID.
		p.log.Error("policy merge rejected", "error", err)
		return
	}
	p.target.Swap(set)
	p.swapped = true
	p.log.Info("policies swapped", "policies", 0)
}

// Policies returns the IDs that origin currently contributes, sorted.
func (p *Pipeline) Policies(origin string) []v1alpha1.PolicyID {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.origins[origin]; c != nil {
		return policyIDs(c.good)
	}
	return nil
}

func (p *Pipeline) failLocked(origin string, err error) {
	p.observer.ReloadFailed()
	var kept []v1alpha1.PolicyID
	if c := p.origins[origin]; c != nil {
		kept = policyIDs(c.good)
	}
	p.log.Error("policy contribution rejected", "origin", origin, "error", err, "kept_policies", kept)
}

// conflictLocked reports a policy of compiled whose ID another origin serves.
func (p *Pipeline) conflictLocked(origin string, compiled []*policy.Policy) error {
	for other, c := range p.origins {
		if other == origin {
			continue
		}
		for _, theirs := range c.good {
			for _, ours := range compiled {
				if ours.ID == theirs.ID {
					return fmt.Errorf("%w: %s is defined by %s", ErrConflict, ours.ID, other)
				}
			}
		}
	}
	return nil
}

// commitLocked promotes waiting contributions whose IDs became free, then swaps the merge.
func (p *Pipeline) commitLocked() {
	for promoted := true; promoted; {
		promoted = false
		for _, origin := range sortedKeys(p.origins) {
			c := p.origins[origin]
			if c.conflicted == nil || p.conflictLocked(origin, c.conflicted) != nil {
				continue
			}
			c.good, c.conflicted, promoted = c.conflicted, nil, true
			p.log.Info("policy contribution applied", "origin", origin, "policies", policyIDs(c.good))
		}
	}
	var all []*policy.Policy
	for _, c := range p.origins {
		all = append(all, c.good...)
	}
	set, err := policy.NewSet(all...)
	if err != nil {
		// Unreachable: conflictLocked keeps IDs unique across origins, compileAll within one.
		p.observer.ReloadFailed()
		p.log.Error("policy merge rejected", "error", err)
		return
	}
	if len(all) == 0 && !p.swapped {
		p.observer.ReloadSucceeded(p.clock())
		return
	}
	p.target.Swap(set)
	p.swapped = true
	p.observer.ReloadSucceeded(p.clock())
	p.log.Info("policies swapped", "policies", set.Len())
}

// compileAll compiles a contribution, and asks check (if not nil) about each policy; its IDs
// must be unique.
func compileAll(policies []*v1alpha1.RateLimitPolicy, check func(*policy.Policy) error) ([]*policy.Policy, error) {
	compiled := make([]*policy.Policy, 0, len(policies))
	seen := make(map[v1alpha1.PolicyID]bool, len(policies))
	for i, rp := range policies {
		if rp == nil {
			return nil, fmt.Errorf("policy %d is nil", i)
		}
		c, err := policy.Compile(rp)
		if err != nil {
			return nil, fmt.Errorf("compile: %w", err)
		}
		if check != nil {
			if err := check(c); err != nil {
				return nil, fmt.Errorf("policy %s: %w", c.ID, err)
			}
		}
		if seen[c.ID] {
			return nil, fmt.Errorf("policy %s is defined twice", c.ID)
		}
		seen[c.ID] = true
		compiled = append(compiled, c)
	}
	return compiled, nil
}

func policyIDs(ps []*policy.Policy) []v1alpha1.PolicyID {
	ids := make([]v1alpha1.PolicyID, len(ps))
	for i, c := range ps {
		ids[i] = c.ID
	}
	slices.Sort(ids)
	return ids
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
