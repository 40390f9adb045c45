package redis

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// server is the redis-server most tests share, each with policy IDs of its own, started by the
// first test that needs it; tests that stop or pause a server start their own.
//
// A test that only decides on the shared server under policy IDs of its own, or on servers of
// its own, calls t.Parallel first: most of its time is spent waiting for Redis (round trips, keys
// expiring, servers starting), and the waits overlap. Go runs the parallel tests only after every
// other test has ended, so a test runs alone that changes what every client shares
// (rebaseThreshold, SCRIPT FLUSH on the shared server), reads the shared server's counters (INFO
// commandstats) or counts every reset message a client receives, looks for leaked goroutines
// (goleak), or bounds how long a decision may take (the breaker, outage, failover, stall,
// eviction and large-batch tests).
var server struct {
	once sync.Once
	srv  *redistest.Server
	err  error
}

func TestMain(m *testing.M) {
	if store := os.Getenv(benchServerEnv); store != "" { // the decisions server of benchHTTPProcess
		os.Exit(serveBench(store))
	}
	code := m.Run()
	if server.srv != nil {
		server.srv.Close()
	}
	os.Exit(code)
}

// shared returns the shared redis-server.
func shared(t *testing.T) *redistest.Server {
	t.Helper()
	redistest.Require(t)
	server.once.Do(func() { server.srv, server.err = redistest.New() })
	if server.err != nil {
		t.Fatal(fmt.Errorf("shared redis-server: %w", server.err))
	}
	return server.srv
}
