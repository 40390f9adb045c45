//go:build unix

package envoyrls

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/server"
)

var (
	benchWorkers = flag.Int("bench-workers", 16, "concurrent callers in BenchmarkGRPCvsHTTP")
	benchKeys    = flag.Int("bench-keys", 10_000, "distinct client keys in BenchmarkGRPCvsHTTP, used round-robin")
)

// BenchmarkGRPCvsHTTP measures decisions per second and latency percentiles of the gRPC
// service against the HTTP API, with the same load: -bench-workers concurrent callers making
// one decision after another over keep-alive loopback connections, for -benchtime, each
// against its own fresh engine with the same policy (per-client token buckets of 100, 100 a
// second, which admit nearly every request) and the same round-robin client keys. The HTTP
// callers use package client (one tuned transport); the gRPC callers share one ClientConn, as
// Envoy multiplexes calls on few HTTP/2 connections. Callers and servers share the machine's
// CPUs, so the figures compare the two APIs rather than measure a deployment.
func BenchmarkGRPCvsHTTP(b *testing.B) {
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 100, 100, time.Second))
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	keys := make([]string, *benchKeys)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}

	b.Run("api=grpc", func(b *testing.B) {
		e := newEngineOn(b, time.Now, p)
		ln := listenLoopback(b)
		srv := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(srv, New(e, nil))
		go func() { _ = srv.Serve(ln) }()
		b.Cleanup(srv.Stop)
		conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		c := rlsv3.NewRateLimitServiceClient(conn)
		runLoad(b, keys, func(ctx context.Context, key string) error {
			resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
				Domain: "default/api",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: key}},
				}},
			})
			if err != nil {
				return fmt.Errorf("ShouldRateLimit: %w", err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN {
				return errors.New("ShouldRateLimit answered UNKNOWN")
			}
			return nil
		})
	})

	b.Run("api=http", func(b *testing.B) {
		e := newEngineOn(b, time.Now, p)
		ln := listenLoopback(b)
		srv := &http.Server{Handler: server.NewDecisions(e, nil), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		b.Cleanup(func() { _ = srv.Close() })
		c, err := client.New("http://"+ln.Addr().String(), client.WithPolicy("default/api"))
		if err != nil {
			b.Fatal(err)
		}
		runLoad(b, keys, func(ctx context.Context, key string) error {
			_, err := c.Allow(ctx, key)
			return err
		})
	})
}

func listenLoopback(b *testing.B) net.Listener {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	return ln
}

// runLoad runs decide b.N times from -bench-workers goroutines and reports decisions per
// second, the 50th and 99th latency percentiles, and the CPU time of the process (callers and
// server together) per decision, which depends less than the others on what else the machine
// runs.
func runLoad(b *testing.B, keys []string, decide func(ctx context.Context, key string) error) {
	b.Helper()
	ctx := b.Context()
	// Warm up: open the connections and fill the engine with the keys.
	for i := range min(len(keys), 1000) {
		if err := decide(ctx, keys[i]); err != nil {
			b.Fatal(err)
		}
	}
	var (
		mu        sync.Mutex
		latencies = make([]time.Duration, 0, b.N)
		next      int
	)
	b.SetParallelism(max(1, (*benchWorkers+runtime.GOMAXPROCS(0)-1)/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		mu.Lock()
		k := next * 7919 // each worker starts elsewhere in the keys
		next++
		mu.Unlock()
		local := make([]time.Duration, 0, 1024)
		for pb.Next() {
			key := keys[k%len(keys)]
			k++
			t0 := time.Now()
			if err := decide(ctx, key); err != nil {
				b.Error(err)
				return
			}
			local = append(local, time.Since(t0))
		}
		mu.Lock()
		latencies = append(latencies, local...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	cpu := cpuTime(b) - cpu0
	b.StopTimer()
	if len(latencies) == 0 {
		return
	}
	slices.Sort(latencies)
	b.ReportMetric(float64(len(latencies))/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(percentile(latencies, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(latencies, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(latencies)), "cpu-µs/decision")
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// percentile returns the q-quantile of sorted latencies (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
