//go:build soak

package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// The soak's fixed parameters.
const (
	maxClients      = 100_000         // --max-clients of the memory replica
	maxClientBytes  = 48 << 20        // --max-client-bytes of the memory replica
	churnPolicies   = 1_000           // policies added and removed per churn cycle
	shutdownDelay   = 3 * time.Second // --shutdown-delay
	shutdownTimeout = 10 * time.Second
	faultLength     = 3 * time.Second  // how long Redis stays killed or paused
	faultRecovery   = 5 * time.Second  // after it is back, until Closed may no longer reject
	faultInterval   = 20 * time.Second // between the starts of two Redis faults
	sigtermInterval = time.Minute      // between two SIGTERM checks on a fresh replica
	goroutineSlack  = 15               // go_goroutines a replica may end with above its start

	// memWorkers is how many decisions the memory replica has in flight at most (flood and
	// victim). The budget is exceeded, between a new client's insertion and its reclaim, by at
	// most one client per decision in flight (docs/architecture.md): a key of up to 1,024 bytes
	// and its state (a token-bucket slot, or a sliding window's 128 bytes and its log).
	memWorkers    = 6
	inFlightBytes = memWorkers * (1024 + 256)
)

// settings are what the environment says.
type settings struct {
	bin       string
	duration  time.Duration
	rssBudget int64 // bytes
}

func readSettings(t *testing.T) settings {
	t.Helper()
	s := settings{bin: os.Getenv("LIMITERD_BIN"), duration: 5 * time.Minute, rssBudget: 256 << 20}
	if s.bin == "" {
		t.Fatal("LIMITERD_BIN is not set: run the soak test with make soak, which builds bin/limiterd")
	}
	if _, err := os.Stat(s.bin); err != nil {
		t.Fatalf("LIMITERD_BIN: %v", err)
	}
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute {
			t.Fatalf("SOAK_DURATION=%q: want a duration of at least 1m", v)
		}
		s.duration = d
	}
	if v := os.Getenv("SOAK_RSS_BUDGET_MB"); v != "" {
		mb, err := strconv.ParseInt(v, 10, 64)
		if err != nil || mb <= 0 {
			t.Fatalf("SOAK_RSS_BUDGET_MB=%q: want a positive integer", v)
		}
		s.rssBudget = mb << 20
	}
	return s
}

func tokenBucketPolicy(name, failureMode string, capacity, rate int64, period string) string {
	fm := ""
	if failureMode != "" {
		fm = "\n  failureMode: " + failureMode
	}
	return fmt.Sprintf(`apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: %s
spec:
  defaultTier: standard%s
  tiers:
  - name: standard
    algorithm: TokenBucket
    tokenBucket: {capacity: %d, refillRate: %d, refillPeriod: %s}
`, name, fm, capacity, rate, period)
}

func writeFile(t *testing.T, path string, docs ...string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Error(err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Error(err)
	}
}

// failures collects requests that failed outside the documented failure modes, and keeps the
// first few for the report.
type failures struct {
	n     atomic.Int64
	mu    sync.Mutex
	first []string
}

func (f *failures) add(format string, args ...any) {
	f.n.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.first) < 20 {
		f.first = append(f.first, time.Now().UTC().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
}

// stream counts the answers of one kind of request.
type stream struct {
	name                string
	sent, ok, rejected  atomic.Int64
	documentedRejection atomic.Int64 // 429s by failureMode Closed while Redis was away
}

// judge says whether an answer is one the documentation allows; documented reports a 429 that
// only a failure mode explains.
type judge func(status int) (ok, documented bool)

func limitOrOK(status int) (bool, bool) {
	return status == http.StatusOK || status == http.StatusTooManyRequests, false
}

// load sends decisions for keys from next to p from workers goroutines until ctx is done.
func load(ctx context.Context, wg *sync.WaitGroup, p *proc, s *stream, f *failures, workers int, policy string,
	next func(r *rand.Rand) string, judge judge) {
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				status, body, err := p.allow(ctx, policy, next(r))
				if ctx.Err() != nil {
					return // stopped mid-request: not an answer
				}
				s.sent.Add(1)
				if err != nil {
					f.add("%s %s: %v", p.name, s.name, err)
					continue
				}
				good, documented := judge(status)
				switch {
				case !good:
					f.add("%s %s: status %d %v", p.name, s.name, status, body)
				case documented:
					s.documentedRejection.Add(1)
				case status == http.StatusOK:
					s.ok.Add(1)
				default:
					s.rejected.Add(1)
				}
			}
		})
	}
}

// sample is one reading of a long-lived replica.
type sample struct {
	at         time.Time
	rss        int64
	tracked    float64
	bytes      float64 // limiterd_tracked_client_bytes
	goroutines float64
}

// watch samples p every 2s, and checks /readyz every second, until ctx is done.
func watch(ctx context.Context, wg *sync.WaitGroup, p *proc, f *failures, samples *[]sample, mu *sync.Mutex) {
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if status, err := p.readyz(); err != nil || status != http.StatusOK {
				f.add("%s /readyz before SIGTERM: %d %v", p.name, status, err)
			}
			if i%2 == 1 {
				continue
			}
			rss, err := p.rssBytes()
			m, err2 := p.metrics()
			if err = errors.Join(err, err2); err != nil {
				f.add("%s: sample: %v", p.name, err)
				continue
			}
			mu.Lock()
			*samples = append(*samples, sample{at: time.Now(), rss: rss, tracked: m["limiterd_tracked_clients"],
				bytes: m["limiterd_tracked_client_bytes"], goroutines: m["go_goroutines"]})
			mu.Unlock()
		}
	})
}

// quietGoroutines closes the client's idle connections and reads go_goroutines once the
// replica has let them go.
func quietGoroutines(p *proc) (float64, error) {
	p.transport.CloseIdleConnections()
	time.Sleep(2 * time.Second)
	m, err := p.metrics()
	p.transport.CloseIdleConnections()
	if err != nil {
		return 0, err
	}
	return m["go_goroutines"], nil
}

// shutdownResult is what one SIGTERM under load showed.
type shutdownResult struct {
	name             string
	servedDuring     int64 // decisions answered between SIGTERM and the end of the delay
	failedDuring     int64
	readyzAfter      int // /readyz status shortly after SIGTERM
	exitCode         int
	exitAfter        time.Duration
	delaySupported   bool
	firstFailureNote string
}

// sigtermUnderLoad sends SIGTERM to p while workers keep deciding on policy over keep-alive
// connections, for the shutdown delay (minus a margin), and checks that none of those requests
// fails, that /readyz turns 503 at once, and that p exits 0.
func sigtermUnderLoad(p *proc, policy string, workers int, delaySupported bool) shutdownResult {
	res := shutdownResult{name: p.name, delaySupported: delaySupported}
	var served, failed atomic.Int64
	var note atomic.Pointer[string]
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	counting := atomic.Bool{}
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				status, _, err := p.allow(ctx, policy, fmt.Sprintf("sigterm-%d-%d", w, i%50))
				if ctx.Err() != nil || !counting.Load() {
					continue
				}
				if err != nil || (status != http.StatusOK && status != http.StatusTooManyRequests) {
					failed.Add(1)
					msg := fmt.Sprintf("status %d, %v", status, err)
					note.CompareAndSwap(nil, &msg)
					continue
				}
				served.Add(1)
			}
		})
	}
	time.Sleep(time.Second) // connections open and kept alive
	counting.Store(true)
	sent := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond)
	res.readyzAfter, _ = p.readyz()
	time.Sleep(shutdownDelay - 300*time.Millisecond - 500*time.Millisecond)
	counting.Store(false)
	cancel()
	wg.Wait()
	res.servedDuring, res.failedDuring = served.Load(), failed.Load()
	if n := note.Load(); n != nil {
		res.firstFailureNote = *n
	}
	code, err := p.exit(shutdownDelay + shutdownTimeout + 20*time.Second)
	if err != nil {
		_ = p.cmd.Process.Kill()
		code, _ = p.exit(10 * time.Second)
	}
	res.exitCode, res.exitAfter = code, time.Since(sent)
	return res
}

func (r shutdownResult) check(t *testing.T) {
	t.Helper()
	if r.failedDuring > 0 {
		t.Errorf("%s: %d of %d decisions failed during --shutdown-delay after SIGTERM (first: %s)",
			r.name, r.failedDuring, r.failedDuring+r.servedDuring, r.firstFailureNote)
	}
	if r.readyzAfter != http.StatusServiceUnavailable {
		t.Errorf("%s: /readyz answered %d 300ms after SIGTERM, want 503", r.name, r.readyzAfter)
	}
	if r.exitCode != 0 {
		t.Errorf("%s: exit code %d after SIGTERM, want 0", r.name, r.exitCode)
	}
}

// supportsShutdownDelay reports whether the binary has --shutdown-delay.
func supportsShutdownDelay(bin string) bool {
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	return strings.Contains(string(out), "-shutdown-delay")
}

func TestSoak(t *testing.T) {
	set := readSettings(t)
	redistest.Require(t)
	dir := t.TempDir()
	delayOK := supportsShutdownDelay(set.bin)
	if !delayOK {
		t.Errorf("%s has no --shutdown-delay: SIGTERM closes the listeners at once", set.bin)
	}
	shutdownArgs := []string{"--shutdown-timeout", shutdownTimeout.String()}
	if delayOK {
		shutdownArgs = append(shutdownArgs, "--shutdown-delay", shutdownDelay.String())
	}

	// The memory replica: flood, victims and churn.
	base := filepath.Join(dir, "base.yaml")
	writeFile(t, base,
		tokenBucketPolicy("flood", "", 5, 1, "1h"),
		tokenBucketPolicy("victim", "", 20, 10, "1s"))
	churn := filepath.Join(dir, "churn.yaml")
	anchor := tokenBucketPolicy("churn-anchor", "", 10, 1, "1s")
	writeFile(t, churn, anchor)
	mem := startProc(t, set.bin, "memory", append([]string{"--policy-file", base, "--policy-file", churn,
		"--max-clients", strconv.Itoa(maxClients), "--max-client-bytes", strconv.Itoa(maxClientBytes),
		"--sweep-interval", "1s"}, shutdownArgs...)...)

	// The Redis replica: failure modes under faults.
	srv := redistest.Start(t)
	redisPolicies := filepath.Join(dir, "redis.yaml")
	writeFile(t, redisPolicies,
		tokenBucketPolicy("open", "Open", 1_000_000, 1_000_000, "1s"),
		tokenBucketPolicy("closed", "Closed", 1_000_000, 1_000_000, "1s"),
		tokenBucketPolicy("local", "Local", 1_000_000, 1_000_000, "1s"))
	red := startProc(t, set.bin, "redis", append([]string{"--policy-file", redisPolicies, "--store", "redis",
		"--redis-addr", srv.Addr(), "--store-timeout", "50ms", "--redis-local-reject-cache", "1000"}, shutdownArgs...)...)

	goroutinesStart := map[string]float64{}
	for _, p := range []*proc{mem, red} {
		g, err := quietGoroutines(p)
		if err != nil {
			t.Fatal(err)
		}
		goroutinesStart[p.name] = g
	}

	var (
		f                      failures
		wg, watchers           sync.WaitGroup
		samplesMu              sync.Mutex
		memSamples, redSamples []sample
		faulted                atomic.Bool // Redis away, or back less than faultRecovery ago
		closedOutsideFaults    atomic.Int64
	)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	watchCtx, stopWatching := context.WithCancel(t.Context())
	defer stopWatching()
	watch(watchCtx, &watchers, mem, &f, &memSamples, &samplesMu)
	watch(watchCtx, &watchers, red, &f, &redSamples, &samplesMu)

	// Key flood: distinct keys of 16 to 1,000 bytes.
	var floodSeq atomic.Int64
	flood := &stream{name: "flood"}
	load(ctx, &wg, mem, flood, &f, memWorkers-2, "default/flood", func(r *rand.Rand) string {
		n := floodSeq.Add(1)
		k := strconv.FormatInt(n, 36) + "-"
		return k + strings.Repeat("k", 16+r.IntN(985)-len(k))
	}, limitOrOK)
	victim := &stream{name: "victim"}
	load(ctx, &wg, mem, victim, &f, 2, "default/victim", func(r *rand.Rand) string {
		return "victim-" + strconv.Itoa(r.IntN(200))
	}, limitOrOK)

	// Failure modes: Open and Local always admit (their limit is out of reach), Closed rejects
	// only while Redis is away.
	streams := map[string]*stream{}
	for _, mode := range []string{"open", "closed", "local"} {
		s := &stream{name: mode}
		streams[mode] = s
		j := func(status int) (bool, bool) { return status == http.StatusOK, false }
		if mode == "closed" {
			// Its limit is out of reach: a 429 is failureMode Closed, documented when the store
			// failed (Redis away, or a decision past --store-timeout): checked at the end against
			// limiterd_store_errors_total.
			j = func(status int) (bool, bool) {
				if status == http.StatusTooManyRequests {
					if !faulted.Load() {
						closedOutsideFaults.Add(1)
					}
					return true, true
				}
				return status == http.StatusOK, false
			}
		}
		load(ctx, &wg, red, s, &f, 2, "default/"+mode, func(r *rand.Rand) string {
			return mode + "-" + strconv.Itoa(r.IntN(50))
		}, j)
	}

	// Policy churn.
	var churnCycles atomic.Int64
	var churnApply, churnRemove []time.Duration
	var churnMu sync.Mutex
	wg.Go(func() {
		for cycle := 0; ctx.Err() == nil; cycle++ {
			docs := []string{anchor}
			for i := range churnPolicies {
				docs = append(docs, tokenBucketPolicy(fmt.Sprintf("churn-c%d-%d", cycle, i), "", 10, 1, "1s"))
			}
			last := fmt.Sprintf("default/churn-c%d-%d", cycle, churnPolicies-1)
			start := time.Now()
			writeFile(t, churn, docs...)
			if !waitStatus(ctx, mem, last, http.StatusOK, &f) {
				return
			}
			applied := time.Since(start)
			for i := range 20 { // state and metric series in a few of them
				_, _, _ = mem.allow(ctx, fmt.Sprintf("default/churn-c%d-%d", cycle, i*37), "churn-client")
			}
			start = time.Now()
			writeFile(t, churn, anchor)
			if !waitStatus(ctx, mem, last, http.StatusNotFound, &f) {
				return
			}
			churnMu.Lock()
			churnApply, churnRemove = append(churnApply, applied), append(churnRemove, time.Since(start))
			churnMu.Unlock()
			churnCycles.Add(1)
		}
	})

	// Redis faults: SIGKILL (restarted empty) and SIGSTOP (continued), in turn.
	type faultFigure struct {
		kind      string
		at        time.Time
		decisions int64 // answered on the Redis replica while Redis was away
		length    time.Duration
	}
	var faults []faultFigure
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(faultInterval - faultLength - faultRecovery):
			}
			kind := "kill"
			if i%2 == 1 {
				kind = "pause"
			}
			before := totalSent(streams)
			faulted.Store(true)
			start := time.Now()
			if kind == "kill" {
				srv.Stop()
			} else {
				srv.Pause(t)
			}
			time.Sleep(faultLength)
			answered := totalSent(streams) - before
			length := time.Since(start)
			if kind == "kill" {
				srv.Restart(t)
			} else {
				srv.Resume(t)
			}
			faults = append(faults, faultFigure{kind, start, answered, length})
			time.Sleep(faultRecovery)
			faulted.Store(false)
		}
	})

	// SIGTERM under load on a fresh replica, about once a minute.
	var shutdowns []shutdownResult
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(sigtermInterval):
			}
			p := startProc(t, set.bin, fmt.Sprintf("fresh-%d", i), append([]string{"--policy-file", base}, shutdownArgs...)...)
			shutdowns = append(shutdowns, sigtermUnderLoad(p, "default/victim", 8, delayOK))
		}
	})

	time.Sleep(set.duration)
	stop()
	wg.Wait()

	goroutinesEnd := map[string]float64{}
	for _, p := range []*proc{mem, red} {
		g, err := quietGoroutines(p)
		if err != nil {
			t.Error(err)
			continue
		}
		goroutinesEnd[p.name] = g
	}
	var closedStoreErrors float64
	if m, err := red.metrics(); err != nil {
		t.Error(err)
	} else {
		closedStoreErrors = m[`limiterd_store_errors_total{policy="default/closed"}`]
	}
	stopWatching()
	watchers.Wait()

	// SIGTERM the long-lived replicas under load.
	var final sync.WaitGroup
	finalResults := make([]shutdownResult, 2)
	final.Go(func() { finalResults[0] = sigtermUnderLoad(mem, "default/victim", 8, delayOK) })
	final.Go(func() { finalResults[1] = sigtermUnderLoad(red, "default/open", 8, delayOK) })
	final.Wait()
	shutdowns = append(shutdowns, finalResults...)

	// Figures.
	report := func(name string, samples []sample) (maxRSS int64, maxTracked, maxBytes float64) {
		var maxG float64
		for _, s := range samples {
			maxRSS, maxTracked, maxBytes = max(maxRSS, s.rss), max(maxTracked, s.tracked), max(maxBytes, s.bytes)
			maxG = max(maxG, s.goroutines)
		}
		t.Logf("%s: %d samples; max RSS %.1f MiB, max limiterd_tracked_clients %.0f (bound %d), max limiterd_tracked_client_bytes %.1f MiB (bound %d MiB), go_goroutines %.0f at start, %.0f at end, %.0f at most under load",
			name, len(samples), float64(maxRSS)/(1<<20), maxTracked, maxClients, maxBytes/(1<<20), maxClientBytes>>20,
			goroutinesStart[name], goroutinesEnd[name], maxG)
		return maxRSS, maxTracked, maxBytes
	}
	memRSS, memTracked, memBytes := report("memory", memSamples)
	redRSS, _, _ := report("redis", redSamples)
	secs := set.duration.Seconds()
	for _, s := range append([]*stream{flood, victim}, streams["open"], streams["closed"], streams["local"]) {
		t.Logf("stream %s: %d decisions (%.0f/s): %d allowed, %d rejected by a limit, %d rejected by failureMode Closed while Redis was away",
			s.name, s.sent.Load(), float64(s.sent.Load())/secs, s.ok.Load(), s.rejected.Load(), s.documentedRejection.Load())
	}
	churnMu.Lock()
	t.Logf("policy churn: %d cycles of %d policies; add applied in %v, removal in %v (median, max)",
		churnCycles.Load(), churnPolicies, medianMax(churnApply), medianMax(churnRemove))
	churnMu.Unlock()
	for _, fault := range faults {
		t.Logf("redis %s at %s for %v: the redis replica answered %d decisions meanwhile (%.0f/s)",
			fault.kind, fault.at.UTC().Format("15:04:05.000"), fault.length.Round(time.Millisecond), fault.decisions, float64(fault.decisions)/fault.length.Seconds())
	}
	for _, r := range shutdowns {
		t.Logf("SIGTERM %s: %d decisions served and %d failed during the delay, /readyz %d after 300ms, exit %d after %v",
			r.name, r.servedDuring, r.failedDuring, r.readyzAfter, r.exitCode, r.exitAfter.Round(time.Millisecond))
	}
	t.Logf("requests failed outside the documented failure modes: %d", f.n.Load())

	// Assertions.
	if memTracked > maxClients+memWorkers {
		t.Errorf("limiterd_tracked_clients reached %.0f, above --max-clients %d", memTracked, maxClients)
	}
	if memBytes > maxClientBytes+inFlightBytes {
		t.Errorf("limiterd_tracked_client_bytes reached %.0f, above --max-client-bytes %d and the %d bytes of the clients in flight",
			memBytes, maxClientBytes, inFlightBytes)
	}
	if memRSS > set.rssBudget || redRSS > set.rssBudget {
		t.Errorf("RSS reached %.1f MiB (memory) and %.1f MiB (redis); the budget is %d MiB",
			float64(memRSS)/(1<<20), float64(redRSS)/(1<<20), set.rssBudget>>20)
	}
	closed := streams["closed"].documentedRejection.Load()
	t.Logf("failureMode Closed rejected %d decisions, %d of them outside the Redis faults; limiterd_store_errors_total of the policy: %.0f",
		closed, closedOutsideFaults.Load(), closedStoreErrors)
	if float64(closed) > closedStoreErrors {
		t.Errorf("failureMode Closed rejected %d decisions, but the store failed only %.0f times", closed, closedStoreErrors)
	}
	for name, start := range goroutinesStart {
		if end, ok := goroutinesEnd[name]; ok && end > start+goroutineSlack {
			t.Errorf("%s: go_goroutines grew from %.0f to %.0f", name, start, end)
		}
	}
	if n := f.n.Load(); n > 0 {
		f.mu.Lock()
		t.Errorf("%d requests failed outside the documented failure modes; the first:\n%s", n, strings.Join(f.first, "\n"))
		f.mu.Unlock()
	}
	if churnCycles.Load() == 0 {
		t.Error("no policy churn cycle completed")
	}
	if len(faults) == 0 {
		t.Error("no Redis fault was injected")
	}
	for _, r := range shutdowns {
		r.check(t)
	}
}

// waitStatus decides on policy until it answers want (200: loaded, 404: removed), for at most a
// minute; it records a failure when it does not.
func waitStatus(ctx context.Context, p *proc, policy string, want int, f *failures) bool {
	deadline := time.Now().Add(time.Minute)
	for ctx.Err() == nil {
		status, _, err := p.allow(ctx, policy, "churn-probe")
		if err == nil && status == want {
			return true
		}
		if time.Now().After(deadline) {
			f.add("%s: policy %s still answers %d (%v) a minute after the policy file changed, want %d", p.name, policy, status, err, want)
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func totalSent(streams map[string]*stream) int64 {
	var n int64
	for _, s := range streams {
		n += s.sent.Load()
	}
	return n
}

func medianMax(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%v, %v", s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}
