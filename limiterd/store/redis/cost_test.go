package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// costLogEntries is the number of entries in each sliding window's log when BenchmarkRedisCost
// starts deciding on it: the log the bound is stated for.
const costLogEntries = 3000

// BenchmarkRedisCost measures what a decision costs the Redis server, for each algorithm and
// for stacks of two, in one run on a redis-server of its own (make bench-redis): beside
// decisions/s and the latencies (measure), the server's CPU (used_cpu_sys + used_cpu_user of
// INFO cpu) and the commands it ran (INFO commandstats, which counts the calls a script makes)
// per decision, over the run, and each command's calls per decision (<command>/decision), so
// that the commands a decision spends are visible.
//
// Decisions go through Store.Decide, as limiterd makes them (the server's clock, the default
// MaxFlushDelay), from 64 goroutines on 100 clients, every one admitted: a token bucket and a
// quota far from empty, and a sliding window whose log holds costLogEntries entries, one unit a
// millisecond within the last seconds, in a window of an hour (each decision adds one; the run's
// 50,000 decisions add about 500 a client). The load generator, limiterd and redis-server share
// the machine's cores, so decisions/s is what they reach together; the Redis figures are the
// server's alone.
func BenchmarkRedisCost(b *testing.B) {
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
	tb, err := limiter.NewTokenBucket(limiter.MaxCapacity, limiter.MaxCapacity, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	sw, err := limiter.NewSlidingWindow(limiter.MaxWindowLimit, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	qt, err := limiter.NewQuota(limiter.MaxQuotaLimit, limiter.PeriodDay, time.UTC)
	if err != nil {
		b.Fatal(err)
	}
	const callers = 64
	runs := 0
	for _, tc := range []struct {
		name string
		st   *limiter.Stack
	}{
		{"token-bucket", limitertest.One(tb)},
		{"sliding-window-log-3000", limitertest.One(sw)},
		{"quota", limitertest.One(qt)},
		{"stack/token-bucket+sliding-window-log-3000", limitertest.Stack("rate", tb, "log", sw)},
		{"stack/token-bucket+quota", limitertest.Stack("rate", tb, "day", qt)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			runs++ // each run on clients of its own: the logs start at costLogEntries
			s := c.Store(fmt.Sprintf("default/cost-%d", runs))
			keys := min(100, b.N) // -benchtime 1x (make test) seeds one log
			seedCostClients(b, c, s, tc.st, keys)
			before := redisCost(b, c)
			decisions := 0
			measure(b, callers, func(ctx context.Context, r *rand.Rand) error {
				d, err := s.Decide(ctx, "client-"+strconv.Itoa(r.IntN(keys)), tc.st, time.Now(), 1, nil)
				if err == nil && !d.Allowed {
					err = fmt.Errorf("rejected: %+v", d)
				}
				return err
			}, func(n int) { decisions = n })
			after := redisCost(b, c)
			per := float64(decisions)
			b.ReportMetric((after.cpu-before.cpu)*1e6/per, "redis-cpu-µs/decision")
			total := 0
			var names []string
			for name, calls := range after.calls {
				if d := calls - before.calls[name]; d > 0 && name != "info" {
					total += d
					names = append(names, name)
				}
			}
			b.ReportMetric(float64(total)/per, "redis-cmds/decision")
			slices.Sort(names)
			for _, name := range names {
				b.ReportMetric(float64(after.calls[name]-before.calls[name])/per, name+"/decision")
			}
		})
	}
}

// seedCostClients readies clients client-0 to client-<keys-1> of s for BenchmarkRedisCost: each
// sliding window of st gets a log of costLogEntries entries within the last few seconds, and a
// peek on client-0 loads the script and checks that it reads the log so.
func seedCostClients(b *testing.B, c *Client, s *Store, st *limiter.Stack, keys int) {
	b.Helper()
	from := time.Now().Add(-5 * time.Second)
	for i := range st.Len() {
		sw, ok := st.Limiter(i).(*limiter.SlidingWindow)
		if !ok {
			continue
		}
		for k := range keys {
			writeLog(b, c, s.key("client-"+strconv.Itoa(k))+limitSuffix(st.Name(i)), sw, from, costLogEntries)
		}
	}
	out := make([]limiter.Decision, st.Len())
	if _, err := s.Decide(b.Context(), "client-0", st, time.Now(), 0, out); err != nil {
		b.Fatal(err)
	}
	for i, d := range out {
		want := d.Limit
		if st.Limiter(i).Algorithm() == limiter.AlgorithmSlidingWindow {
			want -= costLogEntries
		}
		if d.Remaining != want {
			b.Fatalf("limit %s of client-0 has %d remaining before the run, want %d", st.Name(i), d.Remaining, want)
		}
	}
}

// redisFigures are the server's counters that BenchmarkRedisCost takes the difference of.
type redisFigures struct {
	cpu   float64        // used_cpu_sys + used_cpu_user, in seconds
	calls map[string]int // calls by command (lower case, "config|resetstat" for a subcommand)
}

// redisCost reads the server's CPU time and its calls by command (INFO cpu and commandstats).
func redisCost(b *testing.B, c *Client) redisFigures {
	b.Helper()
	cn, err := c.get()
	if err != nil {
		b.Fatal(err)
	}
	info, err := cn.Do(b.Context(), cn.B().Arbitrary("INFO").Args("cpu", "commandstats").Build()).ToString()
	if err != nil {
		b.Fatalf("INFO: %v", err)
	}
	f := redisFigures{calls: map[string]int{}}
	var sys, user bool
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case name == "used_cpu_sys" || name == "used_cpu_user":
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				b.Fatalf("INFO %s: %v", line, err)
			}
			f.cpu += v
			sys, user = sys || name == "used_cpu_sys", user || name == "used_cpu_user"
		case strings.HasPrefix(name, "cmdstat_"):
			calls, _, _ := strings.Cut(strings.TrimPrefix(value, "calls="), ",")
			n, err := strconv.Atoi(calls)
			if err != nil {
				b.Fatalf("INFO %s: %v", line, err)
			}
			f.calls[strings.TrimPrefix(name, "cmdstat_")] = n
		}
	}
	if !sys || !user || len(f.calls) == 0 {
		b.Fatalf("INFO cpu commandstats lacks the server's CPU time or its calls:\n%s", info)
	}
	return f
}
