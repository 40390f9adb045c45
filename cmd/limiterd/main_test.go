package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
)

// reloadDeadline is how soon a policy file change must be served.
const reloadDeadline = time.Second

// daemonUnderTest is limiterd running in-process on loopback ports.
type daemonUnderTest struct {
	decisions, admin string // base URLs
	logs             *testsupport.SyncBuffer
	stop             context.CancelFunc
	done             chan error
}

// start runs limiterd with args (plus loopback ports) until the test ends.
func start(t *testing.T, h hooks, args ...string) *daemonUnderTest {
	t.Helper()
	args = append([]string{"--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--shutdown-timeout", "30s", "--shutdown-delay", "0s"}, args...)
	d := &daemonUnderTest{logs: &testsupport.SyncBuffer{}, done: make(chan error, 1)}
	cfg, err := parseFlags(args, d.logs)
	if err != nil {
		t.Fatal(err)
	}
	addrs := make(chan [2]net.Addr, 1)
	h.listening = func(decisions, admin net.Addr) { addrs <- [2]net.Addr{decisions, admin} }
	ctx, cancel := context.WithCancel(t.Context())
	d.stop = cancel
	go func() { d.done <- serve(ctx, cfg, d.logs, h) }()
	select {
	case a := <-addrs:
		d.decisions, d.admin = "http://"+a[0].String(), "http://"+a[1].String()
	case err := <-d.done:
		t.Fatalf("limiterd stopped before serving: %v\nlogs:\n%s", err, d.logs)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-d.done; err != nil {
			t.Errorf("limiterd: %v", err)
		}
		if t.Failed() {
			t.Logf("limiterd logs:\n%s", d.logs)
		}
	})
	return d
}

func policyFile(t *testing.T, dir, content string) string {
	t.Helper()
	path := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// replaceFile writes content next to path and renames it over path, as editors and
// kubectl-style tools do.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const tokenBucketPolicy = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: standard
  tiers:
  - name: standard
    algorithm: TokenBucket
    tokenBucket: {capacity: 3, refillRate: 1, refillPeriod: 1h}
  - name: internal
    algorithm: Unlimited
  overrides:
  - tier: internal
    clientPrefixes: ["svc-"]
`

const slidingWindowPolicy = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: standard
  tiers:
  - name: standard
    algorithm: SlidingWindow
    slidingWindow: {limit: 5, window: 1m}
`

type decision struct {
	status     int
	rateLimit  string
	policy     string
	retryAfter string
	body       map[string]any
}

func decide(t *testing.T, base, key string) decision {
	t.Helper()
	resp, err := http.Post(base+"/v1/allow", "application/json", strings.NewReader(`{"policy":"default/api","key":"`+key+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	d := decision{
		status:     resp.StatusCode,
		rateLimit:  resp.Header.Get("RateLimit"),
		policy:     resp.Header.Get("RateLimit-Policy"),
		retryAfter: resp.Header.Get("Retry-After"),
	}
	if err := json.NewDecoder(resp.Body).Decode(&d.body); err != nil {
		t.Fatalf("decode answer: %v", err)
	}
	return d
}

// metric returns the value of one sample line of /metrics, e.g.
// `limiterd_policy_reloads_total{result="failure"}`.
func metric(t *testing.T, admin, sample string) float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatalf("%s: %v", sample, err)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no sample %s", sample)
	return 0
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// TestEndToEnd runs limiterd on a policy file, changes the default tier's algorithm under it
// and then breaks the file, deciding over HTTP all along.
func TestEndToEnd(t *testing.T) {
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	d := start(t, hooks{}, "--policy-file", path)

	if status, body := get(t, d.admin+"/readyz"); status != 200 {
		t.Fatalf("/readyz: %d %s", status, body)
	}
	if status, _ := get(t, d.admin+"/healthz"); status != 200 {
		t.Fatalf("/healthz: %d", status)
	}
	for i, want := range []int{200, 200, 200, 429} {
		got := decide(t, d.decisions, "alice")
		if got.status != want {
			t.Fatalf("token bucket decision %d: %d, want %d", i, got.status, want)
		}
		if got.policy != `"standard";q=3;w=10800` {
			t.Fatalf("RateLimit-Policy %q", got.policy)
		}
		if want == 429 && got.retryAfter != "3600" {
			t.Fatalf("Retry-After %q, want 3600", got.retryAfter)
		}
	}
	if got := decide(t, d.decisions, "svc-billing"); got.status != 200 || got.rateLimit != "" || got.body["limit"] != nil {
		t.Fatalf("unlimited override: %+v", got)
	}
	successes := metric(t, d.admin, `limiterd_policy_reloads_total{result="success"}`)

	// Same policy, new algorithm for the default tier: served without a restart.
	replaceFile(t, path, slidingWindowPolicy)
	testsupport.Eventually(t, reloadDeadline, "sliding window served", func() bool {
		return decide(t, d.decisions, "bob").policy == `"standard";q=5;w=60`
	})
	if got := metric(t, d.admin, `limiterd_policy_reloads_total{result="success"}`); got != successes+1 {
		t.Errorf("reload successes %v, want %v", got, successes+1)
	}
	// alice changed algorithm: the 3 tokens she used are charged to the sliding window (a
	// conversion never gives usage back), so one more request leaves 1 of 5.
	if got := decide(t, d.decisions, "alice"); got.status != 200 || got.rateLimit != `"standard";r=1;t=60` {
		t.Fatalf("alice under the sliding window: %+v", got)
	}

	// An invalid file: the failure is counted and the last good policy keeps serving.
	failures := metric(t, d.admin, `limiterd_policy_reloads_total{result="failure"}`)
	replaceFile(t, path, strings.Replace(slidingWindowPolicy, "limit: 5", "limit: 0", 1))
	testsupport.Eventually(t, reloadDeadline, "failure counted", func() bool {
		return metric(t, d.admin, `limiterd_policy_reloads_total{result="failure"}`) == failures+1
	})
	if got := decide(t, d.decisions, "carol"); got.status != 200 || got.policy != `"standard";q=5;w=60` {
		t.Fatalf("after the invalid file: %+v, want the sliding window still served", got)
	}
	if status, _ := get(t, d.admin+"/readyz"); status != 200 {
		t.Errorf("/readyz after an invalid file: %d, want 200", status)
	}
	if !strings.Contains(d.logs.String(), `"msg":"policy contribution rejected"`) {
		t.Errorf("the rejection was not logged")
	}

	// Client state over the admin API.
	status, body := get(t, d.admin+"/v1/clients?policy=default/api&key=alice")
	if status != 200 || !strings.Contains(body, `"remaining":1`) {
		t.Errorf("/v1/clients: %d %s", status, body)
	}
	status, body = get(t, d.admin+"/v1/policies")
	if status != 200 || !strings.Contains(body, `"id":"default/api"`) {
		t.Errorf("/v1/policies: %d %s", status, body)
	}
	if status, body := get(t, d.decisions+"/v1/policies"); status != 404 {
		t.Errorf("/v1/policies on the decisions port: %d %s, want 404", status, body)
	}
}

func TestStartupFailsWithoutALoadablePolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(tokenBucketPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("spec: [unclosed"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"no source":      {},
		"missing file":   {"--policy-file", filepath.Join(dir, "missing.yaml")},
		"invalid file":   {"--policy-file", bad},
		"one bad of two": {"--policy-file", good, "--policy-file", bad},
	} {
		var stderr testsupport.SyncBuffer
		args = append([]string{"--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, args...)
		if err := run(t.Context(), args, io.Discard, &stderr); err == nil {
			t.Errorf("%s: started", name)
		}
	}
}

func TestFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--policy-file", "a.yaml", "--policy-file", "b.yaml", "--max-clients", "0", "--log-level", "debug"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.policyFiles) != 2 || cfg.maxClients != 0 || cfg.addr != ":8080" || cfg.adminAddr != "127.0.0.1:9090" ||
		cfg.sweepInterval != 10*time.Second || cfg.logLevel.String() != "DEBUG" {
		t.Errorf("config %+v", cfg)
	}
	for _, args := range [][]string{
		{"--policy-file", "a", "--max-clients", "-1"},
		{"--policy-file", "a", "--sweep-interval", "0s"},
		{"--policy-file", "a", "--log-level", "loud"},
		{"--policy-file", "a", "extra"},
		{"--policy-file", ""},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	if _, err := parseFlags([]string{"--help"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
}

// TestGracefulShutdown checks that a request in flight when shutdown starts completes, while
// new connections are refused.
func TestGracefulShutdown(t *testing.T) {
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	entered, release := make(chan struct{}), make(chan struct{})
	h := hooks{wrapDecisions: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Test-Hold") != "" {
				close(entered)
				<-release
			}
			next.ServeHTTP(w, r)
		})
	}}
	d := start(t, h, "--policy-file", path)

	type result struct {
		status int
		err    error
	}
	held := make(chan result, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, d.decisions+"/v1/allow", strings.NewReader(`{"key":"slow"}`))
		if err != nil {
			held <- result{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Test-Hold", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			held <- result{err: err}
			return
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		held <- result{status: resp.StatusCode, err: err}
	}()
	<-entered
	d.stop() // SIGTERM

	// New connections are refused once the listener is closed.
	addr := strings.TrimPrefix(d.decisions, "http://")
	testsupport.Eventually(t, reloadDeadline, "listener closed", func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	select {
	case err := <-d.done:
		t.Fatalf("limiterd stopped with a request in flight: %v", err)
	default:
	}
	close(release)
	r := <-held
	if r.err != nil || r.status != 200 {
		t.Fatalf("in-flight request: %d, %v; want 200", r.status, r.err)
	}
	if err := <-d.done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	d.done <- nil // for the cleanup
	if !strings.Contains(d.logs.String(), `"msg":"limiterd stopped"`) {
		t.Error("no clean stop logged")
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) != "" { // the test binary as limiterd itself (see startProcess)
		os.Exit(runMain())
	}
	// Tests talk to loopback servers only; make sure no proxy setting sends them elsewhere.
	for _, v := range []string{"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"} {
		os.Unsetenv(v)
	}
	os.Exit(m.Run())
}

// TestLegacyRateLimitHeadersFlag checks that --legacy-ratelimit-headers reaches the decisions
// API, and that without it the X-RateLimit fields are absent.
func TestLegacyRateLimitHeadersFlag(t *testing.T) {
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	for _, on := range []bool{true, false} {
		args := []string{"--policy-file", path}
		if on {
			args = append(args, "--legacy-ratelimit-headers")
		}
		d := start(t, hooks{}, args...)
		resp, err := http.Post(d.decisions+"/v1/allow", "application/json", strings.NewReader(`{"key":"alice"}`))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if got := resp.Header.Get("X-RateLimit-Limit"); (got == "3") != on || (got == "") == on {
			t.Fatalf("--legacy-ratelimit-headers %t: X-RateLimit-Limit %q", on, got)
		}
	}
}
