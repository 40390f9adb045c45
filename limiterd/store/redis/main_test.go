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
