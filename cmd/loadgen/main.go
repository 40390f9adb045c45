// Command loadgen measures limiterd's decision handler against a trivial Go handler, and
// single decisions against batches.
//
// It starts, in this process, two HTTP servers on 127.0.0.1 ephemeral ports: limiterd's
// decisions API (in-memory store, one token-bucket policy) and a handler that reads the body
// and always answers 200 with a JSON body of the same shape. Keep-alive clients then send
// POST /v1/allow to each in turn, and POST /v1/allow:batch with --batch items a call to
// limiterd, for a fixed time per round, with the same generator and the same keys; it prints
// decisions per second and latency percentiles per call side by side with their ratios.
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

// trivialBody is what the trivial handler answers: the shape of a decision.
var trivialBody = []byte(`{"allowed":true,"limit":1000,"remaining":999,"resetAfterSeconds":1,"retryAfterSeconds":0}` + "\n")

// trivialHandler reads the request body and always answers 200 with trivialBody.
func trivialHandler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(trivialBody)
}

// newLimiterd returns limiterd's decisions handler with one token-bucket policy: 1000 tokens,
// refilled at 1000 a second, so the default key spread is mostly admitted.
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

// target is a URL under load, with the bodies its calls send in turn.
type target struct {
	name    string
	url     string
	bodies  [][]byte
	perCall int // decisions a call asks for
}

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
	for i := range bodies {
		bodies[i] = []byte(itemBody(i))
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
	// Per-round throughput ratios, robust to drifting load: limiterd/trivial, batch/single.
	var roundRatios, batchRatios []float64
	for round := range cfg.rounds {
		rates := make(map[string]float64, len(targets))
		for _, t := range targets {
			if cfg.warmup > 0 {
				load(ctx, client, t, cfg.workers, cfg.warmup, cfg.maxRequests)
			}
			r := load(ctx, client, t, cfg.workers, cfg.duration, cfg.maxRequests)
			fmt.Fprintf(stdout, "round %d %-18s %10.0f decisions/s\n", round+1, t.name, r.rate())
			acc := results[t.name]
			if acc == nil {
				acc = &result{perCall: t.perCall}
				results[t.name] = acc
			}
			acc.requests += r.requests
			acc.errors += r.errors
			acc.elapsed += r.elapsed
			acc.latencies = append(acc.latencies, r.latencies...)
			rates[t.name] = r.rate()
		}
		if rates["trivial"] > 0 {
			roundRatios = append(roundRatios, rates["limiterd"]/rates["trivial"])
		}
		if cfg.batch > 0 && rates["limiterd"] > 0 {
			batchRatios = append(batchRatios, rates[batchName]/rates["limiterd"])
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tdecisions/call\tdecisions/s\tcalls/s\tp50/call\tp99/call\tcalls\terrors\t")
	for _, t := range targets {
		r := results[t.name]
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%v\t%v\t%d\t%d\t\n", t.name, r.perCall, r.rate(), r.callRate(),
			r.percentile(0.50), r.percentile(0.99), r.requests, r.errors)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("print results: %w", err)
	}
	trivial, lim := results["trivial"], results["limiterd"]
	fmt.Fprintf(stdout, "ratio limiterd/trivial: throughput %.2f, p50 %.2f, p99 %.2f\n",
		lim.rate()/trivial.rate(),
		float64(lim.percentile(0.50))/float64(trivial.percentile(0.50)),
		float64(lim.percentile(0.99))/float64(trivial.percentile(0.99)))
	if len(roundRatios) > 0 {
		slices.Sort(roundRatios)
		fmt.Fprintf(stdout, "median of the per-round throughput ratios: %.2f (min %.2f, max %.2f)\n",
			roundRatios[len(roundRatios)/2], roundRatios[0], roundRatios[len(roundRatios)-1])
	}
	failed := lim.errors + trivial.errors
	if cfg.batch > 0 {
		batched := results[batchName]
		fmt.Fprintf(stdout, "ratio %s/single: decisions/s %.2f, p99 per call %.2f\n", batchName,
			batched.rate()/lim.rate(), float64(batched.percentile(0.99))/float64(lim.percentile(0.99)))
		if len(batchRatios) > 0 {
			slices.Sort(batchRatios)
			fmt.Fprintf(stdout, "median of the per-round batch/single decisions/s ratios: %.2f (min %.2f, max %.2f)\n",
				batchRatios[len(batchRatios)/2], batchRatios[0], batchRatios[len(batchRatios)-1])
		}
		failed += batched.errors
	}
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
// answered 200 or 429.
func load(reqCtx context.Context, client *http.Client, t *target, workers int, d time.Duration, maxRequests int) result {
	url, bodies := t.url, t.bodies
	ctx, cancel := context.WithTimeout(reqCtx, d)
	defer cancel()
	perWorker := max(1, maxRequests/workers)
	parts := make([]result, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			part := &parts[w]
			part.latencies = make([]time.Duration, 0, min(perWorker, 1<<16))
			for i := w; part.requests+part.errors < perWorker && ctx.Err() == nil; i += workers {
				body := bodies[i%len(bodies)]
				t0 := time.Now()
				ok := post(reqCtx, client, url, body)
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
	total := result{perCall: t.perCall, elapsed: time.Since(start)}
	for _, p := range parts {
		total.requests += p.requests
		total.errors += p.errors
		total.latencies = append(total.latencies, p.latencies...)
	}
	return total
}

// post sends one decision request and drains the answer, so the connection is reused.
func post(ctx context.Context, client *http.Client, url string, body []byte) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, copyErr := io.Copy(io.Discard, resp.Body)
	closeErr := resp.Body.Close()
	return copyErr == nil && closeErr == nil &&
		(resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests)
}
