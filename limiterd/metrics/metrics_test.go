package metrics

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
)

func compileSet(t *testing.T, policies ...*v1alpha1.RateLimitPolicy) *policy.Set {
	t.Helper()
	var compiled []*policy.Policy
	for _, p := range policies {
		c, err := policy.Compile(p)
		if err != nil {
			t.Fatalf("compile: %v", err)
		}
		compiled = append(compiled, c)
	}
	set, err := policy.NewSet(compiled...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// apiPolicy is default/api: tier standard (1 token a minute, the default), tier shadow (the
// same, dry run) for keys starting with "shadow-".
func apiPolicy(failureMode v1alpha1.FailureMode) *v1alpha1.RateLimitPolicy {
	tb := func() *v1alpha1.TokenBucket {
		return &v1alpha1.TokenBucket{Capacity: 1, RefillRate: 1, RefillPeriod: &metav1.Duration{Duration: time.Minute}}
	}
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "default"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "standard",
			FailureMode: failureMode,
			Tiers: []v1alpha1.Tier{
				{Name: "standard", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: tb()},
				{Name: "shadow", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: tb(), DryRun: true},
			},
			Overrides: []v1alpha1.Override{{Tier: "shadow", ClientPrefixes: []string{"shadow-"}}},
		},
	}
}

func TestDecisionsByPolicyTierAndResult(t *testing.T) {
	budget := limiter.NewBudget(0, 0)
	m := New(budget)
	e := engine.New(engine.Options{Budget: budget, Observer: m})
	e.Swap(compileSet(t, apiPolicy(v1alpha1.FailureModeOpen)))
	ctx := t.Context()
	for _, key := range []string{"alice", "alice", "alice", "bob", "shadow-carol", "shadow-carol"} {
		if _, err := e.Decide(ctx, "default/api", key, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		tier, result string
		want         float64
	}{
		{"standard", "allowed", 2}, {"standard", "rejected", 2}, {"standard", "dry_run_rejected", 0},
		{"shadow", "allowed", 1}, {"shadow", "rejected", 0}, {"shadow", "dry_run_rejected", 1},
	} {
		if got := testutil.ToFloat64(m.decisions.WithLabelValues("default/api", tc.tier, tc.result)); got != tc.want {
			t.Errorf("decisions{tier=%s,result=%s} = %v, want %v", tc.tier, tc.result, got, tc.want)
		}
	}
	if got := testutil.CollectAndCount(m.decisionLatency, "limiterd_decision_duration_seconds"); got != 1 {
		t.Errorf("latency series = %d, want 1 (by policy only)", got)
	}
	if got := gathered(t, m, "limiterd_tracked_clients"); got != 3 {
		t.Errorf("tracked clients = %v, want 3", got)
	}

	// No series carries a client key.
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if strings.Contains(l.GetValue(), "alice") || strings.Contains(l.GetValue(), "carol") {
					t.Errorf("%s has a client key label %s=%q", f.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
}

// gathered returns the value of an unlabelled gauge or counter as the registry exports it.
func gathered(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		metric := f.GetMetric()[0]
		switch {
		case metric.GetGauge() != nil:
			return metric.GetGauge().GetValue()
		case metric.GetCounter() != nil:
			return metric.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return 0
}

// scrape returns what /metrics answers.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	return rec.Body.String()
}

func TestBudgetMetrics(t *testing.T) {
	// One client at most: once a store shard holds a client, a new client in that shard evicts
	// it, still holding usage. 600 clients over 256 shards evict some.
	budget := limiter.NewBudget(1, 0)
	m := New(budget)
	now := time.Unix(1700000000, 0)
	e := engine.New(engine.Options{Budget: budget, Observer: m, Clock: func() time.Time { return now }})
	e.Swap(compileSet(t, apiPolicy(v1alpha1.FailureModeOpen)))
	ctx := t.Context()
	for i := range 600 {
		if _, err := e.Decide(ctx, "default/api", fmt.Sprintf("client-%d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if budget.Evictions() == 0 {
		t.Fatal("no eviction: the test does not exercise the counter")
	}
	for name, want := range map[string]int64{
		"limiterd_tracked_clients":            budget.Tracked(),
		"limiterd_client_evictions_total":     budget.Evictions(),
		"limiterd_idle_clients_dropped_total": budget.Dropped(),
	} {
		if got := gathered(t, m, name); got != float64(want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(fmt.Sprintf(`
# HELP limiterd_tracked_clients Clients whose state is kept in process memory.
# TYPE limiterd_tracked_clients gauge
limiterd_tracked_clients %d
`, budget.Tracked())), "limiterd_tracked_clients"); err != nil {
		t.Error(err)
	}
	// A minute later every bucket is full again: a sweep drops them all.
	tracked := budget.Tracked()
	now = now.Add(time.Minute)
	e.Sweep()
	if got := gathered(t, m, "limiterd_idle_clients_dropped_total"); got != float64(tracked) {
		t.Errorf("dropped after the sweep = %v, want %d", got, tracked)
	}
	if got := gathered(t, m, "limiterd_tracked_clients"); got != 0 {
		t.Errorf("tracked after the sweep = %v, want 0", got)
	}
}

// failingStore fails every operation.
type failingStore struct{}

var errStoreDown = errors.New("store down")

func (failingStore) Decide(context.Context, string, *limiter.Stack, time.Time, int64, []limiter.Decision) (limiter.Decision, error) {
	return limiter.Decision{}, errStoreDown
}
func (failingStore) Refund(context.Context, limiter.Request, time.Time, limiter.Once) (limiter.Decision, error) {
	return limiter.Decision{}, errStoreDown
}
func (failingStore) DecideBatch(_ context.Context, reqs []limiter.Request, _ time.Time, out []limiter.Answer) {
	for i := range reqs {
		out[i] = limiter.Answer{Err: errStoreDown}
	}
}
func (failingStore) Reset(context.Context, string, time.Time) error { return errStoreDown }

func TestStoreErrorsByPolicy(t *testing.T) {
	m := New(nil)
	e := engine.New(engine.Options{Observer: m, NewStore: func(v1alpha1.PolicyID) limiter.Store { return failingStore{} }})
	e.Swap(compileSet(t, apiPolicy(v1alpha1.FailureModeOpen)))
	for range 3 {
		if _, err := e.Decide(t.Context(), "", "alice", 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.storeErrors.WithLabelValues("default/api")); got != 3 {
		t.Errorf("store errors = %v, want 3", got)
	}
	if got := testutil.ToFloat64(m.decisions.WithLabelValues("default/api", "standard", "allowed")); got != 3 {
		t.Errorf("allowed (failure mode Open) = %v, want 3", got)
	}
}

func TestReloads(t *testing.T) {
	m := New(nil)
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP limiterd_policy_reloads_total Policy contributions applied (success) or rejected (failure: unreadable, invalid or conflicting).
# TYPE limiterd_policy_reloads_total counter
limiterd_policy_reloads_total{result="failure"} 0
limiterd_policy_reloads_total{result="success"} 0
# HELP limiterd_policy_last_reload_success_timestamp_seconds Unix time of the last successful policy reload; 0 before the first.
# TYPE limiterd_policy_last_reload_success_timestamp_seconds gauge
limiterd_policy_last_reload_success_timestamp_seconds 0
`), "limiterd_policy_reloads_total", "limiterd_policy_last_reload_success_timestamp_seconds"); err != nil {
		t.Error(err)
	}
	m.ReloadSucceeded(time.Unix(1700000000, 500_000_000))
	m.ReloadFailed()
	m.ReloadFailed()
	if got := testutil.ToFloat64(m.reloads.WithLabelValues(ReloadSuccess)); got != 1 {
		t.Errorf("successes = %v", got)
	}
	if got := testutil.ToFloat64(m.reloads.WithLabelValues(ReloadFailure)); got != 2 {
		t.Errorf("failures = %v", got)
	}
	if got := testutil.ToFloat64(m.lastReloadSuccess); got != 1700000000.5 {
		t.Errorf("last success = %v", got)
	}
}

// fakeSharedStore is a SharedStore whose counters the test sets.
type fakeSharedStore struct {
	hits, resets uint64
	breakerOpen  bool
	trips        int64
}

func (s *fakeSharedStore) RejectCacheCounts() (hits, resetsReceived uint64) { return s.hits, s.resets }
func (s *fakeSharedStore) BreakerOpen() bool                                { return s.breakerOpen }
func (s *fakeSharedStore) BreakerTrips() int64                              { return s.trips }

// sharedStoreMetrics are the names of the metrics AddSharedStore registers.
var sharedStoreMetrics = []string{
	"limiterd_reject_cache_hits_total", "limiterd_reject_cache_resets_received_total",
	"limiterd_store_up", "limiterd_store_breaker_open", "limiterd_store_breaker_trips_total",
}

func TestSharedStore(t *testing.T) {
	m := New(nil)
	if n, err := testutil.GatherAndCount(m.Registry(), sharedStoreMetrics...); err != nil || n != 0 {
		t.Fatalf("%d shared store series before AddSharedStore (%v), want none: the memory store has none", n, err)
	}
	s := &fakeSharedStore{}
	up := m.AddSharedStore(s, 5*time.Second)
	const want = `
# HELP limiterd_reject_cache_hits_total Decisions answered from the local reject cache (--redis-local-reject-cache), without Redis.
# TYPE limiterd_reject_cache_hits_total counter
limiterd_reject_cache_hits_total %d
# HELP limiterd_reject_cache_resets_received_total Client resets, made through any replica, that reached this replica's reject cache.
# TYPE limiterd_reject_cache_resets_received_total counter
limiterd_reject_cache_resets_received_total %d
# HELP limiterd_store_up 1 when every node of the shared store answered the last ping (every 5s), else 0.
# TYPE limiterd_store_up gauge
limiterd_store_up %d
# HELP limiterd_store_breaker_open 1 while the shared store's circuit breaker is open: decisions follow the failure modes without calling the store.
# TYPE limiterd_store_breaker_open gauge
limiterd_store_breaker_open %d
# HELP limiterd_store_breaker_trips_total Times the shared store's circuit breaker opened after consecutive failures.
# TYPE limiterd_store_breaker_trips_total counter
limiterd_store_breaker_trips_total %d
`
	// Down until the first ping answers.
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(fmt.Sprintf(want, 0, 0, 0, 0, 0)), sharedStoreMetrics...); err != nil {
		t.Error(err)
	}
	// The store's counters are read when scraped; a ping's outcome is recorded.
	s.hits, s.resets, s.breakerOpen, s.trips = 7, 3, true, 2
	up(true)
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(fmt.Sprintf(want, 7, 3, 1, 1, 2)), sharedStoreMetrics...); err != nil {
		t.Error(err)
	}
	up(false)
	if got := gathered(t, m, "limiterd_store_up"); got != 0 {
		t.Errorf("store up after a failed ping = %v, want 0", got)
	}
}

func TestPolicyFileWatched(t *testing.T) {
	m := New(nil)
	const want = `
# HELP limiterd_policy_files_unwatched Policy files whose directory is gone: their changes are not seen until it is back (their last good policies keep serving).
# TYPE limiterd_policy_files_unwatched gauge
limiterd_policy_files_unwatched %d
# HELP limiterd_policy_file_watch_losses_total Times the directory of a policy file was deleted or moved away under its watch.
# TYPE limiterd_policy_file_watch_losses_total counter
limiterd_policy_file_watch_losses_total %d
`
	names := []string{"limiterd_policy_files_unwatched", "limiterd_policy_file_watch_losses_total"}
	// Served from the start, at 0.
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(fmt.Sprintf(want, 0, 0)), names...); err != nil {
		t.Error(err)
	}
	// Two files lose their directory; one gets it back.
	m.PolicyFileWatched(false)
	m.PolicyFileWatched(false)
	m.PolicyFileWatched(true)
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(fmt.Sprintf(want, 1, 2)), names...); err != nil {
		t.Error(err)
	}
}

func TestObserveDoesNotAllocate(t *testing.T) {
	m := New(nil)
	obs := m.Tier("default/api", "standard")
	allocs := testing.AllocsPerRun(1000, func() {
		obs.Observe(engine.Allowed, time.Microsecond)
		obs.Observe(engine.Rejected, time.Microsecond)
		obs.Observe(engine.DryRunRejected, time.Microsecond)
	})
	if allocs != 0 {
		t.Errorf("Observe allocates %v times, want 0 (children resolved at Tier time)", allocs)
	}
	if got := testutil.ToFloat64(m.decisions.WithLabelValues("default/api", "standard", "rejected")); got < 1000 {
		t.Errorf("rejected = %v, want every observation counted", got)
	}
}

func TestHandlerServesMetrics(t *testing.T) {
	m := New(limiter.NewBudget(0, 0))
	m.ReloadFailed()
	body := scrape(t, m)
	for _, want := range []string{
		`limiterd_policy_reloads_total{result="failure"} 1`,
		"limiterd_tracked_clients 0",
		"go_goroutines",
		"process_cpu_seconds_total",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// scrape returns the /metrics lines that carry a policy label.
func policyLines(t *testing.T, m *Metrics) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	var lines []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.Contains(line, `policy="`) {
			lines = append(lines, line)
		}
	}
	return lines
}

func TestSeriesOfRemovedPoliciesAndTiersAreDeleted(t *testing.T) {
	budget := limiter.NewBudget(0, 0)
	m := New(budget)
	e := engine.New(engine.Options{Budget: budget, Observer: m})
	other := apiPolicy(v1alpha1.FailureModeOpen)
	other.Name = "other"
	e.Swap(compileSet(t, apiPolicy(v1alpha1.FailureModeOpen), other))
	for _, id := range []v1alpha1.PolicyID{"default/api", "default/other"} {
		for _, key := range []string{"alice", "shadow-carol"} {
			if _, err := e.Decide(t.Context(), id, key, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A decision of default/other that started before its removal, and will see its store fail
	// after: its observers were resolved when the policy was swapped in.
	inFlight, inFlightTier := m.Policy("default/other"), m.Tier("default/other", "standard")
	inFlight.StoreError()
	if lines := policyLines(t, m); !strings.Contains(strings.Join(lines, "\n"), `limiterd_store_errors_total{policy="default/other"} 1`) {
		t.Fatalf("no store error of default/other before its removal:\n%s", strings.Join(lines, "\n"))
	}
	// default/other goes; default/api loses its shadow tier.
	api := apiPolicy(v1alpha1.FailureModeOpen)
	api.Spec.Tiers, api.Spec.Overrides = api.Spec.Tiers[:1], nil
	e.Swap(compileSet(t, api))
	// The decision in flight ends: its store error and outcome must not bring the series back.
	// Before, a store error was counted by label lookup and recreated the series.
	inFlight.StoreError()
	inFlightTier.Observe(engine.Allowed, time.Millisecond)
	lines := policyLines(t, m)
	for _, line := range lines {
		if strings.Contains(line, `policy="default/other"`) || strings.Contains(line, `tier="shadow"`) {
			t.Errorf("series of a removed policy or tier still served: %s", line)
		}
	}
	if !strings.Contains(strings.Join(lines, "\n"), `limiterd_decisions_total{policy="default/api",result="allowed",tier="standard"} 1`) {
		t.Errorf("the series of the tier that stays were lost:\n%s", strings.Join(lines, "\n"))
	}
}

// leasePolicy is default/llm: tier standard, at most 2 requests of a client in flight, leased
// for a minute.
func leasePolicy() *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "llm", Namespace: "default"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "standard",
			Tiers: []v1alpha1.Tier{{Name: "standard", Algorithm: v1alpha1.AlgorithmConcurrency,
				Concurrency: &v1alpha1.Concurrency{Limit: 2, LeaseTimeout: metav1.Duration{Duration: time.Minute}}}},
		},
	}
}

// leaseMetrics are the names of the lease metrics.
var leaseMetrics = []string{"limiterd_leases_held", "limiterd_leases_expired_total", "limiterd_lease_releases_total"}

// TestLeaseMetrics follows the leases of a concurrency tier through the metrics: held while
// neither released nor dropped, expired without a release when a decision or a sweep drops
// them after their timeout, and every release counted by outcome.
func TestLeaseMetrics(t *testing.T) {
	budget := limiter.NewBudget(0, 0)
	m := New(budget)
	now := time.Unix(1700000000, 0)
	e := engine.New(engine.Options{Budget: budget, Observer: m, Clock: func() time.Time { return now }})
	m.AddLeases(e)
	e.Swap(compileSet(t, leasePolicy()))
	acquire := func(key string) string {
		t.Helper()
		r, err := e.Decide(t.Context(), "default/llm", key, 1)
		if err != nil || !r.Allowed || r.LeaseToken == "" {
			t.Fatalf("decide %s: allowed %v lease %q err %v", key, r.Allowed, r.LeaseToken, err)
		}
		return r.LeaseToken
	}
	want := func(what string, held, expired int, releases string) {
		t.Helper()
		err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(fmt.Sprintf(`
# HELP limiterd_leases_held Leases of concurrency limits held in process memory, by policy and tier: taken and neither released nor dropped (a lease past its timeout counts until its client's next decision or the next sweep).
# TYPE limiterd_leases_held gauge
limiterd_leases_held{policy="default/llm",tier="standard"} %d
# HELP limiterd_leases_expired_total Leases of concurrency limits that expired without a release (callers that crashed, leaked them, or outworked their timeout), by policy and tier, counted when the memory store drops them.
# TYPE limiterd_leases_expired_total counter
limiterd_leases_expired_total{policy="default/llm",tier="standard"} %d
# HELP limiterd_lease_releases_total Calls of /v1/release on a concurrency limit's lease, by policy, tier and outcome (released, extended, or refused: already_released, expired, unknown, forged, invalid, uncertain); policy and tier are empty when the lease names none loaded.
# TYPE limiterd_lease_releases_total counter
`, held, expired)+releases), leaseMetrics...)
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	// releases returns the release series of default/llm standard, with the given counts of
	// released, extended, already_released and expired (the other outcomes stay 0).
	releases := func(released, extended, again, expired int) string {
		return fmt.Sprintf(`limiterd_lease_releases_total{outcome="already_released",policy="default/llm",tier="standard"} %d
limiterd_lease_releases_total{outcome="expired",policy="default/llm",tier="standard"} %d
limiterd_lease_releases_total{outcome="extended",policy="default/llm",tier="standard"} %d
limiterd_lease_releases_total{outcome="forged",policy="default/llm",tier="standard"} 0
limiterd_lease_releases_total{outcome="invalid",policy="default/llm",tier="standard"} 0
limiterd_lease_releases_total{outcome="released",policy="default/llm",tier="standard"} %d
limiterd_lease_releases_total{outcome="uncertain",policy="default/llm",tier="standard"} 0
limiterd_lease_releases_total{outcome="unknown",policy="default/llm",tier="standard"} 0
`, again, expired, extended, released)
	}
	want("loaded", 0, 0, releases(0, 0, 0, 0))

	// alice takes both places, bob one.
	a1, a2, b1 := acquire("alice"), acquire("alice"), acquire("bob")
	want("three taken", 3, 0, releases(0, 0, 0, 0))
	// The policy compiled again (a reload, an edit of another tier) keeps counting them.
	e.Swap(compileSet(t, leasePolicy()))
	want("reloaded", 3, 0, releases(0, 0, 0, 0))

	// alice releases one, twice; extends the other.
	if _, err := e.Release(t.Context(), a1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Release(t.Context(), a1, false); !errors.Is(err, engine.ErrLeaseReleased) {
		t.Fatalf("second release: %v", err)
	}
	now = now.Add(30 * time.Second)
	if _, err := e.Release(t.Context(), a2, true); err != nil {
		t.Fatal(err)
	}
	want("one released, one extended", 2, 0, releases(1, 1, 1, 0))

	// A minute after it was taken, bob's lease is past its timeout but still counted held: it is
	// dropped lazily. bob's next decision drops it, as expired without a release.
	now = now.Add(30 * time.Second)
	want("bob's lease past its timeout", 2, 0, releases(1, 1, 1, 0))
	if _, err := e.Release(t.Context(), b1, false); !errors.Is(err, engine.ErrLeaseExpired) {
		t.Fatalf("release of an expired lease: %v", err)
	}
	acquire("bob")
	want("bob decided again", 2, 1, releases(1, 1, 1, 1))

	// A minute later both leases have expired: the sweep drops them (bob's, alice's extended one).
	now = now.Add(time.Minute)
	e.Sweep()
	want("swept", 0, 3, releases(1, 1, 1, 1))

	// A lease that names no tier loaded counts without policy and tier: no client key, and no
	// label an outsider chooses.
	if _, err := e.Release(t.Context(), "not-a-lease", false); !errors.Is(err, engine.ErrInvalidLease) {
		t.Fatalf("release of garbage: %v", err)
	}
	if got := testutil.ToFloat64(m.releases.WithLabelValues("", "", "invalid")); got != 1 {
		t.Errorf("invalid releases = %v, want 1", got)
	}
	for _, line := range strings.Split(scrape(t, m), "\n") {
		if strings.Contains(line, "alice") || strings.Contains(line, "bob") {
			t.Errorf("a series carries a client key: %s", line)
		}
	}

	// The policy goes: so do its lease series.
	empty, err := policy.NewSet()
	if err != nil {
		t.Fatal(err)
	}
	e.Swap(empty)
	for _, line := range policyLines(t, m) {
		if strings.Contains(line, "lease") && strings.Contains(line, `policy="default/llm"`) {
			t.Errorf("series of a removed policy still served: %s", line)
		}
	}
}

func TestLeaseReleaseDoesNotAllocate(t *testing.T) {
	m := New(nil)
	obs := m.Leases("default/llm", "standard")
	allocs := testing.AllocsPerRun(1000, func() {
		obs.Release(engine.LeaseReleased)
		obs.Release(engine.LeaseExtended)
	})
	if allocs != 0 {
		t.Errorf("Release allocates %v times, want 0 (children resolved at Leases time)", allocs)
	}
	if got := testutil.ToFloat64(m.releases.WithLabelValues("default/llm", "standard", "released")); got < 1000 {
		t.Errorf("released = %v, want every release counted", got)
	}
}
