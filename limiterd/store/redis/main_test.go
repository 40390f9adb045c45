package redis

import (
	"fmt"
	"os"
	"testing"

	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// server is the redis-server most tests share, each with policy IDs of its own; tests that stop
// or pause a server start their own.
var (
	server    *redistest.Server
	serverErr error
)

func TestMain(m *testing.M) {
	if serverErr = redistest.Available(); serverErr == nil {
		server, serverErr = redistest.New()
	}
	code := m.Run()
	if server != nil {
		server.Close()
	}
	os.Exit(code)
}

// shared returns the shared redis-server.
func shared(t *testing.T) *redistest.Server {
	t.Helper()
	redistest.Require(t)
	if server == nil {
		t.Fatal(fmt.Errorf("shared redis-server: %w", serverErr))
	}
	return server
}
