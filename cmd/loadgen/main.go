// Command loadgen measures limiterd's decision handler against a trivial Go handler, single
// decisions against batches, and forward-auth decisions against single ones.
//
// It starts, in this process, two HTTP servers on 127.0.0.1 ephemeral ports: limiterd's
// decisions API (in-memory store, one token-bucket policy with a gateway Header key source)
// and a handler that reads the body and always answers 200 with a JSON body of the same shape.
// Keep-alive clients then send POST /v1/allow to each in turn, POST /v1/allow:batch with
// --batch items a call to limiterd, and GET /v1/forward-auth/<namespace>/<name> with the key
// in a header to limiterd, for a fixed time per round, with the same generator and the same
// keys; it prints decisions per second, the process's CPU time per decision, and latency
// percentiles per call side by side with their ratios.
// Traffic stays on loopback; the load generator shares the CPUs with the servers, so the
// figures compare the handlers on one machine rather than measure a deployment.
//
// Usage:
//
//	loadgen [--workers 16] [--duration 5s] [--rounds 3] [--keys 10000] [--batch 100]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/server"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

type config struct {
	workers     int
	duration    time.Duration
	warmup      time.Duration
	rounds      int
	keys        int
	maxRequests int
	batch       int
	cpuProfile  string
	noTop       bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.workers, "workers", 16, "concurrent keep-alive clients")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured time per target and round")
	fs.DurationVar(&cfg.warmup, "warmup", 500*time.Millisecond, "unmeasured time per target and round before measuring")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs every target once, alternating")
	fs.IntVar(&cfg.keys, "keys", 10_000, "distinct client keys, used round-robin")
	fs.IntVar(&cfg.maxRequests, "max-requests", 5_000_000, "most requests one target gets in one round")
	fs.IntVar(&cfg.batch, "batch", 100, "decisions per call of the batch target, POST /v1/allow:batch (0: no batch target)")
	fs.BoolVar(&cfg.noTop, "no-top-clients", false, "turn off limiterd's record of its heaviest clients (engine.Options.NoTopClients), to measure its cost against a run with it")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run (servers and clients) to this `file`")
	if err := fs.Parse(args); err != nil {
		return config{}, fmt.Errorf("parse flags: %w", err) // still flag.ErrHelp for errors.Is after --help
	}
	switch {
	case fs.NArg() > 0:
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	case cfg.workers < 1 || cfg.workers > 1024:
		return config{}, errors.New("--workers must be between 1 and 1024")
	case cfg.duration <= 0 || cfg.duration > 10*time.Minute:
		return config{}, errors.New("--duration must be positive and at most 10m")
	case cfg.warmup < 0 || cfg.warmup > time.Minute:
		return config{}, errors.New("--warmup must be between 0 and 1m")
	case cfg.rounds < 1 || cfg.rounds > 100:
		return config{}, errors.New("--rounds must be between 1 and 100")
	case cfg.keys < 1:
		return config{}, errors.New("--keys must be positive")
	case cfg.maxRequests < 1:
		return config{}, errors.New("--max-requests must be positive")
	case cfg.batch < 0 || cfg.batch > v1alpha1.MaxBatchItems:
		return config{}, fmt.Errorf("--batch must be between 0 and %d", v1alpha1.MaxBatchItems)
	}
	return cfg, nil
}

// benchPolicyID is the policy the requests name.
const benchPolicyID = "default/bench"

// keyHeader is the header a forward-auth request carries its client key in: the benchmark
// policy's gateway key source.
const keyHeader = "X-Api-Key"

// trivialBody is what the trivial handler answers: the shape of a decision.
var trivialBody = []byte(`{"allowed":true,"limit":1000,"remaining":999,"resetAfterSeconds":1,"retryAfterSeconds":0}` + "\n")

// trivialHandler reads the request body and always answers 200 with trivialBody.
func trivialHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(trivialBody)
}

// newLimiterd returns limiterd's decisions handler with one token-bucket policy: 1000 tokens,
// refilled at 1000 a second, so the default key spread is mostly admitted; its spec.gateway
// keys a forward-auth request by its keyHeader.
func newLimiterd(noTop bool) (http.Handler, error) {
	rp := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "standard",
			Tiers: []v1alpha1.Tier{{
				Name:      "standard",
				Algorithm: v1alpha1.AlgorithmTokenBucket,
				TokenBucket: &v1alpha1.TokenBucket{
					Capacity: 1000, RefillRate: 1000, RefillPeriod: &metav1.Duration{Duration: time.Second},
				},
			}},
			Gateway: &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: keyHeader}}},
		},
	}
	compiled, err := policy.Compile(rp)
	if err != nil {
		return nil, fmt.Errorf("compile the benchmark policy: %w", err)
	}
	set, err := policy.NewSet(compiled)
	if err != nil {
		return nil, fmt.Errorf("build the benchmark policy set: %w", err)
	}
	e := engine.New(engine.Options{Budget: limiter.NewBudget(1_000_000, 0), NoTopClients: noTop})
	e.Swap(set)
	return server.NewDecisions(e, nil), nil
}

// target is a URL under load, with what its calls send in turn: a POST of each of bodies, or
// a GET with keyHeader set to each of keys.
type target struct {
	name    string
	url     string
	bodies  [][]byte
	keys    []string
	perCall int // decisions a call asks for
}

// calls returns how many distinct calls the target sends in turn.
func (t *target) calls() int { return max(len(t.bodies), len(t.keys)) }

// startServer serves h on a loopback port and returns its base URL.
func startServer(ctx context.Context, name string, h http.Handler) (*http.Server, string, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("listen for %s: %w", name, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, "http://" + ln.Addr().String(), nil
}

// itemBody is the decision request of key i.
func itemBody(i int) string {
	return `{"policy":"` + benchPolicyID + `","key":"client-` + strconv.Itoa(i) + `","cost":1}`
}

// batchBodies returns the bodies of batches of n items, the keys taken in turn as the single
// calls take them.
func batchBodies(keys, n int) [][]byte {
	bodies := make([][]byte, max(1, keys/n))
	for b := range bodies {
		var body bytes.Buffer
		body.WriteString(`{"items":[`)
		for i := range n {
			if i > 0 {
				body.WriteByte(',')
			}
			body.WriteString(itemBody((b*n + i) % keys))
		}
		body.WriteString(`]}`)
		bodies[b] = body.Bytes()
	}
	return bodies
}

// result is one target's measurements, over every round.
type result struct {
	perCall   int
	requests  int // calls
	errors    int
	elapsed   time.Duration
	cpu       time.Duration   // the process's (servers' and clients'), while measuring
	latencies []time.Duration // of calls
}

func run(args []string, stdout, stderr io.Writer) (runErr error) {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.cpuProfile != "" {
		stopProfile, err := startCPUProfile(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer func() {
			if err := stopProfile(); err != nil {
				runErr = errors.Join(runErr, err)
			}
		}()
	}
	// Nothing cancels the requests: a request in flight when a round's time is up finishes, so
	// that its keep-alive connection is reused by the next round.
	ctx := context.Background()
	limiterd, err := newLimiterd(cfg.noTop)
	if err != nil {
		return err
	}
	bodies := make([][]byte, cfg.keys)
	keys := make([]string, cfg.keys)
	for i := range bodies {
		bodies[i] = []byte(itemBody(i))
		keys[i] = "client-" + strconv.Itoa(i)
	}
	var urls [2]string
	for i, h := range []http.Handler{http.HandlerFunc(trivialHandler), limiterd} {
		srv, url, err := startServer(ctx, []string{"trivial", "limiterd"}[i], h)
		if err != nil {
			return err
		}
		// The measurements are over when it closes: an error closing its connections cannot
		// change them.
		defer func() { _ = srv.Close() }()
		urls[i] = url
	}
	targets := []*target{
		{name: "trivial", url: urls[0] + "/v1/allow", bodies: bodies, perCall: 1},
		{name: "limiterd", url: urls[1] + "/v1/allow", bodies: bodies, perCall: 1},
	}
	batchName := "limiterd batch " + strconv.Itoa(cfg.batch)
	if cfg.batch > 0 {
		targets = append(targets, &target{name: batchName, url: urls[1] + "/v1/allow:batch", bodies: batchBodies(cfg.keys, cfg.batch), perCall: cfg.batch})
	}
	const forwardAuthName = "limiterd forward-auth"
	targets = append(targets, &target{name: forwardAuthName, url: urls[1] + "/v1/forward-auth/" + benchPolicyID, keys: keys, perCall: 1})
	transport := &http.Transport{
		MaxIdleConns:        2 * cfg.workers,
		MaxIdleConnsPerHost: cfg.workers,
		DisableCompression:  true,
		IdleConnTimeout:     time.Minute,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	fmt.Fprintf(stdout, "GOMAXPROCS=%d CPUs=%d workers=%d duration=%v rounds=%d keys=%d batch=%d top-clients=%v (servers and load generator share the CPUs)\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), cfg.workers, cfg.duration, cfg.rounds, cfg.keys, cfg.batch, !cfg.noTop)
	results := make(map[string]*result)
	// Each round's results by target, for per-round ratios, which are robust to drifting load.
	rounds := make([]map[string]result, cfg.rounds)
	for round := range cfg.rounds {
		rounds[round] = make(map[string]result, len(targets))
		for _, t := range targets {
			if cfg.warmup > 0 {
				load(ctx, client, t, cfg.workers, cfg.warmup, cfg.maxRequests)
			}
			r := load(ctx, client, t, cfg.workers, cfg.duration, cfg.maxRequests)
			fmt.Fprintf(stdout, "round %d %-21s %10.0f decisions/s %8.1f µs CPU/decision\n", round+1, t.name, r.rate(), micros(r.cpuPerDecision()))
			acc := results[t.name]
			if acc == nil {
				acc = &result{perCall: t.perCall}
				results[t.name] = acc
			}
			acc.requests += r.requests
			acc.errors += r.errors
			acc.elapsed += r.elapsed
			acc.cpu += r.cpu
			acc.latencies = append(acc.latencies, r.latencies...)
			rounds[round][t.name] = r
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tdecisions/call\tdecisions/s\tcalls/s\tCPU/decision\tp50/call\tp99/call\tcalls\terrors\t")
	for _, t := range targets {
		r := results[t.name]
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.1fµs\t%v\t%v\t%d\t%d\t\n", t.name, r.perCall, r.rate(), r.callRate(),
			micros(r.cpuPerDecision()), r.percentile(0.50), r.percentile(0.99), r.requests, r.errors)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("print results: %w", err)
	}
	trivial, lim := results["trivial"], results["limiterd"]
	fmt.Fprintf(stdout, "ratio limiterd/trivial: throughput %.2f, p50 %.2f, p99 %.2f\n",
		lim.rate()/trivial.rate(),
		float64(lim.percentile(0.50))/float64(trivial.percentile(0.50)),
		float64(lim.percentile(0.99))/float64(trivial.percentile(0.99)))
	fmt.Fprintf(stdout, "median of the per-round throughput ratios: %s\n", perRound(rounds, "limiterd", "trivial", (*result).rate))
	failed := lim.errors + trivial.errors
	if cfg.batch > 0 {
		batched := results[batchName]
		fmt.Fprintf(stdout, "ratio %s/single: decisions/s %.2f, p99 per call %.2f\n", batchName,
			batched.rate()/lim.rate(), float64(batched.percentile(0.99))/float64(lim.percentile(0.99)))
		fmt.Fprintf(stdout, "median of the per-round batch/single decisions/s ratios: %s\n", perRound(rounds, batchName, "limiterd", (*result).rate))
		failed += batched.errors
	}
	fa := results[forwardAuthName]
	fmt.Fprintf(stdout, "ratio forward-auth/allow: decisions/s %.2f, from CPU time per decision %.2f, p50 %.2f, p99 %.2f\n",
		fa.rate()/lim.rate(), lim.cpuPerDecision().Seconds()/fa.cpuPerDecision().Seconds(),
		float64(fa.percentile(0.50))/float64(lim.percentile(0.50)), float64(fa.percentile(0.99))/float64(lim.percentile(0.99)))
	fmt.Fprintf(stdout, "median of the per-round forward-auth/allow ratios: decisions/s %s; from CPU time per decision %s\n",
		perRound(rounds, forwardAuthName, "limiterd", (*result).rate),
		perRound(rounds, forwardAuthName, "limiterd", func(r *result) float64 { return 1 / r.cpuPerDecision().Seconds() }))
	failed += fa.errors
	if failed > 0 {
		return fmt.Errorf("%d calls failed", failed)
	}
	return nil
}

// startCPUProfile starts a CPU profile written to the file at path. stop ends it and closes
// the file; its error means that the profile may be incomplete.
func startCPUProfile(path string) (stop func() error, err error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create the CPU profile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		return nil, errors.Join(fmt.Errorf("start the CPU profile: %w", err), out.Close())
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := out.Close(); err != nil {
			return fmt.Errorf("write the CPU profile: %w", err)
		}
		return nil
	}, nil
}

// perRound returns the median, min and max over the rounds of f(a)/f(b), f of targets a and b
// in the same round, as "median (min m, max n)"; "-" without a round where f(b) > 0.
func perRound(rounds []map[string]result, a, b string, f func(*result) float64) string {
	var ratios []float64
	for _, rs := range rounds {
		ra, rb := rs[a], rs[b]
		if d := f(&rb); d > 0 {
			ratios = append(ratios, f(&ra)/d)
		}
	}
	if len(ratios) == 0 {
		return "-"
	}
	slices.Sort(ratios)
	return fmt.Sprintf("%.2f (min %.2f, max %.2f)", ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
}

// micros returns d in microseconds.
func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// cpuPerDecision returns the process's CPU time per decision made.
func (r *result) cpuPerDecision() time.Duration {
	n := r.requests * max(r.perCall, 1)
	if n == 0 {
		return 0
	}
	return r.cpu / time.Duration(n)
}

// processCPU returns the user and system CPU time the process has used, 0 when unknown.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rate returns decisions per second.
func (r *result) rate() float64 { return r.callRate() * float64(max(r.perCall, 1)) }

// callRate returns calls per second.
func (r *result) callRate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.requests) / r.elapsed.Seconds()
}

// percentile returns the q-quantile of the latencies, sorting them on first use.
func (r *result) percentile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	if !slices.IsSorted(r.latencies) {
		slices.Sort(r.latencies)
	}
	i := int(q * float64(len(r.latencies)-1))
	return r.latencies[i].Round(time.Microsecond)
}

// load sends the target's calls from workers keep-alive clients for d, at most maxRequests in
// all, with reqCtx: calls in flight after d finish unless it is done. A call fails unless it is
// decided (see call).
func load(reqCtx context.Context, client *http.Client, t *target, workers int, d time.Duration, maxRequests int) result {
	ctx, cancel := context.WithTimeout(reqCtx, d)
	defer cancel()
	perWorker := max(1, maxRequests/workers)
	parts := make([]result, workers)
	var wg sync.WaitGroup
	cpu0 := processCPU()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			part := &parts[w]
			part.latencies = make([]time.Duration, 0, min(perWorker, 1<<16))
			for i := w; part.requests+part.errors < perWorker && ctx.Err() == nil; i += workers {
				t0 := time.Now()
				ok := call(reqCtx, client, t, i%t.calls())
				elapsed := time.Since(t0)
				if !ok {
					if ctx.Err() != nil {
						break // cut by the deadline: not a failure
					}
					part.errors++
					continue
				}
				part.requests++
				part.latencies = append(part.latencies, elapsed)
			}
		})
	}
	wg.Wait()
	total := result{perCall: t.perCall, elapsed: time.Since(start), cpu: processCPU() - cpu0}
	for _, p := range parts {
		total.requests += p.requests
		total.errors += p.errors
		total.latencies = append(total.latencies, p.latencies...)
	}
	return total
}

// call sends the target's i-th decision request (a POST of its body, or a GET with its key in
// keyHeader) and drains the answer, so the connection is reused. It reports whether the
// request was decided: answered 200 or 429, with a RateLimit field for a forward-auth request.
func call(ctx context.Context, client *http.Client, t *target, i int) bool {
	method, body := http.MethodGet, io.Reader(nil)
	if t.bodies != nil {
		method, body = http.MethodPost, bytes.NewReader(t.bodies[i])
	}
	req, err := http.NewRequestWithContext(ctx, method, t.url, body)
	if err != nil {
		return false
	}
	if t.bodies != nil {
		req.Header.Set("Content-Type", "application/json")
	} else {
		req.Header.Set(keyHeader, t.keys[i])
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, copyErr := io.Copy(io.Discard, resp.Body)
	closeErr := resp.Body.Close()
	// A forward-auth request that no key source keys answers 429 too, but decides nothing: a
	// decision of the benchmark policy carries its RateLimit field.
	decided := t.keys == nil || resp.Header.Get("RateLimit") != ""
	return copyErr == nil && closeErr == nil && decided &&
		(resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests)
}
