//go:build unix

package envoyrls

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
	benchRounds  = flag.Int("bench-rounds", 3, "rounds of BenchmarkGRPCvsHTTP; each runs every target once, in turn")
)

// emptyRLS is a rate-limit service that decides nothing: it answers OK to every descriptor.
type emptyRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (emptyRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	statuses := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))
	for i := range statuses {
		statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: statuses}, nil
}

// trivialBody is what the trivial HTTP handler answers: the shape of a decision.
var trivialBody = []byte(`{"allowed":true,"limit":100,"remaining":99,"resetAfterSeconds":1,"retryAfterSeconds":0}` + "\n")

// trivialHandler reads the request body and always answers 200 with trivialBody.
func trivialHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(trivialBody)
}

// BenchmarkGRPCvsHTTP measures decisions per second and latency percentiles of the gRPC
// service and of the HTTP API, each beside its baseline, with the same load: -bench-workers
// concurrent callers making one decision after another over keep-alive loopback connections,
// for -benchtime, against
//
//   - api=grpc-empty: a grpc-go server with grpc-go's defaults and a rate-limit service that
//     answers OK to every descriptor without deciding (emptyRLS): the cost of gRPC itself;
//   - api=grpc: limiterd's service (New, with ServerOptions);
//   - api=http-trivial: an HTTP server whose handler reads the body and answers a fixed
//     decision, as make bench-http's trivial handler;
//   - api=http: limiterd's decisions API (server.NewDecisions).
//
// Each limiterd target has its own engine with the same policy (per-client token buckets of
// 100, 100 a second, which admit nearly every request) and the same round-robin client keys.
// The HTTP callers use package client (one tuned transport); the gRPC callers share one
// ClientConn, as Envoy multiplexes calls on few HTTP/2 connections. The targets run in turn,
// -bench-rounds times, so that a drifting machine load hits all alike; at the end it prints
// each API's decisions/s as a fraction of its baseline's, per round (min, median, max).
// Callers and servers share the machine's CPUs, so the figures compare the APIs with their
// baselines rather than measure a deployment.
func BenchmarkGRPCvsHTTP(b *testing.B) {
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 100, 100, time.Second))
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	keys := make([]string, *benchKeys)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}

	grpcTarget := func(service rlsv3.RateLimitServiceServer, opts ...grpc.ServerOption) func(ctx context.Context, key string) error {
		ln := listenLoopback(b)
		srv := grpc.NewServer(opts...)
		Register(srv, service)
		go func() { _ = srv.Serve(ln) }()
		b.Cleanup(srv.Stop)
		conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		c := rlsv3.NewRateLimitServiceClient(conn)
		return func(ctx context.Context, key string) error {
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
		}
	}
	httpTarget := func(h http.Handler) func(ctx context.Context, key string) error {
		ln := listenLoopback(b)
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		b.Cleanup(func() { _ = srv.Close() })
		c, err := client.New("http://"+ln.Addr().String(), client.WithPolicy("default/api"))
		if err != nil {
			b.Fatal(err)
		}
		return func(ctx context.Context, key string) error {
			_, err := c.Allow(ctx, key)
			return err
		}
	}
	targets := []struct {
		name   string
		decide func(ctx context.Context, key string) error
	}{
		{"grpc-empty", grpcTarget(emptyRLS{})},
		{"grpc", grpcTarget(New(newEngineOn(b, time.Now, p), nil), ServerOptions()...)},
		{"http-trivial", httpTarget(http.HandlerFunc(trivialHandler))},
		{"http", httpTarget(server.NewDecisions(newEngineOn(b, time.Now, p), nil))},
	}
	var grpcRatios, httpRatios, grpcCPURatios, httpCPURatios []float64
	for range max(1, *benchRounds) {
		rates := make(map[string]loadResult, len(targets))
		for _, t := range targets {
			b.Run("api="+t.name, func(b *testing.B) {
				rates[t.name] = runLoad(b, keys, t.decide) // the last run is the measured one
			})
		}
		if rates["grpc-empty"].rate > 0 && rates["http-trivial"].rate > 0 {
			grpcRatios = append(grpcRatios, rates["grpc"].rate/rates["grpc-empty"].rate)
			httpRatios = append(httpRatios, rates["http"].rate/rates["http-trivial"].rate)
			grpcCPURatios = append(grpcCPURatios, float64(rates["grpc-empty"].cpu)/float64(rates["grpc"].cpu))
			httpCPURatios = append(httpCPURatios, float64(rates["http-trivial"].cpu)/float64(rates["http"].cpu))
		}
	}
	if len(grpcRatios) > 0 {
		fmt.Printf("decisions/s as a fraction of the baseline's, per round (min median max):"+
			" grpc/grpc-empty %s, http/http-trivial %s\n", spread(grpcRatios), spread(httpRatios))
		fmt.Printf("the same from CPU time per decision (baseline's / API's; what a CPU-bound server would serve):"+
			" grpc/grpc-empty %s, http/http-trivial %s\n", spread(grpcCPURatios), spread(httpCPURatios))
	}
}

// loadResult is what runLoad measured: decisions per second, and CPU time per decision.
type loadResult struct {
	rate float64
	cpu  time.Duration
}

// spread formats the min, median and max of xs.
func spread(xs []float64) string {
	slices.Sort(xs)
	return fmt.Sprintf("%.2f %.2f %.2f", xs[0], xs[len(xs)/2], xs[len(xs)-1])
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
// second, the 50th and 99th latency percentiles, and the CPU time of the
// process (callers and server together) per decision, which depends less than the others on
// what else the machine runs; it returns the decisions per second and CPU time per decision.
func runLoad(b *testing.B, keys []string, decide func(ctx context.Context, key string) error) loadResult {
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
		return loadResult{}
	}
	slices.Sort(latencies)
	rate := float64(len(latencies)) / elapsed.Seconds()
	b.ReportMetric(rate, "decisions/s")
	b.ReportMetric(float64(percentile(latencies, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(latencies, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(latencies)), "cpu-µs/decision")
	return loadResult{rate: rate, cpu: cpu / time.Duration(len(latencies))}
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
