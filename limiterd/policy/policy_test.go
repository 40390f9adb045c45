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
	if !p.Resolve("svc:beta").DryRun || p.Resolve("acme").Limit(0).Algorithm() != limiter.AlgorithmSlidingWindow {
		t.Fatalf("tier parameters not compiled")
	}
}

// TestExplain checks the reason Explain gives with each tier: the rule, the override and the
// key or prefix it lists; Resolve must agree with it.
func TestExplain(t *testing.T) {
	p, err := policy.Compile(testPolicy())
	if err != nil {
		t.Fatal(err)
	}
	long := "svc:" + strings.Repeat("x", v1alpha1.MaxClientKeyBytes)
	for _, c := range []struct {
		key, tier string
		kind      policy.MatchKind
		override  int
		match     string
	}{
		{"someone", "free", policy.MatchDefault, -1, ""},
		{"", "free", policy.MatchDefault, -1, ""},
		{"acme", "pro", policy.MatchExact, 0, "acme"},
		{"acme-1", "pro", policy.MatchPrefix, 0, "acme-"},
		{"acme-batch", "internal", policy.MatchExact, 1, "acme-batch"},
		{"acme-internal-1", "internal", policy.MatchPrefix, 1, "acme-int"},
		{"acme-in", "pro", policy.MatchPrefix, 0, "acme-"},
		{"svc:beta-7", "shadow", policy.MatchPrefix, 2, "svc:beta"},
		{"svc:bet", "internal", policy.MatchPrefix, 1, "svc:"},
		{long, "internal", policy.MatchPrefix, 1, "svc:"},
		{"pro", "free", policy.MatchDefault, -1, ""},
	} {
		r := p.Explain(c.key)
		if r.Tier.Name != c.tier || r.Kind != c.kind || r.Override != c.override || r.Match != c.match {
			t.Errorf("Explain(%.20q) = tier %s, %s, override %d, match %q; want tier %s, %s, override %d, match %q",
				c.key, r.Tier.Name, r.Kind, r.Override, r.Match, c.tier, c.kind, c.override, c.match)
		}
		if p.Resolve(c.key) != r.Tier {
			t.Errorf("Resolve(%.20q) = %s, Explain says %s", c.key, p.Resolve(c.key).Name, r.Tier.Name)
		}
	}
	if s := policy.MatchPrefix.String(); s != "prefix" {
		t.Errorf("MatchPrefix.String() = %q", s)
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
	if !paid.Stacked || paid.Stack == nil || paid.NumLimits() != 2 || !paid.Limited() {
		t.Fatalf("paid: stacked %t, stack %v: want a stack of 2", paid.Stacked, paid.Stack)
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
	if free.Stacked || free.NumLimits() != 1 || free.Stack.Name(0) != limiter.DefaultLimitName || free.HeaderName(0) != "free" || !free.Limited() {
		t.Fatalf("a tier of one limit: stacked %t, %d limits, header name %q", free.Stacked, free.NumLimits(), free.HeaderName(0))
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
}

// TestCompileQuota compiles calendar quotas, as a tier and as a stacked limit: each period of a
// zone into limiter.NewQuota's, a quota without timeZone into UTC, and the RateLimit-Policy
// window of each as the longest its period lasts.
func TestCompileQuota(t *testing.T) {
	quota := func(limit int64, period v1alpha1.CalendarPeriod, zone string) *v1alpha1.Quota {
		return &v1alpha1.Quota{Limit: limit, Period: period, TimeZone: zone}
	}
	src := testPolicy()
	src.Spec.Tiers = append(src.Spec.Tiers[:0],
		v1alpha1.Tier{Name: "daily", Algorithm: v1alpha1.AlgorithmQuota, Quota: quota(1000, v1alpha1.CalendarPeriodDay, "")},
		v1alpha1.Tier{Name: "weekly", Algorithm: v1alpha1.AlgorithmQuota, Quota: quota(5000, v1alpha1.CalendarPeriodWeek, "America/New_York")},
		v1alpha1.Tier{Name: "monthly", Algorithm: v1alpha1.AlgorithmQuota, Quota: quota(100000, v1alpha1.CalendarPeriodMonth, "Europe/Berlin")},
		v1alpha1.Tier{Name: "yearly", Algorithm: v1alpha1.AlgorithmQuota, Quota: quota(v1alpha1.MaxQuotaLimit, v1alpha1.CalendarPeriodYear, "Etc/GMT-14")},
		v1alpha1.Tier{Name: "paid", Limits: []v1alpha1.Limit{
			{Name: "burst", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: &v1alpha1.TokenBucket{Capacity: 20, RefillRate: 10}},
			{Name: "monthly", Algorithm: v1alpha1.AlgorithmQuota, Quota: quota(100000, v1alpha1.CalendarPeriodMonth, "Europe/Berlin")},
		}})
	src.Spec.DefaultTier, src.Spec.Overrides = "daily", nil
	p, err := policy.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		limit  int64
		period limiter.CalendarPeriod
		zone   string
		header string
	}{
		{1000, limiter.PeriodDay, "UTC", `"daily";q=1000;w=86400`},
		{5000, limiter.PeriodWeek, "America/New_York", `"weekly";q=5000;w=604800`},
		{100000, limiter.PeriodMonth, "Europe/Berlin", `"monthly";q=100000;w=2678400`},
		{v1alpha1.MaxQuotaLimit, limiter.PeriodYear, "Etc/GMT-14", `"yearly";q=1000000000;w=31622400`},
	} {
		tier := p.Tiers[i]
		q, ok := tier.Limit(0).(*limiter.Quota)
		if !ok || tier.Stacked || tier.NumLimits() != 1 || tier.Stack.Name(0) != limiter.DefaultLimitName {
			t.Fatalf("%s: %T, stacked %t: want a tier of one quota", tier.Name, tier.Limit(0), tier.Stacked)
		}
		if limit, period, loc := q.Params(); limit != want.limit || period != want.period || loc.String() != want.zone {
			t.Errorf("%s: quota %d per %v in %v, want %d per %v in %s", tier.Name, limit, period, loc, want.limit, want.period, want.zone)
		}
		if got := string(tier.AppendRateLimitPolicy(nil)); got != want.header {
			t.Errorf("%s: RateLimit-Policy %s, want %s", tier.Name, got, want.header)
		}
	}
	paid := p.Tiers[4]
	if paid.Limit(1) != p.Tiers[2].Limit(0) {
		t.Errorf("equal quotas are not one interned strategy")
	}
	if got, want := string(paid.AppendRateLimitPolicy(nil)), `"paid/burst";q=20;w=2, "paid/monthly";q=100000;w=2678400`; got != want {
		t.Errorf("paid's RateLimit-Policy: %s, want %s", got, want)
	}
	if src.Spec.Tiers[0].Quota.TimeZone != "" || p.Source.Spec.Tiers[0].Quota.TimeZone != v1alpha1.DefaultTimeZone {
		t.Errorf("Compile modified its input, or did not default the zone of its copy")
	}
}

// TestCompileRefusesUnknownTimeZone: the API server refuses a zone its tz database lacks, but
// that database may be newer than limiterd's (and a policy file never meets it); Compile, which
// limiterd's sources run on every policy, refuses a zone its own database lacks, naming the
// field, so that the policy is kept out of service.
func TestCompileRefusesUnknownTimeZone(t *testing.T) {
	for _, tt := range []struct {
		name string
		tier v1alpha1.Tier
		path string
	}{
		{"tier", v1alpha1.Tier{Name: "metered", Algorithm: v1alpha1.AlgorithmQuota,
			Quota: &v1alpha1.Quota{Limit: 10, Period: v1alpha1.CalendarPeriodDay, TimeZone: "Mars/Olympus_Mons"}},
			"spec.tiers[4].quota.timeZone"},
		{"limit", v1alpha1.Tier{Name: "metered", Limits: []v1alpha1.Limit{{Name: "monthly", Algorithm: v1alpha1.AlgorithmQuota,
			Quota: &v1alpha1.Quota{Limit: 10, Period: v1alpha1.CalendarPeriodMonth, TimeZone: "Europe/Atlantis"}}}},
			"spec.tiers[4].limits[0].quota.timeZone"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := testPolicy()
			src.Spec.Tiers = append(src.Spec.Tiers, tt.tier)
			_, err := policy.Compile(src)
			if err == nil || !strings.Contains(err.Error(), tt.path+": Invalid value") || !strings.Contains(err.Error(), "unknown time zone") {
				t.Fatalf("Compile: %v, want an unknown time zone at %s", err, tt.path)
			}
		})
	}
}
