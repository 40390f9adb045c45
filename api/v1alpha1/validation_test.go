package v1alpha1

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// decodeUnvalidated decodes the single document of data as DecodePolicies does, but without
// validating it.
func decodeUnvalidated(t *testing.T, data []byte) *RateLimitPolicy {
	t.Helper()
	docs, err := splitDocuments(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 1 {
		t.Fatalf("%d documents, want 1", len(docs))
	}
	p, err := decodeDocument(docs[0])
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidateInvalidFiles(t *testing.T) {
	for _, tc := range loadTestCases(t, "invalid") {
		t.Run(tc.Name, func(t *testing.T) {
			p := decodeUnvalidated(t, tc.Data)
			before := p.DeepCopy()
			err := Validate(p)
			if err == nil {
				t.Fatalf("Validate accepted it; want an error naming %s", tc.Field)
			}
			if !namesField(err, tc.Field) {
				t.Errorf("Validate: %v\nwant an error for field %s", err, tc.Field)
			}
			if !equality.Semantic.DeepEqual(before, p) {
				t.Errorf("Validate modified the policy")
			}
			_, err = DecodePolicies(tc.Data)
			if err == nil || !strings.Contains(err.Error(), tc.Field+":") {
				t.Errorf("DecodePolicies: %v\nwant an error naming %s", err, tc.Field)
			}
		})
	}
}

// namesField reports whether err is an aggregate of field errors one of which is for path.
func namesField(err error, path string) bool {
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		return false
	}
	for _, e := range agg.Errors() {
		var fe *field.Error
		if errors.As(e, &fe) && fe.Field == path {
			return true
		}
	}
	return false
}

func TestValidateValidFiles(t *testing.T) {
	for _, tc := range loadTestCases(t, "valid") {
		t.Run(tc.Name, func(t *testing.T) {
			p := decodeUnvalidated(t, tc.Data)
			if err := Validate(p); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

// validPolicy returns a small valid policy for tests to break.
func validPolicy() *RateLimitPolicy {
	return &RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec: RateLimitPolicySpec{
			DefaultTier: "free",
			Tiers: []Tier{
				{Name: "free", Algorithm: AlgorithmTokenBucket, TokenBucket: &TokenBucket{Capacity: 10, RefillRate: 1}},
				{Name: "pro", Algorithm: AlgorithmSlidingWindow, SlidingWindow: &SlidingWindow{Limit: 5, Window: metav1.Duration{Duration: time.Second}}},
			},
			Overrides: []Override{{Tier: "pro", Clients: []string{"a"}, ClientPrefixes: []string{"b:"}}},
		},
	}
}

// TestValidateCases covers what the policy files cannot express.
func TestValidateCases(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(p *RateLimitPolicy)
		fields []string // the errors, in order; none for a valid policy
	}{
		{"valid", func(*RateLimitPolicy) {}, nil},
		{"no namespace", func(p *RateLimitPolicy) { p.Namespace = "" }, nil},
		{"namespace invalid", func(p *RateLimitPolicy) { p.Namespace = "a.b" }, []string{"metadata.namespace"}},
		{"name too long", func(p *RateLimitPolicy) { p.Name = strings.Repeat("a", 254) }, []string{"metadata.name"}},
		{"name of 253", func(p *RateLimitPolicy) { p.Name = strings.Repeat("a", 253) }, nil},
		{"refunds enabled", func(p *RateLimitPolicy) {
			p.Spec.Refunds = RefundsEnabled
			p.Spec.Tiers[1].Algorithm, p.Spec.Tiers[1].SlidingWindow = AlgorithmUnlimited, nil
		}, nil},
		{"refunds with the base policy's sliding window tier", func(p *RateLimitPolicy) { p.Spec.Refunds = RefundsEnabled },
			[]string{"spec.refunds"}},
		{"refunds unknown", func(p *RateLimitPolicy) { p.Spec.Refunds = "Sometimes" }, []string{"spec.refunds"}},
		{"refunds with a sliding window limit of a stack", func(p *RateLimitPolicy) {
			p.Spec.Refunds = RefundsEnabled
			p.Spec.Tiers[0].Algorithm, p.Spec.Tiers[0].TokenBucket = "", nil
			p.Spec.Tiers[0].Limits = []Limit{
				{Name: "burst", Algorithm: AlgorithmTokenBucket, TokenBucket: &TokenBucket{Capacity: 10, RefillRate: 10}},
				{Name: "hourly", Algorithm: AlgorithmSlidingWindow, SlidingWindow: &SlidingWindow{Limit: 100, Window: metav1.Duration{Duration: time.Hour}}},
			}
		}, []string{"spec.refunds"}},
		{"sliding windows without refunds", func(p *RateLimitPolicy) {
			p.Spec.Refunds = RefundsDisabled
			p.Spec.Tiers[0].Algorithm, p.Spec.Tiers[0].TokenBucket = AlgorithmSlidingWindow, nil
			p.Spec.Tiers[0].SlidingWindow = &SlidingWindow{Limit: 10, Window: metav1.Duration{Duration: time.Hour}}
		}, nil},
		// Concurrency: the bounds of limiter.NewConcurrency at their edges, in a tier and in a
		// stack; its block only with its algorithm, and no other block with it.
		{"concurrency at its bounds", func(p *RateLimitPolicy) {
			p.Spec.Tiers[0] = concurrencyTier("free", 1, MinPeriod)
			p.Spec.Tiers[1] = concurrencyTier("pro", MaxConcurrencyLimit, MaxPeriod)
		}, nil},
		{"concurrency limit 0", func(p *RateLimitPolicy) { p.Spec.Tiers[1] = concurrencyTier("pro", 0, time.Minute) },
			[]string{"spec.tiers[1].concurrency.limit"}},
		{"concurrency limit -1", func(p *RateLimitPolicy) { p.Spec.Tiers[1] = concurrencyTier("pro", -1, time.Minute) },
			[]string{"spec.tiers[1].concurrency.limit"}},
		{"concurrency limit one over", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = concurrencyTier("pro", MaxConcurrencyLimit+1, time.Minute)
		}, []string{"spec.tiers[1].concurrency.limit"}},
		{"concurrency leaseTimeout 1ns short", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = concurrencyTier("pro", 3, MinPeriod-1)
		}, []string{"spec.tiers[1].concurrency.leaseTimeout"}},
		{"concurrency leaseTimeout 1ns long", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = concurrencyTier("pro", 3, MaxPeriod+1)
		}, []string{"spec.tiers[1].concurrency.leaseTimeout"}},
		{"concurrency leaseTimeout unset", func(p *RateLimitPolicy) { p.Spec.Tiers[1] = concurrencyTier("pro", 3, 0) },
			[]string{"spec.tiers[1].concurrency.leaseTimeout"}},
		{"concurrency leaseTimeout negative", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = concurrencyTier("pro", 3, -time.Minute)
		}, []string{"spec.tiers[1].concurrency.leaseTimeout"}},
		{"concurrency limit and leaseTimeout both out", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = concurrencyTier("pro", 1<<62, 1<<62)
		}, []string{"spec.tiers[1].concurrency.limit", "spec.tiers[1].concurrency.leaseTimeout"}},
		{"concurrency without its block", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = Tier{Name: "pro", Algorithm: AlgorithmConcurrency}
		}, []string{"spec.tiers[1].concurrency"}},
		{"concurrency block on a token bucket", func(p *RateLimitPolicy) {
			p.Spec.Tiers[0].Concurrency = &Concurrency{Limit: 3, LeaseTimeout: metav1.Duration{Duration: time.Minute}}
		}, []string{"spec.tiers[0].concurrency"}},
		{"sliding window block on a concurrency tier", func(p *RateLimitPolicy) {
			sw := p.Spec.Tiers[1].SlidingWindow
			p.Spec.Tiers[1] = concurrencyTier("pro", 3, time.Minute)
			p.Spec.Tiers[1].SlidingWindow = sw
		}, []string{"spec.tiers[1].slidingWindow"}},
		{"concurrency block on an unlimited tier", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = concurrencyTier("pro", 3, time.Minute)
			p.Spec.Tiers[1].Algorithm = AlgorithmUnlimited
		}, []string{"spec.tiers[1].concurrency"}},
		{"concurrency limits of a stack at their bounds", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Limits = append(p.Spec.Tiers[1].Limits,
				concurrencyLimit("narrow", 1, MinPeriod), concurrencyLimit("wide", MaxConcurrencyLimit, MaxPeriod))
		}, nil},
		{"concurrency limits of a stack out of bounds", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Limits = append(p.Spec.Tiers[1].Limits,
				concurrencyLimit("narrow", 0, MinPeriod-1), concurrencyLimit("wide", MaxConcurrencyLimit+1, MaxPeriod+1))
		}, []string{"spec.tiers[1].limits[2].concurrency.limit", "spec.tiers[1].limits[2].concurrency.leaseTimeout",
			"spec.tiers[1].limits[3].concurrency.limit", "spec.tiers[1].limits[3].concurrency.leaseTimeout"}},
		{"concurrency limit of a stack without its block", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Limits = append(p.Spec.Tiers[1].Limits, Limit{Name: "in-flight", Algorithm: AlgorithmConcurrency})
		}, []string{"spec.tiers[1].limits[2].concurrency"}},
		{"concurrency block on a stack's sliding window", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Limits[1].Concurrency = &Concurrency{Limit: 3, LeaseTimeout: metav1.Duration{Duration: time.Minute}}
		}, []string{"spec.tiers[1].limits[1].concurrency"}},
		{"concurrency block on a stacked tier", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Concurrency = &Concurrency{Limit: 3, LeaseTimeout: metav1.Duration{Duration: time.Minute}}
		}, []string{"spec.tiers[1].concurrency"}},
		{"refunds with a concurrency tier", func(p *RateLimitPolicy) {
			p.Spec.Refunds = RefundsEnabled
			p.Spec.Tiers[1] = concurrencyTier("pro", 3, time.Minute)
		}, []string{"spec.refunds"}},
		{"refunds with a concurrency limit of a stack", func(p *RateLimitPolicy) {
			p.Spec.Refunds = RefundsEnabled
			p.Spec.Tiers[1] = Tier{Name: "pro", Limits: []Limit{
				{Name: "burst", Algorithm: AlgorithmTokenBucket, TokenBucket: &TokenBucket{Capacity: 10, RefillRate: 10}},
				concurrencyLimit("in-flight", 3, time.Minute),
			}}
		}, []string{"spec.refunds"}},
		{"unset failureMode, refunds and refillPeriod are their defaults", func(p *RateLimitPolicy) {
			p.Spec.FailureMode = ""
			p.Spec.Refunds = ""
			p.Spec.Tiers[0].TokenBucket.RefillPeriod = nil
		}, nil},
		{"client not UTF-8", func(p *RateLimitPolicy) { p.Spec.Overrides[0].Clients = []string{"a\xff"} },
			[]string{"spec.overrides[0].clients[0]"}},
		{"client with a control character", func(p *RateLimitPolicy) { p.Spec.Overrides[0].Clients = []string{"a\tb"} },
			[]string{"spec.overrides[0].clients[0]"}},
		{"prefix with NEL", func(p *RateLimitPolicy) { p.Spec.Overrides[0].ClientPrefixes = []string{"a\u0085"} },
			[]string{"spec.overrides[0].clientPrefixes[0]"}},
		{"descriptor key with a noncharacter", func(p *RateLimitPolicy) { p.Spec.Envoy = &Envoy{DescriptorKey: "k\uffff"} },
			[]string{"spec.envoy.descriptorKey"}},
		{"tier name too long", func(p *RateLimitPolicy) {
			n := strings.Repeat("a", 64)
			p.Spec.Tiers[0].Name, p.Spec.DefaultTier = n, n
		}, []string{"spec.tiers[0].name"}},
		{"every problem is listed", func(p *RateLimitPolicy) {
			p.Name = ""
			p.Spec.Tiers[0].TokenBucket.Capacity = 0
			p.Spec.Tiers[1].SlidingWindow.Limit = 0
			p.Spec.DefaultTier = "x"
			p.Spec.Overrides[0].Tier = "y"
			p.Spec.FailureMode = "z"
		}, []string{"metadata.name", "spec.tiers[0].tokenBucket.capacity", "spec.tiers[1].slidingWindow.limit",
			"spec.defaultTier", "spec.overrides[0].tier", "spec.failureMode"}},
		{"full refill not checked when a bound fails", func(p *RateLimitPolicy) {
			p.Spec.Tiers[0].TokenBucket = &TokenBucket{Capacity: MaxCapacity + 1, RefillRate: 1,
				RefillPeriod: &metav1.Duration{Duration: MaxPeriod}}
		}, []string{"spec.tiers[0].tokenBucket.capacity"}},
		{"duplicate across overrides names the first", func(p *RateLimitPolicy) {
			p.Spec.Overrides = append(p.Spec.Overrides, Override{Tier: "free", Clients: []string{"a"}})
		}, []string{"spec.overrides[1].clients[0]"}},
		{"a stacked tier", func(p *RateLimitPolicy) { p.Spec.Tiers[1] = stackedTier() }, nil},
		{"a stack of one limit", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Limits = p.Spec.Tiers[1].Limits[:1]
		}, nil},
		{"a stacked tier lists every problem, the single-limit fields included", func(p *RateLimitPolicy) {
			t := stackedTier()
			t.Algorithm = AlgorithmSlidingWindow
			t.SlidingWindow = &SlidingWindow{Limit: 5, Window: metav1.Duration{Duration: time.Second}}
			t.Limits[0].Name = "Burst"
			t.Limits[0].TokenBucket.Capacity = 0
			t.Limits[1].Algorithm = ""
			t.Limits = append(t.Limits, Limit{Name: "daily", Algorithm: AlgorithmUnlimited}, Limit{Name: "e", Algorithm: "Other"},
				Limit{Name: "f", Algorithm: AlgorithmTokenBucket, TokenBucket: &TokenBucket{Capacity: 1, RefillRate: 1}})
			p.Spec.Tiers[1] = t
		}, []string{"spec.tiers[1].limits", "spec.tiers[1].slidingWindow", "spec.tiers[1].limits",
			"spec.tiers[1].limits[0].name", "spec.tiers[1].limits[0].tokenBucket.capacity",
			"spec.tiers[1].limits[1].algorithm",
			"spec.tiers[1].limits[2].name", "spec.tiers[1].limits[2].algorithm", "spec.tiers[1].limits[3].algorithm"}},
		{"a stacked tier's token bucket without refillPeriod refills per second", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Limits[0].TokenBucket.RefillPeriod = nil
		}, nil},
		{"a quota tier", func(p *RateLimitPolicy) { p.Spec.Tiers[1] = quotaTier() }, nil},
		{"a quota without timeZone counts in UTC", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = quotaTier()
			p.Spec.Tiers[1].Quota.TimeZone = ""
		}, nil},
		{"a quota limit of a stack", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Limits[1] = Limit{Name: "monthly", Algorithm: AlgorithmQuota,
				Quota: &Quota{Limit: 100000, Period: CalendarPeriodMonth, TimeZone: "America/New_York"}}
		}, nil},
		{"a quota's every problem is listed", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = quotaTier()
			p.Spec.Tiers[1].Quota = &Quota{Limit: MaxQuotaLimit + 1, Period: "Fortnight", TimeZone: "Mars/Olympus_Mons"}
		}, []string{"spec.tiers[1].quota.limit", "spec.tiers[1].quota.period", "spec.tiers[1].quota.timeZone"}},
		{"a quota without period", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = quotaTier()
			p.Spec.Tiers[1].Quota.Period = ""
		}, []string{"spec.tiers[1].quota.period"}},
		{"a quota in the host's zone", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = quotaTier()
			p.Spec.Tiers[1].Quota.TimeZone = "Local"
		}, []string{"spec.tiers[1].quota.timeZone"}},
		{"a quota's zone too long", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = quotaTier()
			p.Spec.Tiers[1].Quota.TimeZone = strings.Repeat("A", MaxTimeZoneLength+1)
		}, []string{"spec.tiers[1].quota.timeZone"}},
		{"a quota's zone a path", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = quotaTier()
			p.Spec.Tiers[1].Quota.TimeZone = "/etc/localtime"
		}, []string{"spec.tiers[1].quota.timeZone"}},
		{"a quota tier without quota", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = Tier{Name: "pro", Algorithm: AlgorithmQuota}
		}, []string{"spec.tiers[1].quota"}},
		{"quota beside another algorithm", func(p *RateLimitPolicy) {
			p.Spec.Tiers[0].Quota = quotaTier().Quota
		}, []string{"spec.tiers[0].quota"}},
		{"quota on a stacked tier", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Quota = quotaTier().Quota
		}, []string{"spec.tiers[1].quota"}},
		{"a quota limit of a stack without quota, and an unknown zone", func(p *RateLimitPolicy) {
			p.Spec.Tiers[1] = stackedTier()
			p.Spec.Tiers[1].Limits[0] = Limit{Name: "daily", Algorithm: AlgorithmQuota}
			p.Spec.Tiers[1].Limits[1] = Limit{Name: "monthly", Algorithm: AlgorithmQuota,
				Quota: &Quota{Limit: 10, Period: CalendarPeriodMonth, TimeZone: "Europe/Atlantis"}}
		}, []string{"spec.tiers[1].limits[0].quota", "spec.tiers[1].limits[1].quota.timeZone"}},
		{"refunds with a quota tier", func(p *RateLimitPolicy) {
			p.Spec.Refunds = RefundsEnabled
			p.Spec.Tiers[1] = quotaTier()
		}, []string{"spec.refunds"}},
		{"refunds with a quota limit of a stack", func(p *RateLimitPolicy) {
			p.Spec.Refunds = RefundsEnabled
			p.Spec.Tiers[1] = Tier{Name: "pro", Limits: []Limit{
				{Name: "burst", Algorithm: AlgorithmTokenBucket, TokenBucket: &TokenBucket{Capacity: 10, RefillRate: 10}},
				{Name: "monthly", Algorithm: AlgorithmQuota, Quota: &Quota{Limit: 1000, Period: CalendarPeriodMonth}},
			}}
		}, []string{"spec.refunds"}},
		{"refunds with a quota and a sliding window: both said", func(p *RateLimitPolicy) {
			p.Spec.Refunds = RefundsEnabled
			p.Spec.Tiers[0] = quotaTier()
			p.Spec.Tiers[0].Name = "free"
		}, []string{"spec.refunds", "spec.refunds"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := validPolicy()
			tt.mutate(p)
			before := p.DeepCopy()
			err := Validate(p)
			if !equality.Semantic.DeepEqual(before, p) {
				t.Errorf("Validate modified the policy")
			}
			if len(tt.fields) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted it; want errors for %v", tt.fields)
			}
			var (
				got []string
				agg utilerrors.Aggregate
			)
			if !errors.As(err, &agg) {
				t.Fatalf("Validate: %v is not a list of field errors", err)
			}
			for _, e := range agg.Errors() {
				var fe *field.Error
				if !errors.As(e, &fe) {
					t.Fatalf("Validate: %v is not a field error", e)
				}
				got = append(got, fe.Field)
			}
			if strings.Join(got, " ") != strings.Join(tt.fields, " ") {
				t.Errorf("Validate: %v\nerrors for %v, want %v", err, got, tt.fields)
			}
			for _, f := range tt.fields {
				if !strings.Contains(err.Error(), f+":") {
					t.Errorf("message %q does not name %s", err, f)
				}
			}
		})
	}
	if err := Validate(nil); err == nil {
		t.Error("Validate(nil) = nil, want an error")
	}
}

// quotaTier returns a valid quota tier named pro: 1000 a day in Europe/Berlin.
func quotaTier() Tier {
	return Tier{Name: "pro", Algorithm: AlgorithmQuota,
		Quota: &Quota{Limit: 1000, Period: CalendarPeriodDay, TimeZone: "Europe/Berlin"}}
}

// concurrencyTier returns a Concurrency tier of the given name and parameters.
func concurrencyTier(name string, limit int64, leaseTimeout time.Duration) Tier {
	return Tier{Name: name, Algorithm: AlgorithmConcurrency,
		Concurrency: &Concurrency{Limit: limit, LeaseTimeout: metav1.Duration{Duration: leaseTimeout}}}
}

// concurrencyLimit returns a Concurrency limit of a stack of the given name and parameters.
func concurrencyLimit(name string, limit int64, leaseTimeout time.Duration) Limit {
	return Limit{Name: name, Algorithm: AlgorithmConcurrency,
		Concurrency: &Concurrency{Limit: limit, LeaseTimeout: metav1.Duration{Duration: leaseTimeout}}}
}

// stackedTier returns a valid stacked tier named pro: a token bucket and a sliding window.
func stackedTier() Tier {
	return Tier{Name: "pro", Limits: []Limit{
		{Name: "burst", Algorithm: AlgorithmTokenBucket, TokenBucket: &TokenBucket{Capacity: 20, RefillRate: 10,
			RefillPeriod: &metav1.Duration{Duration: time.Second}}},
		{Name: "daily", Algorithm: AlgorithmSlidingWindow, SlidingWindow: &SlidingWindow{Limit: 10000,
			Window: metav1.Duration{Duration: 24 * time.Hour}}},
	}}
}

func TestDuplicateDetailNamesFirst(t *testing.T) {
	p := validPolicy()
	p.Spec.Overrides = append(p.Spec.Overrides, Override{Tier: "free", ClientPrefixes: []string{"b:"}})
	err := Validate(p)
	if err == nil || !strings.Contains(err.Error(), "also at spec.overrides[0].clientPrefixes[0]") {
		t.Fatalf("Validate: %v, want the duplicate to name its first occurrence", err)
	}
}

func TestFullRefill(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		capacity, rate int64
		period         time.Duration
		want           time.Duration
		ok             bool
	}{
		{10, 1, time.Second, 10 * time.Second, true},
		{3, 2, time.Second, 1500 * time.Millisecond, true},
		{1, 3, time.Nanosecond, 0, true}, // rounded down
		{366 * 86400, 1, time.Second, 366 * day, true},
		{366*86400 + 1, 1, time.Second, 366*day + time.Second, false},
		{47215, 129, 86398170073070, 366 * day, true},                   // remainder 50/129 ns
		{249247, 681, 86399653355908, 366*day + time.Nanosecond, false}, // just over
		{MaxCapacity, MaxCapacity, MaxPeriod, MaxPeriod, true},
		{MaxCapacity, 1, time.Millisecond, MaxCapacity * time.Millisecond, true},
		{MaxCapacity, 1, time.Second, MaxCapacity * time.Second, false},
		{MaxCapacity, 1, MaxPeriod, 1<<63 - 1, false}, // the quotient does not fit 64 bits
		{0, 1, time.Second, 0, false},
		{1, 0, time.Second, 0, false},
	}
	for _, tt := range tests {
		got, ok := fullRefill(tt.capacity, tt.rate, tt.period)
		if got != tt.want || ok != tt.ok {
			t.Errorf("fullRefill(%d, %d, %v) = %v, %v; want %v, %v", tt.capacity, tt.rate, tt.period, got, ok, tt.want, tt.ok)
		}
	}
}

func TestDefault(t *testing.T) {
	p := validPolicy()
	p.Namespace = ""
	p.Default()
	if got := p.Spec.Tiers[0].TokenBucket.RefillPeriod; got == nil || got.Duration != time.Second {
		t.Errorf("refillPeriod = %v, want 1s", got)
	}
	if p.Spec.FailureMode != FailureModeOpen {
		t.Errorf("failureMode = %q, want Open", p.Spec.FailureMode)
	}
	if p.Spec.Refunds != RefundsDisabled {
		t.Errorf("refunds = %q, want Disabled", p.Spec.Refunds)
	}
	if p.Namespace != "" {
		t.Errorf("Default set the namespace to %q", p.Namespace)
	}
	// A stacked tier's token buckets get the default period too.
	p.Spec.Tiers[1] = stackedTier()
	p.Spec.Tiers[1].Limits[0].TokenBucket.RefillPeriod = nil
	p.Default()
	if got := p.Spec.Tiers[1].Limits[0].TokenBucket.RefillPeriod; got == nil || got.Duration != time.Second {
		t.Errorf("a limit's refillPeriod = %v, want 1s", got)
	}
	// A quota's timeZone, of a tier and of a stacked tier's limit, becomes UTC.
	p.Spec.Tiers = append(p.Spec.Tiers, quotaTier())
	p.Spec.Tiers[2].Quota.TimeZone = ""
	p.Spec.Tiers[1].Limits[1] = Limit{Name: "monthly", Algorithm: AlgorithmQuota, Quota: &Quota{Limit: 10, Period: CalendarPeriodMonth}}
	p.Default()
	if got := p.Spec.Tiers[2].Quota.TimeZone; got != DefaultTimeZone {
		t.Errorf("timeZone = %q, want %q", got, DefaultTimeZone)
	}
	if got := p.Spec.Tiers[1].Limits[1].Quota.TimeZone; got != DefaultTimeZone {
		t.Errorf("a limit's timeZone = %q, want %q", got, DefaultTimeZone)
	}
	// Set values stay, and Default is idempotent.
	p.Spec.Tiers[2].Quota.TimeZone = "Asia/Tokyo"
	p.Spec.Tiers[0].TokenBucket.RefillPeriod.Duration = time.Minute
	p.Spec.FailureMode = FailureModeClosed
	want := p.DeepCopy()
	p.Default()
	if !equality.Semantic.DeepEqual(want, p) {
		t.Errorf("Default changed set values")
	}
}
