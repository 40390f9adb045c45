package redis

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/policy"
	limiterdserver "github.com/limiterd/limiterd/limiterd/server"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// BenchmarkRedis measures decisions on one local redis-server, in one run, several ways (make
// bench-redis):
//
//   - store: Store.Decide called directly by concurrent goroutines, with limiterd's default
//     MaxFlushDelay; store-no-flush-delay: the same without it; store-memory: the same calls on
//     the memory store, so that the CPU the Redis path adds per decision is the difference;
//   - http: POST /v1/allow through limiterd's decisions handler and engine, over loopback TCP;
//     http-memory: the same on the memory store;
//   - http-batch-100: POST /v1/allow:batch with 100 decisions a call (one pipeline to Redis),
//     the latencies being those of a call;
//   - redis-benchmark: the server alone running the same token-bucket script (EVALSHA, same
//     arguments, random keys of the same pattern), with and without pipelining: the ceiling.
//
// Each reports decisions/s, the p50 and p99 latencies and this process's CPU per decision (for
// the http ones it includes the load generator's). Clients are drawn at random from
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
	c, err := New(Options{Addrs: []string{srv.Addr()}, Timeout: 5 * time.Second, MaxFlushDelay: DefaultMaxFlushDelay, Logger: benchLogger})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	unbatched, err := New(Options{Addrs: []string{srv.Addr()}, Timeout: 5 * time.Second, Logger: benchLogger})
	if err != nil {
		b.Fatal(err)
	}
	defer unbatched.Close()
	rl, err := limiter.NewTokenBucket(1000, 1000, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	st := limitertest.One(rl) // a tier of one limit, built once as policy.Compile does
	const keys, callers = 100_000, 64

	for _, store := range []struct {
		name string
		s    limiter.Store
	}{
		{"store", c.Store("default/bench")},
		{"store-no-flush-delay", unbatched.Store("default/bench")},
		{"store-memory", limiter.NewMemory(nil)},
	} {
		b.Run(store.name, func(b *testing.B) {
			measure(b, callers, func(ctx context.Context, r *rand.Rand) error {
				_, err := store.s.Decide(ctx, "client-"+strconv.Itoa(r.IntN(keys)), st, time.Now(), 1, nil)
				return err
			})
		})
	}

	for _, server := range []struct{ name, store string }{{"http", srv.Addr()}, {"http-memory", "memory"}} {
		b.Run(server.name, func(b *testing.B) { benchHTTPProcess(b, server.store, callers, keys) })
	}

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

	// A single decision's call, on the key pattern of Key("default/bench", "client-N"), with
	// %00 for the NUL byte that a command line cannot carry.
	call := c.Store("default/bench").newCall("", limitertest.One(rl), time.Time{}, 1, modeDecide)
	sha := srv.Do(b, "SCRIPT", "LOAD", decideScripts.of(call).source)
	args := append([]string{"EVALSHA", sha, "1", KeyPrefix + "{default/bench%00client-__rand_int__}"},
		c.Store("default/bench").callArgs(call)...)
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

// benchServerEnv makes the test binary a limiterd decisions server for benchHTTPProcess instead
// of running tests: "memory" for the memory store, or the address of a redis-server.
const benchServerEnv = "LIMITERD_BENCH_SERVER"

// benchHTTPProcess measures single decisions through POST /v1/allow, over loopback TCP, on a
// decisions server that runs as a process of its own (this test binary, see serveBench) on store
// ("memory" or a Redis address), as limiterd runs. Besides measure's figures it reports the
// server's own CPU per decision, read from the process's rusage when it exits.
func benchHTTPProcess(b *testing.B, store string, callers, keys int) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchServerEnv+"="+store)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var addr string
	if _, err := fmt.Fscanln(stdout, &addr); err != nil {
		_ = cmd.Process.Kill()
		b.Fatalf("the decisions server printed no address: %v", err)
	}
	url := "http://" + addr + "/v1/allow"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	defer client.CloseIdleConnections()
	decisions := 0
	measure(b, callers, func(ctx context.Context, r *rand.Rand) error {
		body := `{"policy":"default/bench","key":"client-` + strconv.Itoa(r.IntN(keys)) + `"}`
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}, func(n int) { decisions = n })
	_ = stdin.Close() // the server exits when its stdin closes
	if err := cmd.Wait(); err != nil {
		b.Fatalf("decisions server: %v", err)
	}
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(decisions), "server-cpu-µs/decision")
}

// benchLogger logs the benchmark's clients' errors only: the warning about the test server's
// memory settings (maxmemory 0) would cut the benchmark's lines, which share the output.
var benchLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// serveBench is the decisions server of benchHTTPProcess: it prints its address, serves until
// its stdin closes, and returns the exit code.
func serveBench(store string) int {
	var c *Client
	if store != "memory" {
		var err error
		if c, err = New(Options{Addrs: []string{store}, Timeout: 5 * time.Second, MaxFlushDelay: DefaultMaxFlushDelay, Logger: benchLogger}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer c.Close()
	}
	e, err := newBenchEngine(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := &http.Server{Handler: limiterdserver.NewDecisions(e, slog.New(slog.DiscardHandler)), ReadHeaderTimeout: time.Minute}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	return 0
}

// benchEngine returns an engine deciding the token-bucket policy default/bench on c, or on its
// memory stores when c is nil.
func benchEngine(b *testing.B, c *Client) *engine.Engine {
	b.Helper()
	e, err := newBenchEngine(c)
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// newBenchEngine is benchEngine without a testing.B.
func newBenchEngine(c *Client) (*engine.Engine, error) {
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
		return nil, fmt.Errorf("bench policy: %w", err)
	}
	p, err := policy.Compile(&docs[0])
	if err != nil {
		return nil, fmt.Errorf("bench policy: %w", err)
	}
	set, err := policy.NewSet(p)
	if err != nil {
		return nil, fmt.Errorf("bench policy: %w", err)
	}
	var opts engine.Options
	if c != nil {
		opts.NewStore = func(id v1alpha1.PolicyID) limiter.Store { return c.Store(id.String()) }
	}
	e := engine.New(opts)
	e.Swap(set)
	return e, nil
}

// measure runs b.N calls of do from callers goroutines and reports decisions/s, the p50 and p99
// latencies, and the CPU time this process spent per decision (user and system; redis-server
// is another process, so for store and store-memory it is limiterd's own CPU).
func measure(b *testing.B, callers int, do func(ctx context.Context, r *rand.Rand) error, counted ...func(decisions int)) {
	measureN(b, callers, 1, do, counted...)
}

// measureN is measure for calls of perCall decisions each: b.N decisions in b.N/perCall calls,
// the latencies being those of a call.
func measureN(b *testing.B, callers, perCall int, do func(ctx context.Context, r *rand.Rand) error, counted ...func(decisions int)) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lats = make([]time.Duration, 0, b.N)
		errs []error
	)
	per := max(1, b.N/perCall/callers)
	b.ResetTimer()
	cpu0 := processCPU(b)
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
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	if len(errs) > 0 {
		b.Fatalf("%d callers failed, first: %v", len(errs), errs[0])
	}
	slices.Sort(lats)
	b.ReportMetric(float64(len(lats)*perCall)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(lats[len(lats)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lats[len(lats)*99/100].Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(len(lats)*perCall), "cpu-µs/decision")
	for _, f := range counted {
		f(len(lats) * perCall)
	}
}

// processCPU returns the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
