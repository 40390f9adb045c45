package main

import "github.com/prometheus/client_golang/prometheus"

// fileWatchMetrics registers the metrics of the policy files' watches and returns the
// source.FileOptions.OnWatch that keeps them.
func (d *daemon) fileWatchMetrics() func(watched bool) {
	unwatched := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "limiterd_policy_files_unwatched",
		Help: "Policy files whose directory is gone: their changes are not seen until it is back (their last good policies keep serving).",
	})
	losses := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "limiterd_policy_file_watch_losses_total",
		Help: "Times the directory of a policy file was deleted or moved away under its watch.",
	})
	d.metrics.Registry().MustRegister(unwatched, losses)
	return func(watched bool) {
		if watched {
			unwatched.Dec()
			return
		}
		unwatched.Inc()
		losses.Inc()
	}
}
