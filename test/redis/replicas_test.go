// Package redis_test runs limiterd as separate processes (bin/limiterd, built from this checkout
// by `make build`; see internal/testbin) against
// real redis-server processes: a single server, a 3-master Redis Cluster made on loopback, and a
// master with a replica and 3 Sentinels, failed over under load (sentinel_test.go).
// It checks what only a shared store gives: several replicas admit a client's limit once in
// total.
package redis_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
	redisstore "github.com/limiterd/limiterd/limiterd/store/redis"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// limit is the allowance of the test policies' one client.
const limit = 40

// policies has a token-bucket and a sliding-window policy of limit units an hour, and a quota
// of limit units a year, so that nothing refills during a test (a test run across the new
// year's UTC midnight would see the quota's allowance come back).
func policies(capacity int) string {
	return fmt.Sprintf(`apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: bucket
spec:
  defaultTier: standard
  failureMode: Closed
  tiers:
  - name: standard
    algorithm: TokenBucket
    tokenBucket: {capacity: %d, refillRate: 1, refillPeriod: 1h}
---
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: window
spec:
  defaultTier: standard
  failureMode: Closed
  tiers:
  - name: standard
    algorithm: SlidingWindow
    slidingWindow: {limit: %d, window: 1h}
---
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: quota
spec:
  defaultTier: standard
  failureMode: Closed
  tiers:
  - name: standard
    algorithm: Quota
    quota: {limit: %d, period: Year, timeZone: UTC}
`, capacity, capacity, capacity)
}

// limiterdBinary returns the path of bin/limiterd.
func limiterdBinary(t *testing.T) string {
	t.Helper()
	return testbin.Need(t, testbin.Limiterd)
}

// replica is a limiterd process.
type replica struct {
	decisions, admin string // base URLs
	cmd              *exec.Cmd
	logs             *strings.Builder
	logsMu           *sync.Mutex
	grpcServing      chan string // the gRPC address, once served (with --grpc-addr)
}

// startReplica runs limiterd with args on loopback ports until the test ends.
func startReplica(t *testing.T, args ...string) *replica {
	t.Helper()
	cmd := exec.Command(limiterdBinary(t), append([]string{"--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--shutdown-delay", "0s"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{cmd: cmd, logs: &strings.Builder{}, logsMu: &sync.Mutex{}, grpcServing: make(chan string, 1)}
	serving := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			r.logsMu.Lock()
			r.logs.WriteString(line + "\n")
			r.logsMu.Unlock()
			var rec struct{ Msg, Addr, Admin_addr, Grpc_addr string }
			if json.Unmarshal([]byte(line), &rec) == nil {
				switch rec.Msg {
				case "limiterd serving":
					serving <- [2]string{rec.Addr, rec.Admin_addr}
				case "grpc serving":
					r.grpcServing <- rec.Grpc_addr
				}
			}
		}
		close(serving)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("limiterd %s logs:\n%s", r.decisions, r.log())
		}
	})
	select {
	case a, ok := <-serving:
		if !ok {
			t.Fatalf("limiterd exited before serving:\n%s", r.log())
		}
		r.decisions, r.admin = "http://"+a[0], "http://"+a[1]
	case <-time.After(60 * time.Second):
		t.Fatalf("limiterd did not serve within a minute:\n%s", r.log())
	}
	return r
}

func (r *replica) log() string {
	r.logsMu.Lock()
	defer r.logsMu.Unlock()
	return r.logs.String()
}

var httpClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// allow asks a replica to admit one unit for the client and returns the status and body.
func allow(t *testing.T, r *replica, policy, key string) (int, map[string]any) {
	t.Helper()
	return decideCost(t, r, policy, key, 1)
}

// hammer drives one client through all replicas at once, perReplica requests each from as
// many goroutines, and returns how many were admitted.
func hammer(t *testing.T, replicas []*replica, policy, key string, perReplica int) int {
	t.Helper()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
	)
	for _, r := range replicas {
		for g := 0; g < 8; g++ {
			wg.Go(func() {
				for i := g; i < perReplica; i += 8 {
					status, body := allow(t, r, policy, key)
					mu.Lock()
					switch status {
					case http.StatusOK:
						admitted++
					case http.StatusTooManyRequests:
					default:
						t.Errorf("status %d: %v", status, body)
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return admitted
}

func writePolicies(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startReplicas runs n limiterd processes on one policy file with extra args.
func startReplicas(t *testing.T, n int, policyFile string, extra ...string) []*replica {
	t.Helper()
	limiterdBinary(t) // ends the test here, not in one of the goroutines, when bin/limiterd is missing
	out := make([]*replica, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() { out[i] = startReplica(t, append([]string{"--policy-file", policyFile}, extra...)...) })
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// TestReplicasShareOneAllowance runs three replicas on one Redis: one client driven through all
// three at once is admitted exactly its limit in total. A policy change then applies to the
// next decision on every replica, with the usage carried over.
func TestReplicasShareOneAllowance(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	file := filepath.Join(t.TempDir(), "policies.yaml")
	writePolicies(t, file, policies(limit))
	replicas := startReplicas(t, 3, file, "--store", "redis", "--redis-addr", srv.Addr(), "--store-timeout", "5s")
	for _, policy := range []string{"default/bucket", "default/window", "default/quota"} {
		if got := hammer(t, replicas, policy, "one-client", 2*limit); got != limit {
			t.Errorf("%s: three replicas on Redis admitted %d of %d requests, want exactly the limit %d", policy, got, 6*limit, limit)
		}
	}

	// Hot swap: a larger allowance applies to the next decision, usage carried over.
	writePolicies(t, file, policies(limit+10))
	for _, r := range replicas {
		deadline := time.Now().Add(10 * time.Second)
		for {
			status, body := allow(t, r, "default/bucket", "probe-"+r.admin)
			if status == http.StatusOK && body["limit"] == float64(limit+10) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %s still answers %d %v after the policy change", r.decisions, status, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, policy := range []string{"default/bucket", "default/window", "default/quota"} {
		if got := hammer(t, replicas, policy, "one-client", 10); got != 10 {
			t.Errorf("%s: after raising the limit by 10, the client was admitted %d more, want 10", policy, got)
		}
	}
}

// TestReplicasOnMemoryOverAdmit is the problem the Redis store solves: three replicas each
// keeping state in memory admit the client up to three times its limit.
func TestReplicasOnMemoryOverAdmit(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "policies.yaml")
	writePolicies(t, file, policies(limit))
	replicas := startReplicas(t, 3, file, "--store", "memory")
	for _, policy := range []string{"default/bucket", "default/window"} {
		if got := hammer(t, replicas, policy, "one-client", 2*limit); got <= limit {
			t.Errorf("%s: three replicas in memory admitted %d, want more than the limit %d", policy, got, limit)
		} else {
			t.Logf("%s: three replicas in memory admitted %d requests for a limit of %d", policy, got, limit)
		}
	}
}

// TestReplicasOnCluster runs the replicas against a 3-master Redis Cluster.
func TestReplicasOnCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	file := filepath.Join(t.TempDir(), "policies.yaml")
	writePolicies(t, file, policies(limit))
	replicas := startReplicas(t, 3, file, "--store", "redis", "--redis-addr", strings.Join(cluster.Addrs(), ","), "--store-timeout", "5s")
	for _, policy := range []string{"default/bucket", "default/window", "default/quota"} {
		if got := hammer(t, replicas, policy, "one-client", 2*limit); got != limit {
			t.Errorf("%s: three replicas on a cluster admitted %d, want exactly the limit %d", policy, got, limit)
		}
	}
	// Many clients spread over the masters.
	for i := range 30 {
		if status, _ := allow(t, replicas[i%3], "default/bucket", "spread-"+strconv.Itoa(i)); status != http.StatusOK {
			t.Fatalf("client %d: status %d", i, status)
		}
	}
	for _, node := range cluster.Nodes {
		if n, _ := strconv.Atoi(node.Do(t, "DBSIZE")); n == 0 {
			t.Errorf("cluster master %s holds no client: keys do not spread over slots", node.Addr())
		}
	}

	// The conformance table and the race on one key hold on the cluster too.
	c, err := redisstore.New(redisstore.Options{Addrs: cluster.Addrs(), Clock: redisstore.CallerClock,
		ExpirySlack: time.Hour, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A batch's keys spread over the masters: one pipeline a node, decided in order; a stack's
	// keys share their client's slot: one script decides them on one master.
	limitertest.Run(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
	limitertest.RunConcurrent(t, c.Store(t.Name()), 16, 20, 50)
	limitertest.RunReset(t, func(t *testing.T) limiter.Store { return c.Store(t.Name()) })
}

// failureModePolicies has one token-bucket policy of 3 units an hour per failure mode, named
// after it in lower case.
const failureModePolicies = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: open}
spec:
  defaultTier: standard
  failureMode: Open
  tiers: [{name: standard, algorithm: TokenBucket, tokenBucket: {capacity: 3, refillRate: 1, refillPeriod: 1h}}]
---
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: closed}
spec:
  defaultTier: standard
  failureMode: Closed
  tiers: [{name: standard, algorithm: TokenBucket, tokenBucket: {capacity: 3, refillRate: 1, refillPeriod: 1h}}]
---
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: local}
spec:
  defaultTier: standard
  failureMode: Local
  tiers: [{name: standard, algorithm: TokenBucket, tokenBucket: {capacity: 3, refillRate: 1, refillPeriod: 1h}}]
`

// TestReadinessAndFailureMode stops Redis under a running replica: the replica stays ready,
// since it still answers every decision as its policies say; /readyz?verbose and
// limiterd_store_up report the store; each failure mode decides (Open admits, Closed rejects,
// Local applies the limit in process) within the timeout, counted as store errors; and all
// recovers when Redis is back.
func TestReadinessAndFailureMode(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	file := filepath.Join(t.TempDir(), "policies.yaml")
	writePolicies(t, file, failureModePolicies)
	r := startReplica(t, "--policy-file", file, "--store", "redis", "--redis-addr", srv.Addr(), "--store-timeout", "100ms")
	get := func(path string) (int, string) {
		resp, err := httpClient.Get(r.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	metric := func(sample string) float64 {
		_, body := get("/metrics")
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, sample+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		return -1
	}
	if status, body := get("/readyz?verbose"); status != http.StatusOK || !strings.Contains(body, `"store":"ok"`) {
		t.Fatalf("/readyz?verbose with redis up: %d %s", status, body)
	}
	for _, p := range []string{"open", "closed", "local"} {
		if status, _ := allow(t, r, "default/"+p, "k"); status != http.StatusOK {
			t.Fatalf("%s: decision with redis up: %d", p, status)
		}
	}

	srv.Stop()
	for _, tc := range []struct {
		policy string
		want   []int // statuses of successive decisions for a client unknown to the local store
	}{
		{"open", []int{200, 200, 200, 200, 200}},
		{"closed", []int{429, 429, 429, 429, 429}},
		{"local", []int{200, 200, 200, 429, 429}},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			before := metric(`limiterd_store_errors_total{policy="default/` + tc.policy + `"}`)
			for i, want := range tc.want {
				start := time.Now()
				status, body := allow(t, r, "default/"+tc.policy, "down")
				if status != want {
					t.Fatalf("decision %d with redis down under failureMode %s: %d %v, want %d", i, tc.policy, status, body, want)
				}
				if took := time.Since(start); took > 5*time.Second {
					t.Fatalf("decision with redis down took %v", took)
				}
			}
			if n := metric(`limiterd_store_errors_total{policy="default/` + tc.policy + `"}`); n < before+float64(len(tc.want)) {
				t.Errorf("limiterd_store_errors_total = %v after %d failed decisions (was %v)", n, len(tc.want), before)
			}
		})
	}
	status, body := get("/readyz")
	if status != http.StatusOK {
		t.Errorf("/readyz with redis down: %d %s, want 200: the failure modes answer", status, body)
	}
	if status, body := get("/readyz?verbose"); status != http.StatusOK || !strings.Contains(body, `"store":"ping redis`) {
		t.Errorf("/readyz?verbose with redis down: %d %s, want 200 with the store's error", status, body)
	}
	deadline := time.Now().Add(20 * time.Second)
	for metric("limiterd_store_up") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("limiterd_store_up is not 0 with redis down")
		}
		time.Sleep(100 * time.Millisecond)
	}

	srv.Restart(t)
	deadline = time.Now().Add(30 * time.Second)
	for i := 0; ; i++ { // a new client each time: a client's allowance is 3
		if decided, _ := allow(t, r, "default/closed", fmt.Sprint("back-", i)); decided == http.StatusOK && metric("limiterd_store_up") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("limiterd did not recover after redis came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestResetReachesEveryReplica resets a client through one replica's admin API while another
// replica has the client's rejection in its local reject cache: the other replica admits the
// client again at once, instead of rejecting it until the retry time it cached (an hour).
func TestResetReachesEveryReplica(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	file := filepath.Join(t.TempDir(), "policies.yaml")
	writePolicies(t, file, policies(limit))
	replicas := startReplicas(t, 2, file, "--store", "redis", "--redis-addr", srv.Addr(), "--store-timeout", "5s",
		"--redis-local-reject-cache", "1000")
	a, b := replicas[0], replicas[1]
	for _, policy := range []string{"default/bucket", "default/window"} {
		if got := hammer(t, []*replica{b}, policy, "one-client", 2*limit); got != limit {
			t.Fatalf("%s: admitted %d, want %d", policy, got, limit)
		}
		req, err := http.NewRequest(http.MethodDelete, a.admin+"/v1/clients?policy="+policy+"&key=one-client", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("%s: reset through replica a: %d", policy, resp.StatusCode)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			status, body := allow(t, b, policy, "one-client")
			if status == http.StatusOK {
				if body["remaining"] != float64(limit-1) {
					t.Errorf("%s: first decision on replica b after the reset: %v, want a fresh client", policy, body)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: replica b still answers %d %v 10s after the reset through replica a", policy, status, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if hits := metric(t, b, "limiterd_reject_cache_hits_total"); hits < limit/2 {
		t.Errorf("replica b answered %v rejections from its cache, want most of the %d", hits, 2*limit)
	}
	if n := metric(t, b, "limiterd_reject_cache_resets_received_total"); n != 2 {
		t.Errorf("replica b received %v resets, want 2", n)
	}
}

// metric returns the value of an unlabelled metric of a replica (0 when absent).
func metric(t *testing.T, r *replica, name string) float64 {
	t.Helper()
	resp, err := httpClient.Get(r.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// stackedPolicy is default/stack: a stacked tier of a bucket of 40 and a window of 60, both an
// hour, so that nothing refills during a test.
const stackedPolicy = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: stack
spec:
  defaultTier: paid
  failureMode: Closed
  tiers:
  - name: paid
    limits:
    - {name: burst, algorithm: TokenBucket, tokenBucket: {capacity: 40, refillRate: 1, refillPeriod: 1h}}
    - {name: daily, algorithm: SlidingWindow, slidingWindow: {limit: 60, window: 1h}}
`

// decideCost asks a replica to admit cost units for the client (0: a peek) and returns the
// status and body.
func decideCost(t *testing.T, r *replica, policy, key string, cost int) (int, map[string]any) {
	t.Helper()
	resp, err := httpClient.Post(r.decisions+"/v1/allow", "application/json",
		strings.NewReader(fmt.Sprintf(`{"policy":%q,"key":%q,"cost":%d}`, policy, key, cost)))
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	defer func() { _ = resp.Body.Close() }()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Error(err)
	}
	return resp.StatusCode, body
}

// TestReplicasShareAStackAllOrNothing drives one client of a stacked tier through three
// replicas on one Redis at once, with costs of 1 to 3: the units admitted never exceed the
// tighter limit, and each limit is charged exactly the units admitted, so that a rejection
// charged no limit whichever replica decided it and whichever replicas raced it.
func TestReplicasShareAStackAllOrNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	file := filepath.Join(t.TempDir(), "policies.yaml")
	writePolicies(t, file, stackedPolicy)
	replicas := startReplicas(t, 3, file, "--store", "redis", "--redis-addr", srv.Addr(), "--store-timeout", "5s")
	var (
		wg                 sync.WaitGroup
		mu                 sync.Mutex
		admitted, rejected int
	)
	for ri, r := range replicas {
		for g := range 8 {
			wg.Go(func() {
				for i := range 20 {
					cost := 1 + (ri+g+i)%3
					status, body := decideCost(t, r, "default/stack", "one-client", cost)
					mu.Lock()
					switch status {
					case http.StatusOK:
						admitted += cost
					case http.StatusTooManyRequests:
						rejected++
					default:
						t.Errorf("status %d: %v", status, body)
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if admitted > 40 || rejected == 0 {
		t.Fatalf("three replicas admitted %d units of a stack whose tighter limit is 40 (%d rejections)", admitted, rejected)
	}
	for _, r := range replicas {
		status, body := decideCost(t, r, "default/stack", "one-client", 0)
		limits, _ := body["limits"].([]any)
		if status == 0 || len(limits) != 2 {
			t.Fatalf("peek through %s: %d %v", r.decisions, status, body)
		}
		for i, want := range []int{40 - admitted, 60 - admitted} {
			l, _ := limits[i].(map[string]any)
			if got := l["remaining"]; got != float64(want) {
				t.Errorf("replica %s: limit %v has %v remaining after %d units admitted, want %d", r.decisions, l["name"], got, admitted, want)
			}
		}
	}
	t.Logf("three replicas admitted %d units of 40 and rejected %d requests", admitted, rejected)
}
