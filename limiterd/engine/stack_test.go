package engine_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
)

// withStack makes the default tier "free" a stack: burst, a bucket of 3 refilling 1 an hour,
// and daily, a bucket of 5 refilling 1 an hour; the dry-run tier "shadow" a stack of one bucket
// of 1. Token buckets only, so that a policy may enable refunds with it.
func withStack(s *v1alpha1.RateLimitPolicySpec) {
	s.Tiers[0] = testsupport.StackedTier("free",
		testsupport.TokenBucketLimit("burst", 3, 1, time.Hour), testsupport.TokenBucketLimit("daily", 5, 1, time.Hour))
	s.Tiers[1] = testsupport.StackedTier("shadow", testsupport.TokenBucketLimit("once", 1, 1, time.Hour))
	s.Tiers[1].DryRun = true
}

func remaining(r engine.Result) []int64 {
	var out []int64
	for _, d := range r.Limits {
		out = append(out, d.Remaining)
	}
	return out
}

// TestStackedTier decides on a stacked tier: every limit's decision and the binding one, all or
// nothing, peeks and refunds of every limit, a dry-run stack, and a reset of every limit.
func TestStackedTier(t *testing.T) {
	var observed int
	e := engine.New(engine.Options{Clock: fixedClock(), Observer: countingObserver{n: &observed}})
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { withStack(s); s.Refunds = v1alpha1.RefundsEnabled })))
	r, err := e.Decide(ctx, "team/a", "k", 2)
	first := r.Reservation
	if err != nil || !r.Allowed || fmt.Sprint(remaining(r)) != "[1 3]" || r.Binding != 0 || r.Remaining != 1 || r.Limit != 3 {
		t.Fatalf("first decision: %+v %v; want both limits charged, burst binding", r, err)
	}
	// 2 more units: burst rejects, daily is not charged.
	r, err = e.Decide(ctx, "team/a", "k", 2)
	if err != nil || r.Allowed || r.Outcome != engine.Rejected || fmt.Sprint(remaining(r)) != "[1 3]" || !r.Limits[1].Allowed ||
		r.Binding != 0 || r.RetryAfter != time.Hour {
		t.Fatalf("a request burst rejects: %+v %v", r, err)
	}
	if r, _ := e.Decide(ctx, "team/a", "k", 0); !r.Allowed || fmt.Sprint(remaining(r)) != "[1 3]" {
		t.Fatalf("a peek: %+v", r)
	}
	r, err = e.Refund(ctx, first, 1)
	if err != nil || fmt.Sprint(remaining(r)) != "[2 4]" || r.Binding != 0 || r.Remaining != 2 {
		t.Fatalf("a refund returns a unit to every limit: %+v %v", r, err)
	}
	if r, err := e.Peek(ctx, "team/a", "k"); err != nil || fmt.Sprint(remaining(r)) != "[2 4]" || r.Remaining != 2 {
		t.Fatalf("the admin peek: %+v %v", r, err)
	}
	if err := e.Reset(ctx, "team/a", "k"); err != nil {
		t.Fatal(err)
	}
	if r, _ := e.Decide(ctx, "team/a", "k", 0); fmt.Sprint(remaining(r)) != "[3 5]" {
		t.Fatalf("after a reset: %+v, want every limit fresh", r)
	}
	// A dry-run stack admits what it would reject, and says so.
	for i, want := range []engine.Outcome{engine.Allowed, engine.DryRunRejected} {
		if r, _ := e.Decide(ctx, "team/a", "try-1", 1); !r.Allowed || r.Outcome != want || r.Limits == nil {
			t.Fatalf("dry-run stack, decision %d: %+v, want %s", i, r, want)
		}
	}
	if observed != 4 {
		t.Fatalf("observed %d decisions, want 4 (peeks and refunds are none)", observed)
	}
	// A tier of one limit has no Limits.
	if r, _ := e.Decide(ctx, "team/a", "boss", 1); r.Limits != nil || r.Binding != 0 {
		t.Fatalf("an unlimited tier: %+v", r)
	}
}

// TestStackedTierFailureModes checks each failure mode on a stacked tier whose store fails:
// Open admits by every limit, Closed rejects by every limit, Local decides the stack in memory.
func TestStackedTierFailureModes(t *testing.T) {
	for mode, want := range map[v1alpha1.FailureMode]int{
		v1alpha1.FailureModeOpen:   10,
		v1alpha1.FailureModeClosed: 0,
		v1alpha1.FailureModeLocal:  3,
	} {
		t.Run(string(mode), func(t *testing.T) {
			e := engine.New(engine.Options{Clock: fixedClock(), NewStore: func(v1alpha1.PolicyID) limiter.Store { return failingStore{} }})
			e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) {
				withStack(s)
				s.FailureMode, s.Refunds = mode, v1alpha1.RefundsEnabled
			})))
			if got := allowedN(t, e, "team/a", "c", 10); got != want {
				t.Fatalf("admitted %d of 10, want %d", got, want)
			}
			r, err := e.Decide(ctx, "team/a", "c", 1)
			if err != nil || !errors.Is(r.StoreError, errDown) || len(r.Limits) != 2 {
				t.Fatalf("store error or limits not reported: %+v %v", r, err)
			}
			if r.Reservation != "" {
				t.Fatalf("a decision the failure mode made has a reservation: %+v", r)
			}
			switch mode {
			case v1alpha1.FailureModeOpen:
				if fmt.Sprint(remaining(r)) != "[3 5]" || r.Remaining != 3 {
					t.Fatalf("Open: %+v, want every limit whole", r)
				}
			case v1alpha1.FailureModeClosed:
				if r.RetryAfter != time.Second || r.Limits[0].Allowed || r.Limits[1].Allowed {
					t.Fatalf("Closed: %+v, want every limit rejecting for a second", r)
				}
			case v1alpha1.FailureModeLocal:
				if fmt.Sprint(remaining(r)) != "[0 2]" || r.Binding != 0 || r.RetryAfter != time.Hour {
					t.Fatalf("Local: %+v, want the fallback's stack", r)
				}
			}
		})
	}
}

// TestStackedTierAcrossSwaps checks the counter rule per limit name: a single-limit tier becomes
// a stack whose limit "default" keeps its usage and whose new limit starts fresh; a limit whose
// parameters change carries its usage over; a stack becomes a single-limit tier again.
func TestStackedTierAcrossSwaps(t *testing.T) {
	e := engine.New(engine.Options{Clock: fixedClock()})
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.Tiers[0] = tokenBucket("free", 4) })))
	if got := allowedN(t, e, "team/a", "k", 3); got != 3 {
		t.Fatalf("admitted %d of 3", got)
	}
	stack := func(defaultCapacity, daily int64) func(s *v1alpha1.RateLimitPolicySpec) {
		return func(s *v1alpha1.RateLimitPolicySpec) {
			s.Tiers[0] = testsupport.StackedTier("free",
				testsupport.TokenBucketLimit(limiter.DefaultLimitName, defaultCapacity, 1, time.Hour),
				testsupport.SlidingWindowLimit("daily", daily, time.Hour))
		}
	}
	e.Swap(set(t, compile(t, "a", stack(4, 10))))
	if r, _ := e.Decide(ctx, "team/a", "k", 0); fmt.Sprint(remaining(r)) != "[1 10]" {
		t.Fatalf("after the tier became a stack: %+v, want default's usage kept (1 left), daily fresh", r)
	}
	if got := allowedN(t, e, "team/a", "k", 2); got != 1 {
		t.Fatalf("admitted %d of 2, want the 1 default had left", got)
	}
	e.Swap(set(t, compile(t, "a", stack(10, 3))))
	if r, _ := e.Decide(ctx, "team/a", "k", 0); fmt.Sprint(remaining(r)) != "[6 2]" || r.Binding != 1 {
		t.Fatalf("after both limits changed: %+v, want their usage carried over (4 and 1 used)", r)
	}
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { s.Tiers[0] = tokenBucket("free", 10) })))
	if r, _ := e.Decide(ctx, "team/a", "k", 0); r.Limits != nil || r.Remaining != 6 {
		t.Fatalf("back to one limit: %+v, want default's usage (6 left)", r)
	}
}

// TestDecideBatchStacked decides stacked items in batches, interleaved with single-limit ones,
// peeks, costs above a limit and a dry-run stack: the same answers, limit by limit, as one by
// one; and a store that fails decides them by the failure mode.
func TestDecideBatchStacked(t *testing.T) {
	var items []engine.BatchItem
	for i := range 60 {
		key := fmt.Sprintf("c%d", i%4)
		switch i % 5 {
		case 3:
			key = "try-" + key
		case 4:
			key = "boss"
		}
		items = append(items, engine.BatchItem{Policy: "team/a", Key: key, Cost: int64(i % 4)}) // 0: a peek; 3: above burst once used
		if i%7 == 0 {
			items = append(items, engine.BatchItem{Policy: "team/b", Key: key, Cost: 1})
		}
	}
	for _, failing := range []bool{false, true} {
		for _, mode := range []v1alpha1.FailureMode{v1alpha1.FailureModeClosed, v1alpha1.FailureModeLocal} {
			t.Run(fmt.Sprintf("store fails %t, %s", failing, mode), func(t *testing.T) {
				newEngine := func(o engine.Observer) *engine.Engine {
					opts := engine.Options{Clock: fixedClock(), Observer: o}
					if failing {
						opts.NewStore = func(v1alpha1.PolicyID) limiter.Store { return failingStore{} }
					}
					e := engine.New(opts)
					e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) { withStack(s); s.FailureMode = mode }),
						compile(t, "b", func(s *v1alpha1.RateLimitPolicySpec) { s.FailureMode = mode })))
					return e
				}
				checkBatchMatchesDecide(t, newEngine, items)
			})
		}
	}
	// Each stacked item has its own limits.
	e := engine.New(engine.Options{Clock: fixedClock()})
	e.Swap(set(t, compile(t, "a", withStack)))
	out := make([]engine.BatchResult, 3)
	if err := e.DecideBatch(ctx, []engine.BatchItem{{Key: "x", Cost: 1}, {Key: "boss", Cost: 1}, {Key: "x", Cost: 1}}, out); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(remaining(out[0].Result)) != "[2 4]" || out[1].Limits != nil || fmt.Sprint(remaining(out[2].Result)) != "[1 3]" ||
		len(out[0].Limits) != 2 || cap(out[0].Limits) != 2 || slices.Equal(out[0].Limits, out[2].Limits) {
		t.Fatalf("batch results: %+v / %+v / %+v", out[0].Limits, out[1].Limits, out[2].Limits)
	}
}
