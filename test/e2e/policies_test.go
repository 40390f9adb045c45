package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// changeDeadline is how soon after `kubectl apply` returns limiterd must decide by the change.
const changeDeadline = 2 * time.Second

// The policy "api" as a user edits it.
const (
	// tokenBucketPolicy: every client may make 5 requests an hour.
	tokenBucketPolicy = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
  namespace: %s
spec:
  defaultTier: standard
  tiers:
  - name: standard
    algorithm: TokenBucket
    tokenBucket: {capacity: 5, refillRate: 1, refillPeriod: 1h}
`
	// slidingWindowPolicy changes the default tier's algorithm: 7 requests in any hour.
	slidingWindowPolicy = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
  namespace: %s
spec:
  defaultTier: standard
  tiers:
  - name: standard
    algorithm: SlidingWindow
    slidingWindow: {limit: 7, window: 1h}
`
	// overridePolicy gives the client "vip" a tier of its own, without a limit.
	overridePolicy = slidingWindowPolicy + `  - name: vip
    algorithm: Unlimited
  overrides:
  - tier: vip
    clients: [vip]
`
)

// load sends decision requests from a few keep-alive clients until stopped, and counts the
// answers by status.
type load struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	ok, lim  atomic.Int64 // 200, 429
	other    atomic.Int64 // anything else, errors included
	mu       sync.Mutex
	examples []string // of the other answers
}

// startLoad starts workers sending requests for policy to base, for at most maxDuration.
func startLoad(base, policy string, workers int, maxDuration time.Duration) *load {
	l := &load{stop: make(chan struct{})}
	deadline := time.Now().Add(maxDuration)
	for w := range workers {
		l.wg.Go(func() {
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer c.CloseIdleConnections()
			for i := 0; time.Now().Before(deadline); i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				a, err := decide(c, base, policy, fmt.Sprintf("load-%d-%d", w, i%4))
				switch {
				case err == nil && a.status == http.StatusOK:
					l.ok.Add(1)
				case err == nil && a.status == http.StatusTooManyRequests:
					l.lim.Add(1)
				default:
					l.other.Add(1)
					l.mu.Lock()
					if len(l.examples) < 5 {
						l.examples = append(l.examples, fmt.Sprintf("status %d, error %v, body %+v", a.status, err, a.body))
					}
					l.mu.Unlock()
				}
				time.Sleep(2 * time.Millisecond) // leave CPU to the control plane
			}
		})
	}
	return l
}

// finish stops the load and waits for it.
func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
}

// TestPoliciesFollowKubectl installs the CRD with kubectl, runs the operator and limiterd as
// processes, and checks that limiterd's decisions follow each `kubectl apply` within 2s, under
// continuous load, with every request answered 200 or 429 and limiterd never restarted.
func TestPoliciesFollowKubectl(t *testing.T) {
	managerBin, limiterdBin := binaries(t)
	env := testenv.NewWithoutCRDs(t)
	installCRDWithKubectl(t, env)
	createNamespace(t, env, statusNamespace)
	ns := env.Namespace(t)
	policyID := ns + "/api"

	startProcess(t, "manager", env.KubeconfigPath(), managerBin,
		"--metrics-bind-address=0", "--health-probe-bind-address="+freeAddr(t))
	ld := startLimiterd(t, "limiterd", env.KubeconfigPath(), limiterdBin,
		"--replica-name=limiterd-e2e", "--status-namespace="+statusNamespace)
	pid := ld.cmd.Process.Pid
	started := processStartTime(t, ld.admin)
	c := &http.Client{Timeout: 10 * time.Second}

	// Ready with no policy: an unknown policy is 404, not 503.
	if a, err := decide(c, ld.decisions, policyID, "k"); err != nil || a.status != http.StatusNotFound {
		t.Fatalf("before any policy: %d %v, want 404", a.status, err)
	}

	mustKubectl(t, env, fmt.Sprintf(tokenBucketPolicy, ns), "apply", "-f", "-")
	testsupport.Eventually(t, waitTimeout, "policy served", func() error {
		a, err := decide(c, ld.decisions, policyID, "first")
		switch {
		case err != nil:
			return err
		case a.status != http.StatusOK || a.limitOf() != "5":
			return fmt.Errorf("decision %d, limit %s; want 200 with limit 5", a.status, a.limitOf())
		}
		return nil
	})
	for i := 2; i <= 6; i++ { // 5 an hour
		a, err := decide(c, ld.decisions, policyID, "first")
		if want := map[bool]int{true: 200, false: 429}[i <= 5]; err != nil || a.status != want {
			t.Fatalf("request %d of a client: %d %v, want %d", i, a.status, err, want)
		}
	}

	traffic := startLoad(ld.decisions, policyID, 4, 2*time.Minute)
	defer func() {
		if traffic != nil {
			traffic.finish()
		}
	}()
	probe := 0
	// applyAndWait applies a policy and waits until fresh clients, and the client "vip" unless
	// vipLimit is empty, are answered 200 with the limits given; it fails if that takes longer
	// than changeDeadline.
	applyAndWait := func(t *testing.T, policy, freshLimit, vipLimit string) {
		t.Helper()
		start := time.Now()
		mustKubectl(t, env, fmt.Sprintf(policy, ns), "apply", "-f", "-")
		applied := time.Now()
		var last string
		for {
			probe++
			fresh, err1 := decide(c, ld.decisions, policyID, "probe-"+strconv.Itoa(probe))
			vip, err2 := fresh, err1
			if vipLimit != "" {
				vip, err2 = decide(c, ld.decisions, policyID, "vip")
			} else {
				vipLimit = freshLimit
			}
			if err1 == nil && err2 == nil && fresh.limitOf() == freshLimit && vip.limitOf() == vipLimit &&
				fresh.status == http.StatusOK && vip.status == http.StatusOK {
				t.Logf("decisions changed %v after kubectl apply returned (it ran %v)",
					time.Since(applied).Round(time.Millisecond), applied.Sub(start).Round(time.Millisecond))
				return
			}
			last = fmt.Sprintf("fresh client: %d limit %s (%v); vip: %d limit %s (%v)",
				fresh.status, fresh.limitOf(), err1, vip.status, vip.limitOf(), err2)
			if time.Since(applied) > changeDeadline {
				t.Fatalf("decisions not changed within %v of kubectl apply: %s; want limits %s and %s",
					changeDeadline, last, freshLimit, vipLimit)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Run("default tier's algorithm", func(t *testing.T) {
		applyAndWait(t, slidingWindowPolicy, "7", "")
	})
	t.Run("one client's own tier", func(t *testing.T) {
		applyAndWait(t, overridePolicy, "7", "none")
		for range 20 {
			if a, err := decide(c, ld.decisions, policyID, "vip"); err != nil || a.status != http.StatusOK {
				t.Fatalf("vip: %d %v, want 200 always", a.status, err)
			}
		}
	})

	traffic.finish()
	ok, limited, other := traffic.ok.Load(), traffic.lim.Load(), traffic.other.Load()
	t.Logf("load: %d answered 200, %d answered 429, %d otherwise", ok, limited, other)
	if other != 0 {
		t.Errorf("%d requests under load answered neither 200 nor 429, e.g. %v", other, traffic.examples)
	}
	if ok == 0 || limited == 0 {
		t.Errorf("load: %d answered 200 and %d 429; want both", ok, limited)
	}
	traffic = nil
	if !ld.running() || ld.cmd.Process.Pid != pid || processStartTime(t, ld.admin) != started {
		t.Errorf("limiterd restarted: running %v, pid %d (was %d)", ld.running(), ld.cmd.Process.Pid, pid)
	}

	t.Run("invalid policies are refused naming the field", func(t *testing.T) {
		for _, tc := range []struct{ name, policy, field string }{
			{"capacity 0", strings.Replace(fmt.Sprintf(tokenBucketPolicy, ns), "capacity: 5", "capacity: 0", 1),
				"spec.tiers[0].tokenBucket.capacity"},
			{"unknown default tier", strings.Replace(fmt.Sprintf(tokenBucketPolicy, ns), "defaultTier: standard", "defaultTier: gold", 1),
				"spec.defaultTier"},
			{"block of another algorithm", strings.Replace(fmt.Sprintf(slidingWindowPolicy, ns), "algorithm: SlidingWindow", "algorithm: TokenBucket", 1),
				"spec.tiers[0].tokenBucket"},
		} {
			_, errOut, err := kubectl(env, tc.policy, "apply", "-f", "-")
			if err == nil || !strings.Contains(errOut, tc.field) {
				t.Errorf("%s: kubectl apply: %v, %q; want refused naming %s", tc.name, err, errOut, tc.field)
			}
		}
		// The policy in service is unchanged.
		if a, err := decide(c, ld.decisions, policyID, "vip"); err != nil || a.limitOf() != "none" {
			t.Errorf("after refused applies: vip limit %s, %v; want none", a.limitOf(), err)
		}
	})

	t.Run("a deleted policy answers 404", func(t *testing.T) {
		// The operator deletes the policy's ConfigMap (in limiterd's namespace: no owner reference).
		mustKubectl(t, env, "", "delete", "ratelimitpolicy", "-n", ns, "api")
		testsupport.Eventually(t, waitTimeout, "policy change served", func() error {
			a, err := decide(c, ld.decisions, policyID, "k")
			switch {
			case err != nil:
				return err
			case a.status != http.StatusNotFound:
				return fmt.Errorf("decision for a deleted policy: %d, want 404", a.status)
			}
			return nil
		})
	})
}
