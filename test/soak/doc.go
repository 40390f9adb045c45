// Package soak holds limiterd's soak test, which stays out of `go test ./...` and `make test`:
// its files build only with the soak tag. Run it with `make soak` (SOAK_DURATION, default 5m),
// which builds bin/limiterd first and passes it in LIMITERD_BIN.
//
// For the whole duration, against real limiterd processes on loopback, it runs at once:
//
//   - a key flood (distinct keys of up to 1,000 bytes) next to steady clients, on a replica
//     with the in-memory store and a --max-clients bound;
//   - policy churn on that replica: 1,000 policies added to and removed from a policy file in a
//     loop, with new names each cycle;
//   - Redis faults under a replica with the Redis store: the redis-server it started is killed
//     (SIGKILL, then restarted empty) and paused (SIGSTOP, then SIGCONT) in turn, under steady
//     load on policies with failure modes Open, Closed and Local;
//   - SIGTERM under keep-alive load, on a fresh replica about once a minute, and on the two
//     long-lived replicas at the end.
//
// It asserts that limiterd_tracked_clients and limiterd_tracked_client_bytes never exceed
// --max-clients and --max-client-bytes, that RSS stays under
// SOAK_RSS_BUDGET_MB (default 256), that go_goroutines does not grow, and that no request fails
// outside the documented failure modes: a decision answers 200 or 429 with a JSON body, a 429
// only where a limit or failureMode Closed (while Redis is away) says so, /readyz stays 200
// until SIGTERM, and a replica serves through --shutdown-delay after SIGTERM and exits 0. It
// logs its figures at the end.
package soak
