// Package metrics exposes limiterd's Prometheus metrics on a registry of its own.
//
// Every metric of limiterd is defined here, prefixed limiterd_; cmd/limiterd only feeds them.
// Labels are policy IDs, tier names and fixed outcome words, all bounded by the loaded
// configuration: a client key is never a label.
//
// Metrics implements engine.Observer: the labelled children of a policy and its tiers are
// resolved once, when the policy is swapped in, so recording a decision is two atomic updates
// and no label lookup, and a decision that outlives its policy's removal records on children no
// longer exported instead of bringing their series back.
// The series of a policy or tier are deleted when a swap removes it (Forget), so that their
// number is bounded by the policies loaded, not by those ever loaded.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
)

// Reload results, the values of the result label of limiterd_policy_reloads_total.
const (
	ReloadSuccess = "success"
	ReloadFailure = "failure"
)

// decisionLatencyBuckets span an in-memory decision (about a microsecond) to a slow shared
// store round trip (100 ms), in seconds.
var decisionLatencyBuckets = []float64{
	1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
	1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
}

// Metrics holds limiterd's metrics and the registry that exports them. It is safe for
// concurrent use.
type Metrics struct {
	registry          *prometheus.Registry
	decisions         *prometheus.CounterVec   // policy, tier, result
	decisionLatency   *prometheus.HistogramVec // policy
	storeErrors       *prometheus.CounterVec   // policy
	releases          *prometheus.CounterVec   // policy, tier, outcome
	reloads           *prometheus.CounterVec   // result
	lastReloadSuccess prometheus.Gauge         // Unix seconds
	filesUnwatched    prometheus.Gauge
	fileWatchLosses   prometheus.Counter
}

var _ engine.Observer = (*Metrics)(nil)

// New returns limiterd's metrics on a new registry that also carries the Go runtime and
// process collectors. The client-tracking metrics read budget (nil: the budget metrics are not
// registered).
func New(budget *limiter.Budget) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limiterd_decisions_total",
			Help: "Rate-limit decisions, by policy, tier and result (allowed, rejected, dry_run_rejected).",
		}, []string{"policy", "tier", "result"}),
		decisionLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "limiterd_decision_duration_seconds",
			Help:    "Time to decide one request in the engine (store included, HTTP excluded), by policy.",
			Buckets: decisionLatencyBuckets,
		}, []string{"policy"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limiterd_store_errors_total",
			Help: "Decisions whose store failed, so that the policy's failure mode decided, by policy.",
		}, []string{"policy"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limiterd_lease_releases_total",
			Help: "Calls of /v1/release on a concurrency limit's lease, by policy, tier and outcome (released, extended, or refused: already_released, expired, unknown, forged, invalid, uncertain); policy and tier are empty when the lease names none loaded.",
		}, []string{"policy", "tier", "outcome"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "limiterd_policy_reloads_total",
			Help: "Policy contributions applied (success) or rejected (failure: unreadable, invalid or conflicting).",
		}, []string{"result"}),
		lastReloadSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "limiterd_policy_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful policy reload; 0 before the first.",
		}),
		filesUnwatched: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "limiterd_policy_files_unwatched",
			Help: "Policy files whose directory is gone: their changes are not seen until it is back (their last good policies keep serving).",
		}),
		fileWatchLosses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "limiterd_policy_file_watch_losses_total",
			Help: "Times the directory of a policy file was deleted or moved away under its watch.",
		}),
	}
	// Both results exist from the start, so that rate() and alerts see a zero, not a gap.
	m.reloads.WithLabelValues(ReloadSuccess)
	m.reloads.WithLabelValues(ReloadFailure)
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.decisions, m.decisionLatency, m.storeErrors, m.releases, m.reloads, m.lastReloadSuccess,
		m.filesUnwatched, m.fileWatchLosses,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "limiterd_strategies",
			Help: "Strategies in use: distinct parameter sets that a loaded policy, a decision in flight or a client's state references (the strategy intern table's size).",
		}, func() float64 { return float64(limiter.Strategies()) }),
	)
	if budget != nil {
		m.registry.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "limiterd_tracked_clients",
				Help: "Clients whose state is kept in process memory.",
			}, func() float64 { return float64(budget.Tracked()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "limiterd_tracked_client_bytes",
				Help: "Bytes of client state kept in process memory, keys included, as bounded by --max-client-bytes.",
			}, func() float64 { return float64(budget.Bytes()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "limiterd_client_evictions_total",
				Help: "Clients evicted to respect --max-clients or --max-client-bytes while their state still held usage: each may have been admitted more than its limit.",
			}, func() float64 { return float64(budget.Evictions()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "limiterd_idle_clients_dropped_total",
				Help: "Idle client states dropped (fresh again, so no decision changes).",
			}, func() float64 { return float64(budget.Dropped()) }),
		)
	}
	return m
}

// LeaseSource is an engine whose in-memory leases the metrics read when scraped
// (engine.Engine).
type LeaseSource interface {
	// EachLeaseTier calls yield with each loaded tier that holds a concurrency limit decided
	// in process memory, and the counts of its leases.
	EachLeaseTier(yield func(policyID v1alpha1.PolicyID, tier string, stats *limiter.LeaseStats))
}

// AddLeases registers the metrics of the leases that the memory stores of src hold:
// limiterd_leases_held and limiterd_leases_expired_total, by policy and tier, read from src
// when scraped (limiter.LeaseStats defines what they count). A policy or tier removed is no
// longer read, so its series go with it.
func (m *Metrics) AddLeases(src LeaseSource) {
	m.registry.MustRegister(leaseCollector{src: src})
}

var (
	leasesHeldDesc = prometheus.NewDesc("limiterd_leases_held",
		"Leases of concurrency limits held in process memory, by policy and tier: taken and neither released nor dropped (a lease past its timeout counts until its client's next decision or the next sweep).",
		[]string{"policy", "tier"}, nil)
	leasesExpiredDesc = prometheus.NewDesc("limiterd_leases_expired_total",
		"Leases of concurrency limits that expired without a release (callers that crashed, leaked them, or outworked their timeout), by policy and tier, counted when the memory store drops them.",
		[]string{"policy", "tier"}, nil)
)

// leaseCollector reads the lease counts of an engine's tiers when scraped.
type leaseCollector struct{ src LeaseSource }

// Describe implements prometheus.Collector.
func (c leaseCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- leasesHeldDesc
	ch <- leasesExpiredDesc
}

// Collect implements prometheus.Collector.
func (c leaseCollector) Collect(ch chan<- prometheus.Metric) {
	c.src.EachLeaseTier(func(policyID v1alpha1.PolicyID, tier string, stats *limiter.LeaseStats) {
		id := policyID.String()
		ch <- prometheus.MustNewConstMetric(leasesHeldDesc, prometheus.GaugeValue, float64(stats.Held()), id, tier)
		ch <- prometheus.MustNewConstMetric(leasesExpiredDesc, prometheus.CounterValue, float64(stats.Expired()), id, tier)
	})
}

// SharedStore is a shared store (a Redis store's client) whose reject caches and circuit
// breaker the metrics read when scraped.
type SharedStore interface {
	// RejectCacheCounts returns the decisions answered from the reject caches, without the
	// store, and the client resets that reached them, since the store was opened.
	RejectCacheCounts() (hits, resetsReceived uint64)
	// BreakerOpen reports whether the circuit breaker is open.
	BreakerOpen() bool
	// BreakerTrips returns the times the circuit breaker opened.
	BreakerTrips() int64
}

// AddSharedStore registers the metrics of the shared store s, whose health is pinged every
// pingInterval, and returns the function that records a ping's outcome (up: every node
// answered) in limiterd_store_up, which is 0 until the first. The other metrics read s when
// scraped.
func (m *Metrics) AddSharedStore(s SharedStore, pingInterval time.Duration) func(up bool) {
	up := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "limiterd_store_up",
		Help: "1 when every node of the shared store answered the last ping (every " + pingInterval.String() + "), else 0.",
	})
	m.registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "limiterd_reject_cache_hits_total",
			Help: "Decisions answered from the local reject cache (--redis-local-reject-cache), without Redis.",
		}, func() float64 { hits, _ := s.RejectCacheCounts(); return float64(hits) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "limiterd_reject_cache_resets_received_total",
			Help: "Client resets, made through any replica, that reached this replica's reject cache.",
		}, func() float64 { _, resets := s.RejectCacheCounts(); return float64(resets) }),
		up,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "limiterd_store_breaker_open",
			Help: "1 while the shared store's circuit breaker is open: decisions follow the failure modes without calling the store.",
		}, func() float64 { return boolGauge(s.BreakerOpen()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "limiterd_store_breaker_trips_total",
			Help: "Times the shared store's circuit breaker opened after consecutive failures.",
		}, func() float64 { return float64(s.BreakerTrips()) }),
	)
	return func(reachable bool) { up.Set(boolGauge(reachable)) }
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// PolicyFileWatched is a source.FileOptions.OnWatch: it counts a policy file whose directory
// was deleted or moved away (watched false) as unwatched until it is watched again (true).
func (m *Metrics) PolicyFileWatched(watched bool) {
	if watched {
		m.filesUnwatched.Dec()
		return
	}
	m.filesUnwatched.Inc()
	m.fileWatchLosses.Inc()
}

// Registry returns the registry the metrics are registered on, for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler returns the /metrics handler for the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// Tier implements engine.Observer: it resolves the tier's labelled children once.
func (m *Metrics) Tier(policyID v1alpha1.PolicyID, tier string) engine.TierObserver {
	id := policyID.String()
	return &tierObserver{
		allowed:        m.decisions.WithLabelValues(id, tier, engine.Allowed.String()),
		rejected:       m.decisions.WithLabelValues(id, tier, engine.Rejected.String()),
		dryRunRejected: m.decisions.WithLabelValues(id, tier, engine.DryRunRejected.String()),
		latency:        m.decisionLatency.WithLabelValues(id),
	}
}

// Leases implements engine.Observer: it resolves the tier's release counters once; with policy
// and tier "", releases of leases that name no tier loaded are counted by label lookup (a
// refusal, off the decision path).
func (m *Metrics) Leases(policyID v1alpha1.PolicyID, tier string) engine.LeaseObserver {
	if policyID == "" {
		return unresolvedLeases{m.releases}
	}
	o := &leaseObserver{}
	for _, outcome := range engine.ReleaseOutcomes() {
		o.byOutcome = append(o.byOutcome, m.releases.WithLabelValues(policyID.String(), tier, outcome.String()))
	}
	return o
}

// leaseObserver counts one tier's releases on children resolved at swap time.
type leaseObserver struct {
	byOutcome []prometheus.Counter // by engine.ReleaseOutcome
}

// Release implements engine.LeaseObserver.
func (o *leaseObserver) Release(outcome engine.ReleaseOutcome) {
	if int(outcome) < len(o.byOutcome) {
		o.byOutcome[outcome].Inc()
	}
}

// unresolvedLeases counts the releases of leases that name no tier loaded.
type unresolvedLeases struct{ releases *prometheus.CounterVec }

// Release implements engine.LeaseObserver.
func (o unresolvedLeases) Release(outcome engine.ReleaseOutcome) {
	o.releases.WithLabelValues("", "", outcome.String()).Inc()
}

// Policy implements engine.Observer: it resolves the policy's store-error counter once, so that
// an error recorded by a decision that outlived the policy's removal counts on a child no longer
// exported, rather than bringing the series back.
func (m *Metrics) Policy(policyID v1alpha1.PolicyID) engine.PolicyObserver {
	return policyObserver{storeErrors: m.storeErrors.WithLabelValues(policyID.String())}
}

type policyObserver struct {
	storeErrors prometheus.Counter
}

// StoreError implements engine.PolicyObserver.
func (o policyObserver) StoreError() { o.storeErrors.Inc() }

// Forget implements engine.Observer: it deletes the series of a removed tier, or of every tier
// of a removed policy (tier "").
func (m *Metrics) Forget(id v1alpha1.PolicyID, tier string) {
	policyID := id.String()
	if tier != "" {
		m.decisions.DeletePartialMatch(prometheus.Labels{"policy": policyID, "tier": tier})
		m.releases.DeletePartialMatch(prometheus.Labels{"policy": policyID, "tier": tier})
		return
	}
	m.decisions.DeletePartialMatch(prometheus.Labels{"policy": policyID})
	m.releases.DeletePartialMatch(prometheus.Labels{"policy": policyID})
	m.decisionLatency.DeleteLabelValues(policyID)
	m.storeErrors.DeleteLabelValues(policyID)
}

// ReloadSucceeded counts a successful policy reload that completed at the given instant.
func (m *Metrics) ReloadSucceeded(at time.Time) {
	m.reloads.WithLabelValues(ReloadSuccess).Inc()
	m.lastReloadSuccess.Set(float64(at.UnixNano()) / 1e9)
}

// ReloadFailed counts a rejected policy reload.
func (m *Metrics) ReloadFailed() { m.reloads.WithLabelValues(ReloadFailure).Inc() }

// tierObserver records one tier's decisions on children resolved at swap time.
type tierObserver struct {
	allowed, rejected, dryRunRejected prometheus.Counter
	latency                           prometheus.Observer
}

// Observe implements engine.TierObserver.
func (t *tierObserver) Observe(o engine.Outcome, elapsed time.Duration) {
	switch o {
	case engine.Rejected:
		t.rejected.Inc()
	case engine.DryRunRejected:
		t.dryRunRejected.Inc()
	case engine.Allowed:
		t.allowed.Inc()
	}
	t.latency.Observe(elapsed.Seconds())
}
