package policy_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
)

func testPolicy() *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Generation: 3},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "free",
			Tiers: []v1alpha1.Tier{
				{Name: "free", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: &v1alpha1.TokenBucket{Capacity: 10, RefillRate: 1}},
				{Name: "pro", Algorithm: v1alpha1.AlgorithmSlidingWindow, SlidingWindow: &v1alpha1.SlidingWindow{Limit: 100, Window: metav1.Duration{Duration: time.Minute}}},
				{Name: "internal", Algorithm: v1alpha1.AlgorithmUnlimited},
				{Name: "shadow", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: &v1alpha1.TokenBucket{Capacity: 1, RefillRate: 1}, DryRun: true},
			},
			Overrides: []v1alpha1.Override{
				{Tier: "pro", Clients: []string{"acme"}, ClientPrefixes: []string{"acme-", "pro:"}},
				{Tier: "internal", Clients: []string{"acme-batch"}, ClientPrefixes: []string{"svc:", "acme-int"}},
				{Tier: "shadow", ClientPrefixes: []string{"svc:beta"}},
			},
		},
	}
}

func TestCompileResolves(t *testing.T) {
	src := testPolicy()
	p, err := policy.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	if p.ID != "default/api" || p.Generation != 3 || p.FailureMode != v1alpha1.FailureModeOpen {
		t.Fatalf("compiled %q generation %d failure mode %q", p.ID, p.Generation, p.FailureMode)
	}
	if src.Namespace != "" || src.Spec.FailureMode != "" {
		t.Fatalf("Compile modified its input")
	}
	for key, tier := range map[string]string{
		"":                "free",
		"someone":         "free",
		"acme":            "pro",      // exact
		"acme-1":          "pro",      // prefix acme-
		"acme-batch":      "internal", // exact beats prefix
		"acme-internal-1": "internal", // longer prefix acme-int beats acme-
		"acme-in":         "pro",      // acme-int does not match
		"svc:billing":     "internal",
		"svc:beta-7":      "shadow", // longest prefix
		"svc:bet":         "internal",
		"pro":             "free",
		"pro:x":           "pro",
	} {
		if got := p.Resolve(key).Name; got != tier {
			t.Errorf("Resolve(%q) = %s, want %s", key, got, tier)
		}
	}
	if !p.Resolve("svc:beta").DryRun || p.Resolve("acme").Limiter.Algorithm() != limiter.AlgorithmSlidingWindow {
		t.Fatalf("tier parameters not compiled")
	}
}

func TestCompileRejectsInvalid(t *testing.T) {
	src := testPolicy()
	src.Spec.Overrides[0].Tier = "missing"
	_, err := policy.Compile(src)
	if err == nil || !strings.Contains(err.Error(), "spec.overrides[0].tier") {
		t.Fatalf("Compile of a policy naming a missing tier: %v", err)
	}
}

// BenchmarkResolve resolves keys against a policy with 256 exact keys and 256 prefixes:
// the cost depends on the key's length, not on the number of overrides.
func BenchmarkResolve(b *testing.B) {
	src := testPolicy()
	var clients, prefixes []string
	for i := 0; i < 10_000; i++ {
		clients = append(clients, fmt.Sprintf("exact-%d", i))
		prefixes = append(prefixes, fmt.Sprintf("team-%d:", i))
	}
	src.Spec.Overrides = append(src.Spec.Overrides[:0], v1alpha1.Override{Tier: "pro", Clients: clients[:256], ClientPrefixes: prefixes[:256]})
	p, err := policy.Compile(src)
	if err != nil {
		b.Fatal(err)
	}
	keys := []string{"exact-200", "team-77:user-1", "nobody-in-particular"}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		p.Resolve(keys[i%len(keys)])
	}
}

// TestCompileAPITestdata compiles the API's table of policy files: every valid one compiles,
// every invalid one is refused with an error (never a panic in a strategy constructor).
func TestCompileAPITestdata(t *testing.T) {
	for _, dir := range []string{"valid", "invalid"} {
		files, err := filepath.Glob(filepath.Join("..", "..", "api", "v1alpha1", "testdata", dir, "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no %s testdata: %v", dir, err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var p v1alpha1.RateLimitPolicy
			if err := yaml.Unmarshal(data, &p); err != nil {
				continue // a document the codec refuses never reaches Compile
			}
			_, err = policy.Compile(&p)
			if dir == "valid" && err != nil {
				t.Errorf("%s: %v", f, err)
			}
			if dir == "invalid" && err == nil {
				t.Errorf("%s: compiled", f)
			}
		}
	}
}

// TestCompileStackedTier compiles a stacked tier beside tiers of one limit: its limits in spec
// order, each limit's header name after its tier, and the policy's limit names once each.
func TestCompileStackedTier(t *testing.T) {
	src := testPolicy()
	daily := v1alpha1.Limit{Name: "daily", Algorithm: v1alpha1.AlgorithmSlidingWindow,
		SlidingWindow: &v1alpha1.SlidingWindow{Limit: 10000, Window: metav1.Duration{Duration: 24 * time.Hour}}}
	src.Spec.Tiers = append(src.Spec.Tiers,
		v1alpha1.Tier{Name: "paid", Limits: []v1alpha1.Limit{
			{Name: "burst", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: &v1alpha1.TokenBucket{Capacity: 20, RefillRate: 10}},
			daily,
		}},
		v1alpha1.Tier{Name: "daily-only", DryRun: true, Limits: []v1alpha1.Limit{daily}})
	p, err := policy.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	paid := p.Tiers[4]
	if paid.Limiter != nil || paid.Stack == nil || paid.NumLimits() != 2 || !paid.Limited() {
		t.Fatalf("paid: limiter %v, stack %v: want a stack of 2", paid.Limiter, paid.Stack)
	}
	burst, ok := paid.Limit(0).(*limiter.TokenBucket)
	if !ok || paid.Stack.Name(0) != "burst" || paid.Stack.Name(1) != "daily" || paid.Limit(1).Algorithm() != limiter.AlgorithmSlidingWindow {
		t.Fatalf("paid's limits are not burst (token bucket) then daily (sliding window)")
	}
	if _, _, period := burst.Params(); period != time.Second {
		t.Fatalf("burst refills per %v, want the default 1s", period)
	}
	if paid.HeaderName(0) != "paid/burst" || paid.HeaderName(1) != "paid/daily" {
		t.Fatalf("header names %q, %q", paid.HeaderName(0), paid.HeaderName(1))
	}
	if p.Tiers[5].Limit(0) != paid.Limit(1) || !p.Tiers[5].DryRun {
		t.Fatalf("equal limits are not one interned strategy, or dryRun is lost")
	}
	free := p.Tiers[0]
	if free.NumLimits() != 1 || free.Limit(0) != free.Limiter || free.HeaderName(0) != "free" || !free.Limited() {
		t.Fatalf("a tier of one limit: %d limits, header name %q", free.NumLimits(), free.HeaderName(0))
	}
	if p.Tiers[2].Limited() {
		t.Fatalf("an Unlimited tier says it has a quota")
	}
	if got, want := string(paid.AppendRateLimitPolicy(nil)), `"paid/burst";q=20;w=2, "paid/daily";q=10000;w=86400`; got != want {
		t.Fatalf("paid's RateLimit-Policy: %s, want %s", got, want)
	}
	if got, want := string(free.AppendRateLimitPolicy(nil)), `"free";q=10;w=10`; got != want {
		t.Fatalf("free's RateLimit-Policy: %s, want %s", got, want)
	}
	if got := p.Tiers[2].AppendRateLimitPolicy([]byte("x")); string(got) != "x" {
		t.Fatalf("an unlimited tier's RateLimit-Policy: %q, want none", got)
	}
	if fmt.Sprint(p.LimitNames) != "[burst daily]" {
		t.Fatalf("LimitNames = %v, want [burst daily]", p.LimitNames)
	}
}
