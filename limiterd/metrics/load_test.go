package metrics_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httptest"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/metrics"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// policyStream returns a policy file of n policies of two tiers each, with distinct parameters.
func policyStream(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `---
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: p%05d
  namespace: team
spec:
  defaultTier: free
  tiers:
    - name: free
      algorithm: TokenBucket
      tokenBucket: {capacity: %d, refillRate: 1, refillPeriod: 1s}
    - name: pro
      algorithm: SlidingWindow
      slidingWindow: {limit: 100, window: 1m}
  overrides:
    - tier: pro
      clients: [boss]
`, i, 10+i)
	}
	return b.Bytes()
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// load decodes, compiles and swaps a policy file into e, as a reload does.
func load(tb testing.TB, e *engine.Engine, data []byte) {
	tb.Helper()
	decoded, err := v1alpha1.DecodePolicies(data)
	if err != nil {
		tb.Fatal(err)
	}
	compiled := make([]*policy.Policy, len(decoded))
	for i := range decoded {
		if compiled[i], err = policy.Compile(&decoded[i]); err != nil {
			tb.Fatal(err)
		}
	}
	set, err := policy.NewSet(compiled...)
	if err != nil {
		tb.Fatal(err)
	}
	e.Swap(set)
}

// BenchmarkLoad10000Policies loads 10,000 two-tier policies from a policy file into an engine
// with metrics, decides once on each (so each has a client and its series exist), then removes
// them all. It reports the load time, the live heap each loaded policy costs, and the /metrics
// series left once they are removed.
func BenchmarkLoad10000Policies(b *testing.B) {
	const n = 10_000
	data := policyStream(n)
	for b.Loop() {
		b.StopTimer()
		m := metrics.New(limiter.NewBudget(0, 0))
		e := engine.New(engine.Options{Observer: m})
		before := liveHeap()
		b.StartTimer()
		start, cpuStart := time.Now(), cpuTime(b)
		load(b, e, data)
		elapsed, cpu := time.Since(start), cpuTime(b)-cpuStart
		b.StopTimer()
		loaded := liveHeap()
		for i := range n {
			if _, err := e.Decide(b.Context(), v1alpha1.NewPolicyID("team", fmt.Sprintf("p%05d", i)), "client", 1); err != nil {
				b.Fatal(err)
			}
		}
		decided := liveHeap()
		empty, err := policy.NewSet()
		if err != nil {
			b.Fatal(err)
		}
		e.Swap(empty)
		series := policySeries(b, m)
		b.ReportMetric(elapsed.Seconds(), "load-s")
		b.ReportMetric(cpu.Seconds(), "load-cpu-s")
		b.ReportMetric(float64(loaded-before)/(1<<20), "loaded-MB")
		b.ReportMetric(float64(loaded-before)/n, "B/policy")
		b.ReportMetric(float64(decided-loaded)/n, "B/first-client")
		b.ReportMetric(float64(series), "series-left")
		runtime.KeepAlive(e)
		b.StartTimer()
	}
}

// cpuTime returns the CPU time this process has used: on a shared machine, the load's own cost.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// policySeries returns how many /metrics series carry a policy label.
func policySeries(tb testing.TB, m *metrics.Metrics) int {
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, err := io.ReadAll(rec.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Count(string(body), `policy="`)
}
