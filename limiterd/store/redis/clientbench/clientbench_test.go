// Package clientbench compares the Redis clients limiterd could use, go-redis and rueidis, on
// the work limiterd gives them: many goroutines each running the decision script of one token
// bucket (EVALSHA, server clock; testdata/tokenbucket.json, written by the redis package's
// TestClientbenchScriptCurrent) on random client keys, against one local redis-server. It is a module of its
// own so that the client not chosen stays out of limiterd's dependencies.
//
//	cd limiterd/store/redis/clientbench && go test -run '^$' -bench . -benchtime 200000x
package clientbench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

var addr string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if _, err := exec.LookPath("redis-server"); err != nil {
		fmt.Fprintln(os.Stderr, "clientbench: redis-server not found; install redis-server")
		return 1
	}
	dir, err := os.MkdirTemp("", "clientbench")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	addr = "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "redis-server did not start:", err)
			return 1
		}
		time.Sleep(20 * time.Millisecond)
	}
	return m.Run()
}

// script is limiterd's decision script for one token bucket.
func script(b *testing.B) string {
	src, err := readScript()
	if err != nil {
		b.Fatal(err)
	}
	return src
}

// decision is the script and arguments of a decision of one token bucket, which the redis
// package writes (TestClientbenchScriptCurrent keeps it current).
var decision, decisionErr = readDecision()

type decisionFile struct {
	Script string   `json:"script"`
	Args   []string `json:"args"`
}

func readDecision() (d decisionFile, err error) {
	src, err := os.ReadFile(filepath.Join("testdata", "tokenbucket.json"))
	if err == nil {
		err = json.Unmarshal(src, &d)
	}
	return d, err
}

func readScript() (string, error) { return decision.Script, decisionErr }

// args are the script's arguments for a bucket of 100 tokens refilled at 100/s, cost 1, on the
// server's clock.
var args = decision.Args

const keys = 100_000

func key(r *rand.Rand) string {
	return "limiterd:{bench/policy\x00client-" + strconv.Itoa(r.IntN(keys)) + "}"
}

// bench runs concurrency goroutines calling do, b.N calls in all, and reports decisions/s and
// the latency percentiles.
func bench(b *testing.B, concurrency int, do func(ctx context.Context, key string) error) {
	ctx := context.Background()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		lats []time.Duration
		errs int
	)
	per := max(1, b.N/concurrency)
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < concurrency; g++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 1))
			local := make([]time.Duration, 0, per)
			bad := 0
			for i := 0; i < per; i++ {
				t0 := time.Now()
				if err := do(ctx, key(r)); err != nil {
					bad++
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, local...)
			errs += bad
			mu.Unlock()
		}(uint64(g))
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if errs > 0 {
		b.Fatalf("%d calls failed", errs)
	}
	slices.Sort(lats)
	b.ReportMetric(float64(len(lats))/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(lats[len(lats)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-µs")
}

var concurrencies = []int{1, 16, 64, 256}

func BenchmarkRueidis(b *testing.B) {
	benchRueidis(b, rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
}

// BenchmarkRueidisFlushDelay lets rueidis wait up to 20µs after each flush for more commands:
// fewer, larger writes.
func BenchmarkRueidisFlushDelay(b *testing.B) {
	benchRueidis(b, rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, MaxFlushDelay: 20 * time.Microsecond})
}

func benchRueidis(b *testing.B, opts rueidis.ClientOption) {
	c, err := rueidis.NewClient(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s := rueidis.NewLuaScript(script(b))
	for _, n := range concurrencies {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			bench(b, n, func(ctx context.Context, key string) error {
				return s.Exec(ctx, c, []string{key}, args).Error()
			})
		})
	}
}

func goRedisArgs() []any {
	a := make([]any, len(args))
	for i, v := range args {
		a[i] = v
	}
	return a
}

func BenchmarkGoRedisPool(b *testing.B) {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer func() { _ = c.Close() }()
	s := goredis.NewScript(script(b))
	a := goRedisArgs()
	for _, n := range concurrencies {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			bench(b, n, func(ctx context.Context, key string) error {
				return s.Run(ctx, c, []string{key}, a...).Err()
			})
		})
	}
}

func BenchmarkGoRedisAutoPipeline(b *testing.B) {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer func() { _ = c.Close() }()
	ap, err := c.AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	s := goredis.NewScript(script(b))
	if err := s.Load(context.Background(), c).Err(); err != nil {
		b.Fatal(err)
	}
	a := goRedisArgs()
	for _, n := range concurrencies {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			bench(b, n, func(ctx context.Context, key string) error {
				return ap.EvalSha(ctx, s.Hash(), []string{key}, a...).Err()
			})
		})
	}
}
