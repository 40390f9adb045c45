package policy_test

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
)

func concurrency(limit int64, leaseTimeout time.Duration) *v1alpha1.Concurrency {
	return &v1alpha1.Concurrency{Limit: limit, LeaseTimeout: metav1.Duration{Duration: leaseTimeout}}
}

// TestCompileConcurrency compiles concurrency limits, as a tier, as a limit of a stack beside a
// rate limit, and at their bounds, into limiter.NewConcurrency's with the policy's parameters;
// and the RateLimit-Policy item of each: its places as q, its leaseTimeout as w, and the quota
// unit concurrent-requests, which tells a client that q is held at once rather than q per w.
func TestCompileConcurrency(t *testing.T) {
	src := testPolicy()
	src.Spec.Tiers = append(src.Spec.Tiers[:0],
		v1alpha1.Tier{Name: "reports", Algorithm: v1alpha1.AlgorithmConcurrency, Concurrency: concurrency(3, 30*time.Second)},
		v1alpha1.Tier{Name: "narrowest", Algorithm: v1alpha1.AlgorithmConcurrency, Concurrency: concurrency(1, v1alpha1.MinPeriod)},
		v1alpha1.Tier{Name: "widest", Algorithm: v1alpha1.AlgorithmConcurrency, Concurrency: concurrency(v1alpha1.MaxConcurrencyLimit, v1alpha1.MaxPeriod)},
		v1alpha1.Tier{Name: "llm", Limits: []v1alpha1.Limit{
			{Name: "rate", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: &v1alpha1.TokenBucket{Capacity: 10, RefillRate: 10}},
			{Name: "in-flight", Algorithm: v1alpha1.AlgorithmConcurrency, Concurrency: concurrency(3, 30*time.Second)},
		}})
	src.Spec.DefaultTier, src.Spec.Overrides = "reports", []v1alpha1.Override{{Tier: "llm", ClientPrefixes: []string{"sub:llm:"}}}
	p, err := policy.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		limit   int64
		timeout time.Duration
		header  string
	}{
		{3, 30 * time.Second, `"reports";q=3;w=30;qu="concurrent-requests"`},
		{1, time.Millisecond, `"narrowest";q=1;w=1;qu="concurrent-requests"`},
		{10_000, 24 * time.Hour, `"widest";q=10000;w=86400;qu="concurrent-requests"`},
	} {
		tier := p.Tiers[i]
		c, ok := tier.Limit(0).(*limiter.Concurrency)
		if !ok || tier.Stacked || tier.NumLimits() != 1 || tier.Stack.Name(0) != limiter.DefaultLimitName {
			t.Fatalf("%s: %T, stacked %t: want a tier of one concurrency limit", tier.Name, tier.Limit(0), tier.Stacked)
		}
		if limit, timeout := c.Params(); limit != want.limit || timeout != want.timeout {
			t.Errorf("%s: %d places, lease timeout %v; want %d, %v", tier.Name, limit, timeout, want.limit, want.timeout)
		}
		if got := string(tier.AppendRateLimitPolicy(nil)); got != want.header {
			t.Errorf("%s: RateLimit-Policy %s, want %s", tier.Name, got, want.header)
		}
	}
	llm := p.Tiers[3]
	if !llm.Stacked || llm.NumLimits() != 2 || llm.Limit(0).Algorithm() != limiter.AlgorithmTokenBucket ||
		llm.Limit(1).Algorithm() != limiter.AlgorithmConcurrency || llm.Stack.Name(1) != "in-flight" {
		t.Fatalf("llm: want a stack of rate (token bucket) then in-flight (concurrency)")
	}
	if llm.Limit(1) != p.Tiers[0].Limit(0) {
		t.Errorf("equal concurrency limits are not one interned strategy")
	}
	if got, want := string(llm.AppendRateLimitPolicy(nil)), `"llm/rate";q=10;w=1, "llm/in-flight";q=3;w=30;qu="concurrent-requests"`; got != want {
		t.Errorf("llm's RateLimit-Policy: %s, want %s", got, want)
	}
	if got := p.Resolve("sub:llm:alice"); got != llm {
		t.Errorf("an override's key resolves to %s, want llm", got.Name)
	}

	// The compiled stack holds the concurrency limit: 3 in flight, though the rate admits 10.
	store := limiter.NewMemory(nil)
	defer store.Close()
	now := time.Unix(1_700_000_000, 0)
	for i := range 3 {
		if d := decide(t, store, llm, now); !d.Allowed {
			t.Fatalf("request %d of 3 rejected", i+1)
		}
	}
	if d := decide(t, store, llm, now); d.Allowed {
		t.Fatalf("a 4th request in flight admitted by a limit of 3")
	}
}

// TestCompileRefusesConcurrencyOutOfBounds: Compile refuses a concurrency limit's limit or
// leaseTimeout one past either bound, in a tier and in a stack, naming the field: a policy
// cannot set a place count or a lease timeout that limiter.NewConcurrency would refuse.
func TestCompileRefusesConcurrencyOutOfBounds(t *testing.T) {
	for _, tt := range []struct {
		name string
		c    *v1alpha1.Concurrency
		path string
	}{
		{"no place", concurrency(0, time.Minute), "concurrency.limit"},
		{"a place too many", concurrency(v1alpha1.MaxConcurrencyLimit+1, time.Minute), "concurrency.limit"},
		{"a nanosecond short", concurrency(3, v1alpha1.MinPeriod-1), "concurrency.leaseTimeout"},
		{"a nanosecond long", concurrency(3, v1alpha1.MaxPeriod+1), "concurrency.leaseTimeout"},
		{"unset timeout", concurrency(3, 0), "concurrency.leaseTimeout"},
	} {
		for _, where := range []string{"tier", "limit"} {
			t.Run(tt.name+"/"+where, func(t *testing.T) {
				src := testPolicy()
				tier := v1alpha1.Tier{Name: "slow", Algorithm: v1alpha1.AlgorithmConcurrency, Concurrency: tt.c}
				path := "spec.tiers[4]." + tt.path
				if where == "limit" {
					tier = v1alpha1.Tier{Name: "slow", Limits: []v1alpha1.Limit{{Name: "in-flight", Algorithm: v1alpha1.AlgorithmConcurrency, Concurrency: tt.c}}}
					path = "spec.tiers[4].limits[0]." + tt.path
				}
				src.Spec.Tiers = append(src.Spec.Tiers, tier)
				_, err := policy.Compile(src)
				if err == nil || !strings.Contains(err.Error(), path+":") {
					t.Fatalf("Compile: %v, want an error naming %s", err, path)
				}
			})
		}
	}
}

func decide(t *testing.T, s limiter.Store, tier *policy.Tier, now time.Time) limiter.Decision {
	t.Helper()
	d, err := s.Decide(t.Context(), "k", tier.Stack, now, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
