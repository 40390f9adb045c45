package clientbench

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

var (
	rounds = flag.Int("rounds", 0, "TestInterleaved: rounds of every client at every concurrency (0: skip)")
	calls  = flag.Int("calls", 30000, "TestInterleaved: calls per measurement")
)

type result struct{ rate, p50, p99 float64 }

// measure runs calls calls of do from concurrency goroutines.
func measure(concurrency, calls int, do func(ctx context.Context, key string) error) (result, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		lats  []time.Duration
		first error
	)
	per := max(1, calls/concurrency)
	start := time.Now()
	for g := range concurrency {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 3))
			local := make([]time.Duration, 0, per)
			var err error
			for range per {
				t0 := time.Now()
				if e := do(context.Background(), key(r)); e != nil && err == nil {
					err = e
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, local...)
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lats)
	return result{
		rate: float64(len(lats)) / elapsed.Seconds(),
		p50:  float64(lats[len(lats)/2].Microseconds()),
		p99:  float64(lats[len(lats)*99/100].Microseconds()),
	}, first
}

// TestInterleaved measures the clients in alternation, round after round, so that the load of
// a shared machine falls on all of them alike, and logs the median of each: decisions/s and
// p50/p99 latency (µs). It asserts nothing about speed.
//
//	go test -run TestInterleaved -v -args -rounds 3
func TestInterleaved(t *testing.T) {
	if *rounds == 0 {
		t.Skip("run with -args -rounds N")
	}
	src, err := readScript()
	if err != nil {
		t.Fatal(err)
	}
	ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ru.Close()
	ruScript := rueidis.NewLuaScript(src)
	gr := goredis.NewClient(&goredis.Options{Addr: addr})
	defer func() { _ = gr.Close() }()
	ap, err := gr.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	grScript := goredis.NewScript(src)
	if err := grScript.Load(context.Background(), gr).Err(); err != nil {
		t.Fatal(err)
	}
	a := goRedisArgs()
	clients := []struct {
		name string
		do   func(ctx context.Context, key string) error
	}{
		{"rueidis", func(ctx context.Context, key string) error {
			return ruScript.Exec(ctx, ru, []string{key}, args).Error()
		}},
		{"go-redis pool", func(ctx context.Context, key string) error {
			return grScript.EvalSha(ctx, gr, []string{key}, a...).Err()
		}},
		{"go-redis autopipeline", func(ctx context.Context, key string) error {
			return ap.EvalSha(ctx, grScript.Hash(), []string{key}, a...).Err()
		}},
	}
	got := make(map[string][]result)
	for round := 0; round < *rounds; round++ {
		for _, n := range concurrencies {
			for i := range clients { // each round starts with another client
				c := clients[(i+round)%len(clients)]
				r, err := measure(n, *calls, c.do)
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				k := fmt.Sprintf("%s|%d", c.name, n)
				got[k] = append(got[k], r)
			}
		}
	}
	median := func(rs []result, f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "medians of %d rounds, %d calls each:\n%-22s %7s %12s %8s %8s\n", *rounds, *calls, "client", "callers", "decisions/s", "p50 µs", "p99 µs")
	for _, n := range concurrencies {
		for _, c := range clients {
			rs := got[fmt.Sprintf("%s|%d", c.name, n)]
			fmt.Fprintf(&b, "%-22s %7d %12.0f %8.0f %8.0f\n", c.name, n,
				median(rs, func(r result) float64 { return r.rate }),
				median(rs, func(r result) float64 { return r.p50 }),
				median(rs, func(r result) float64 { return r.p99 }))
		}
	}
	t.Log(b.String())
}
