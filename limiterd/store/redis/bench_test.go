package redis

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	limiterdserver "github.com/limiterd/limiterd/limiterd/server"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// BenchmarkRedis measures decisions on one local redis-server, in one run, three ways (make
// bench-redis):
//
//   - store: Store.Decide called directly by concurrent goroutines;
//   - http: POST /v1/allow through limiterd's decisions handler and engine, over loopback TCP;
//   - http-batch-100: POST /v1/allow:batch with 100 decisions a call (one pipeline to Redis),
//     the latencies being those of a call;
//   - redis-benchmark: the server alone running the same token-bucket script (EVALSHA, same
//     arguments, random keys of the same pattern), with and without pipelining: the ceiling.
//
// Each reports decisions/s and the p50 and p99 latencies. Clients are drawn at random from
// 100,000 keys; a token bucket of 1000 tokens refilled at 1000/s keeps them all admitted. The
// load generator, limiterd and redis-server share the machine's cores.
func BenchmarkRedis(b *testing.B) {
	if err := redistest.Available(); err != nil {
		b.Skip(err)
	}
	srv, err := redistest.New()
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c, err := New(Options{Addrs: []string{srv.Addr()}, Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	rl, err := limiter.NewTokenBucket(1000, 1000, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	const keys, callers = 100_000, 64

	b.Run("store", func(b *testing.B) {
		s := c.Store("default/bench")
		measure(b, callers, func(ctx context.Context, r *rand.Rand) error {
			_, err := s.Decide(ctx, "client-"+strconv.Itoa(r.IntN(keys)), rl, time.Now(), 1)
			return err
		})
	})

	b.Run("http", func(b *testing.B) {
		e := benchEngine(b, c)
		h := httptest.NewServer(limiterdserver.NewDecisions(e, slog.New(slog.DiscardHandler)))
		defer h.Close()
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
		defer client.CloseIdleConnections()
		measure(b, callers, func(ctx context.Context, r *rand.Rand) error {
			body := `{"policy":"default/bench","key":"client-` + strconv.Itoa(r.IntN(keys)) + `"}`
			resp, err := client.Post(h.URL+"/v1/allow", "application/json", strings.NewReader(body))
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		})
	})

	b.Run("http-batch-100", func(b *testing.B) {
		const n = 100
		e := benchEngine(b, c)
		h := httptest.NewServer(limiterdserver.NewDecisions(e, slog.New(slog.DiscardHandler)))
		defer h.Close()
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
		defer client.CloseIdleConnections()
		measureN(b, callers, n, func(ctx context.Context, r *rand.Rand) error {
			var body strings.Builder
			body.WriteString(`{"items":[`)
			for i := range n {
				if i > 0 {
					body.WriteByte(',')
				}
				body.WriteString(`{"policy":"default/bench","key":"client-` + strconv.Itoa(r.IntN(keys)) + `"}`)
			}
			body.WriteString(`]}`)
			resp, err := client.Post(h.URL+"/v1/allow:batch", "application/json", strings.NewReader(body.String()))
			if err != nil {
				return err
			}
			answer, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			switch {
			case err != nil:
				return err
			case resp.StatusCode != http.StatusOK:
				return fmt.Errorf("status %d", resp.StatusCode)
			case strings.Count(string(answer), `"allowed":true`) != n:
				return fmt.Errorf("not every decision admitted: %.200s", answer)
			}
			return nil
		})
	})

	sha := srv.Do(b, "SCRIPT", "LOAD", tokenBucketSource)
	p := c.prepare(rl)
	// The key pattern of Key("default/bench", "client-N"), with %00 for the NUL byte that a
	// command line cannot carry.
	args := append([]string{"EVALSHA", sha, "1", KeyPrefix + "{default/bench%00client-__rand_int__}"},
		tokenBucketArgs(modeDecide, p, "", "", p.unit, "0")...)
	for _, pipeline := range []int{1, 16} {
		b.Run(fmt.Sprintf("redis-benchmark/P=%d", pipeline), func(b *testing.B) {
			cmd := exec.Command("redis-benchmark", append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port()),
				"-c", strconv.Itoa(callers), "-n", strconv.Itoa(max(b.N, 1000)), "-r", strconv.Itoa(keys),
				"-P", strconv.Itoa(pipeline), "--csv"}, args...)...)
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("redis-benchmark: %v\n%s", err, out)
			}
			// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
			rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
			if err != nil || len(rows) < 2 || len(rows[1]) < 7 {
				b.Fatalf("redis-benchmark printed %q: %v", out, err)
			}
			num := func(i int) float64 {
				v, err := strconv.ParseFloat(rows[1][i], 64)
				if err != nil {
					b.Fatalf("redis-benchmark column %d: %v", i, err)
				}
				return v
			}
			b.ReportMetric(num(1), "decisions/s")
			b.ReportMetric(num(4)*1000, "p50-µs")
			b.ReportMetric(num(6)*1000, "p99-µs")
		})
	}
}

// benchEngine returns an engine deciding the token-bucket policy default/bench on c.
func benchEngine(b *testing.B, c *Client) *engine.Engine {
	b.Helper()
	docs, err := v1alpha1.DecodePolicies([]byte(`apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: bench, namespace: default}
spec:
  defaultTier: standard
  tiers:
  - name: standard
    algorithm: TokenBucket
    tokenBucket: {capacity: 1000, refillRate: 1000, refillPeriod: 1s}
`))
	if err != nil {
		b.Fatal(err)
	}
	p, err := policy.Compile(&docs[0])
	if err != nil {
		b.Fatal(err)
	}
	set, err := policy.NewSet(p)
	if err != nil {
		b.Fatal(err)
	}
	e := engine.New(engine.Options{NewStore: func(id v1alpha1.PolicyID) limiter.Store { return c.Store(id.String()) }})
	e.Swap(set)
	return e
}

// measure runs b.N calls of do from callers goroutines and reports decisions/s and the p50
// and p99 latencies.
func measure(b *testing.B, callers int, do func(ctx context.Context, r *rand.Rand) error) {
	measureN(b, callers, 1, do)
}

// measureN is measure for calls of perCall decisions each: b.N decisions in b.N/perCall calls,
// the latencies being those of a call.
func measureN(b *testing.B, callers, perCall int, do func(ctx context.Context, r *rand.Rand) error) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lats = make([]time.Duration, 0, b.N)
		errs []error
	)
	per := max(1, b.N/perCall/callers)
	b.ResetTimer()
	start := time.Now()
	for g := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 42))
			local := make([]time.Duration, 0, per)
			var firstErr error
			for range per {
				t0 := time.Now()
				if err := do(b.Context(), r); err != nil && firstErr == nil {
					firstErr = err
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, local...)
			if firstErr != nil {
				errs = append(errs, firstErr)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if len(errs) > 0 {
		b.Fatalf("%d callers failed, first: %v", len(errs), errs[0])
	}
	slices.Sort(lats)
	b.ReportMetric(float64(len(lats)*perCall)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(lats[len(lats)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lats[len(lats)*99/100].Nanoseconds())/1e3, "p99-µs")
}
