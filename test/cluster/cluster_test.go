package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
)

const (
	release   = "limiterd"
	namespace = "limiterd-system" // the release's namespace: limiterd's status Leases live here
	policyNS  = "shop"
	policy    = policyNS + "/api"
	// The Redis server the test starts on the node's address, for the pods.
	redisPort = "6479"
)

// limiterdSelector selects the limiterd pods of the release (not the operator's).
var limiterdSelector = "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component=limiterd"

// policyYAML is the test's RateLimitPolicy: standard is the algorithm under test (no refill
// within the test, so counts are exact), load is unlimited for the load generator, inflight a
// concurrency limit (its lease metrics are on the dashboard).
func policyYAML(standard string) string {
	return `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
  namespace: ` + policyNS + `
spec:
  defaultTier: standard
  failureMode: Local
  tiers:
    - name: standard
` + standard + `
    - name: load
      algorithm: Unlimited
    - name: inflight
      algorithm: Concurrency
      concurrency: {limit: 2, leaseTimeout: 1m}
  overrides:
    - tier: load
      clientPrefixes: ["load:"]
    - tier: inflight
      clientPrefixes: ["inflight:"]
`
}

const (
	tokenBucket10 = `      algorithm: TokenBucket
      tokenBucket: {capacity: 10, refillRate: 1, refillPeriod: 24h}`
	slidingWindow3 = `      algorithm: SlidingWindow
      slidingWindow: {limit: 3, window: 24h}`
	slidingWindow10 = `      algorithm: SlidingWindow
      slidingWindow: {limit: 10, window: 24h}`
)

func TestCluster(t *testing.T) {
	prerequisites(t)
	lockNode(t)
	start := time.Now()
	defer func() { t.Logf("TestCluster took %v", time.Since(start).Round(time.Second)) }()

	sysctlsBefore := readSysctls(t)
	n := startNode(t)

	// Each step leaves the release in a state the next can use, so a failed step does not stop
	// the others (one run reports every fault); only a failed install does.
	step := func(name string, f func(t *testing.T)) bool {
		t0 := time.Now()
		ok := t.Run(name, f)
		t.Logf("step %s: %v", name, time.Since(t0).Round(100*time.Millisecond))
		return ok
	}

	if !step("install", func(t *testing.T) { testInstall(t, n) }) {
		t.FailNow()
	}
	step("decisions", func(t *testing.T) { testDecisions(t, n) })
	step("grpc decisions", func(t *testing.T) { testGRPCDecisions(t, n) })
	step("own lease only", func(t *testing.T) { testForgedLease(t, n) })
	step("algorithm change", func(t *testing.T) { testAlgorithmChange(t, n) })
	step("rolling restart", func(t *testing.T) { testRollingRestart(t, n) })
	step("pod disruption budget", func(t *testing.T) { testPDB(t, n) })
	step("replica leaves", func(t *testing.T) { testReplicaLeaves(t, n) })
	step("redis", func(t *testing.T) { testRedis(t, n) })
	step("metrics", func(t *testing.T) { testMetrics(t, n) })
	step("uninstall", func(t *testing.T) { testUninstall(t, n) })
	step("node down", func(t *testing.T) { testNodeDown(t, n, sysctlsBefore) })
}

// ---------------------------------------------------------------------------------------- install

func testInstall(t *testing.T, n *node) {
	image := func(ref string) (repo, tag string) {
		i := strings.LastIndex(ref, ":")
		return ref[:i], ref[i+1:]
	}
	lRepo, lTag := image(os.Getenv("IMG_LIMITERD"))
	mRepo, mTag := image(os.Getenv("IMG_MANAGER"))
	// pullPolicy Never: the images were imported into the node's containerd; nothing may be pulled
	// from a registry (this machine must not reach one).
	n.helm(t, "install", release, filepath.Join(repoRoot(t), "charts", "limiterd"),
		"--namespace", namespace, "--create-namespace", "--wait", "--timeout", "3m",
		"--set", "limiterd.image.repository="+lRepo, "--set", "limiterd.image.tag="+lTag,
		"--set", "operator.image.repository="+mRepo, "--set", "operator.image.tag="+mTag,
		"--set", "limiterd.image.pullPolicy=Never", "--set", "operator.image.pullPolicy=Never",
		"--set", "limiterd.podDisruptionBudget.enabled=true", "--set", "limiterd.podDisruptionBudget.minAvailable=1",
		"--set", "limiterd.grpc.enabled=true")

	// The operator and 2 limiterd replicas are Ready, through their real probes, and stay up.
	pods := readyPods(t, n, "app.kubernetes.io/instance="+release, 3)
	for _, p := range pods {
		c := p.Spec.Containers[0]
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil {
			t.Errorf("pod %s: container %s has no HTTP readiness and liveness probes", p.Name, c.Name)
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount != 0 {
				t.Errorf("pod %s: container %s restarted %d times", p.Name, s.Name, s.RestartCount)
			}
		}
		if p.Spec.SecurityContext == nil || p.Spec.SecurityContext.RunAsUser == nil || *p.Spec.SecurityContext.RunAsUser != 65532 {
			t.Errorf("pod %s does not run as 65532", p.Name)
		}
	}
	if got := len(limiterdPods(t, n)); got != 2 {
		t.Fatalf("%d limiterd pods, want 2", got)
	}

	// kubectl apply the policy; the operator renders it, both replicas serve it.
	apply(t, n, policyYAML(tokenBucket10))
	waitEnforced(t, n, "2/2")
}

// readyPods waits until want pods match selector, all Ready, none terminating, and returns them.
func readyPods(t *testing.T, n *node, selector string, want int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	testsupport.Eventually(t, 3*time.Minute, fmt.Sprintf("%d Ready pods %s", want, selector), func() error {
		list, err := n.cs.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s is terminating", p.Name)
			}
			if !podReady(&p) {
				return fmt.Errorf("pod %s is not Ready (%s)", p.Name, p.Status.Phase)
			}
			pods = append(pods, p)
		}
		if len(pods) != want {
			return fmt.Errorf("%d pods", len(pods))
		}
		return nil
	})
	return pods
}

func limiterdPods(t *testing.T, n *node) []corev1.Pod {
	t.Helper()
	list, err := n.cs.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: limiterdSelector})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// apply server-side applies a manifest, as kubectl apply --server-side does.
func apply(t *testing.T, n *node, manifest string) {
	t.Helper()
	ctx := t.Context()
	if _, err := n.cs.CoreV1().Namespaces().Get(ctx, policyNS, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := n.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: policyNS}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	body, err := yaml.YAMLToJSON([]byte(manifest))
	if err != nil {
		t.Fatal(err)
	}
	force := true
	err = n.cs.RESTClient().Patch(types.ApplyPatchType).AbsPath("/apis/limiterd.dev/v1alpha1/namespaces", policyNS, "ratelimitpolicies", "api").
		Param("fieldManager", "kubectl").Param("force", fmt.Sprint(force)).Body(body).Do(ctx).Error()
	if err != nil {
		t.Fatalf("apply the policy: %v", err)
	}
}

func getPolicy(t *testing.T, n *node) *limiterdv1alpha1.RateLimitPolicy {
	t.Helper()
	var p limiterdv1alpha1.RateLimitPolicy
	if err := n.c.Get(t.Context(), client.ObjectKey{Namespace: policyNS, Name: "api"}, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// waitEnforced waits until the policy's current generation is rendered and status.enforced is want.
func waitEnforced(t *testing.T, n *node, want string) {
	t.Helper()
	testsupport.Eventually(t, 90*time.Second, "policy enforced "+want, func() error {
		p := getPolicy(t, n)
		if p.Status.ObservedGeneration != p.Generation || p.Status.Enforced != want || p.Status.EnforcedReplicas != p.Status.Replicas {
			return fmt.Errorf("generation %d, status %+v", p.Generation, p.Status)
		}
		return nil
	})
}

// --------------------------------------------------------------------------------------- decisions

func serviceURL(t *testing.T, n *node, name string, port int32) string {
	t.Helper()
	return "http://" + net.JoinHostPort(clusterIP(t, getService(t, n, name)), fmt.Sprint(port))
}

func getService(t *testing.T, n *node, name string) *corev1.Service {
	t.Helper()
	svc, err := n.cs.CoreV1().Services(namespace).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func clusterIP(t *testing.T, svc *corev1.Service) string {
	t.Helper()
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == "None" {
		t.Fatalf("service %s has no ClusterIP", svc.Name)
	}
	return svc.Spec.ClusterIP
}

func podURL(p corev1.Pod, port int) string {
	return "http://" + net.JoinHostPort(p.Status.PodIP, fmt.Sprint(port))
}

// freshClient sends each request on a new connection, so that the Service spreads them.
var freshClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}

func testDecisions(t *testing.T, n *node) {
	svc := serviceURL(t, n, release, 8080)
	// Through the Service's ClusterIP, from the host: each replica keeps its own buckets (memory
	// store), so the Service admits between 10 (all on one replica) and 20.
	counts := map[int]int{}
	for i := range 40 {
		d, err := allow(freshClient, svc, policy, "svc-client")
		if err != nil {
			t.Fatalf("request %d through the Service: %v", i, err)
		}
		counts[d.status]++
		if d.status == http.StatusTooManyRequests && d.retryAfter == "" {
			t.Errorf("429 without Retry-After")
		}
	}
	if counts[200] < 10 || counts[200] > 20 || counts[429] != 40-counts[200] {
		t.Errorf("through the Service: %v, want 10-20 allowed and the rest 429", counts)
	}
	// One replica directly: exactly the capacity.
	pods := limiterdPods(t, n)
	if got := admitted(t, []corev1.Pod{pods[0]}, "pod-client", 15); got != 10 {
		t.Errorf("pod %s admitted %d of 15, want the capacity 10", pods[0].Name, got)
	}
}

// testGRPCDecisions asks Envoy's rate-limit service (ShouldRateLimit) through the decisions
// Service's port "grpc", from the host, as Envoy's ratelimit filter does. The domain is the
// policy; the policy has no spec.envoy.descriptorKey, so the whole descriptor is the client key.
// One connection stays on one replica (kube-proxy balances connections, not calls), so its
// token bucket of 10 decides exactly: 10 OK, then OVER_LIMIT.
func testGRPCDecisions(t *testing.T, n *node) {
	svc := getService(t, n, release)
	var port int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			port = p.Port
		}
	}
	if port != 8081 {
		t.Fatalf("decisions Service ports %+v: no port grpc 8081 with limiterd.grpc.enabled", svc.Spec.Ports)
	}
	conn, err := grpc.NewClient(net.JoinHostPort(clusterIP(t, svc), fmt.Sprint(port)),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithNoProxy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: policy, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "grpc-client"}},
	}}}
	// The policy's standard tier, a token bucket of 10 refilled 1 a day: its window is the full
	// refill, 10 days.
	wantLimit := &rlsv3.RateLimitResponse_RateLimit{
		Name: "standard", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_DAY, UnitMultiplier: wrapperspb.UInt32(10),
	}
	for i := range 12 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		resp, err := c.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("ShouldRateLimit %d through the Service: %v", i, err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i >= 10 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if len(resp.GetStatuses()) != 1 {
			t.Fatalf("ShouldRateLimit %d: %d statuses, want 1: %v", i, len(resp.GetStatuses()), resp)
		}
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != want || st.GetCode() != want {
			t.Errorf("ShouldRateLimit %d: overall %v, descriptor %v, want %v", i, resp.GetOverallCode(), st.GetCode(), want)
		}
		if !proto.Equal(st.GetCurrentLimit(), wantLimit) {
			t.Errorf("ShouldRateLimit %d: current_limit %v, want %v", i, st.GetCurrentLimit(), wantLimit)
		}
		if i < 10 && st.GetLimitRemaining() != uint32(9-i) {
			t.Errorf("ShouldRateLimit %d: limit_remaining %d, want %d", i, st.GetLimitRemaining(), 9-i)
		}
	}
	t.Logf("12 ShouldRateLimit calls through %s:%d: 10 OK, then OVER_LIMIT, current_limit %v", svc.Spec.ClusterIP, port, wantLimit)
}

// admitted sends total requests for key, round robin over pods, and returns how many were allowed;
// any answer but 200 or 429 fails the test.
func admitted(t *testing.T, pods []corev1.Pod, key string, total int) int {
	t.Helper()
	ok := 0
	for i := range total {
		p := pods[i%len(pods)]
		d, err := allow(freshClient, podURL(p, 8080), policy, key)
		if err != nil {
			t.Fatalf("request to pod %s: %v", p.Name, err)
		}
		switch d.status {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("pod %s answered %d", p.Name, d.status)
		}
	}
	return ok
}

// ------------------------------------------------------------------------------------- own lease

// testForgedLease checks the status Leases come from the real pods, and that a pod's own bound
// token (read from the kubelet's volume for that pod) cannot write another replica's Lease.
func testForgedLease(t *testing.T, n *node) {
	ctx := t.Context()
	pods := limiterdPods(t, n)
	leases := replicaLeases(t, n)
	names := podNames(pods)
	if !slices.Equal(leaseNames(leases), names) {
		t.Fatalf("status Leases %v, want one per pod %v", leaseNames(leases), names)
	}
	for _, l := range leases {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != l.Name {
			t.Errorf("Lease %s holder %v", l.Name, l.Spec.HolderIdentity)
		}
	}

	a, b := pods[0], pods[1]
	token := podToken(t, n, a)
	cfg := rest.AnonymousClientConfig(n.config)
	cfg.BearerToken = token
	as := kubernetes.NewForConfigOrDie(cfg)
	// The token is real and works: pod a reads its own Lease.
	if _, err := as.CoordinationV1().Leases(namespace).Get(ctx, a.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("pod %s reads its own Lease with its token: %v", a.Name, err)
	}
	// Writing b's Lease is refused by the admission policy.
	other, err := as.CoordinationV1().Leases(namespace).Get(ctx, b.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %s reads Lease %s: %v", a.Name, b.Name, err)
	}
	forged := other.DeepCopy()
	holder := a.Name
	forged.Spec.HolderIdentity = &holder
	_, err = as.CoordinationV1().Leases(namespace).Update(ctx, forged, metav1.UpdateOptions{})
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Fatalf("pod %s updated Lease %s: err %v, want refused by the admission policy", a.Name, b.Name, err)
	}
	if !strings.Contains(err.Error(), "may write only the Lease "+a.Name) {
		t.Errorf("refusal %q does not come from the own-Lease admission policy", err)
	}
	if err := as.CoordinationV1().Leases(namespace).Delete(ctx, b.Name, metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), "may write only the Lease") {
		t.Errorf("pod %s deleting Lease %s: %v, want refused by the admission policy", a.Name, b.Name, err)
	}
}

// podToken reads the service account token the kubelet projected into pod p.
func podToken(t *testing.T, n *node, p corev1.Pod) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(n.dir, "kubelet", "pods", string(p.UID), "volumes", "kubernetes.io~projected", "*", "token"))
	if err != nil || len(files) != 1 {
		t.Fatalf("pod %s: projected token files %v (%v)", p.Name, files, err)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func replicaLeases(t *testing.T, n *node) []coordinationv1.Lease {
	t.Helper()
	list, err := n.cs.CoordinationV1().Leases(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: "limiterd.dev/replica"})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func leaseNames(ls []coordinationv1.Lease) []string {
	var names []string
	for _, l := range ls {
		names = append(names, l.Name)
	}
	slices.Sort(names)
	return names
}

func podNames(ps []corev1.Pod) []string {
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// -------------------------------------------------------------------------------- algorithm change

func testAlgorithmChange(t *testing.T, n *node) {
	before := limiterdPods(t, n)
	served := watchServedPolicy(t, before)
	edited := time.Now()
	apply(t, n, policyYAML(slidingWindow3))
	waitEnforced(t, n, "2/2")
	enforced := time.Since(edited)
	switched := served()
	// How long the replicas served different versions of the policy: SECURITY.md ("Policy
	// versions") quotes this figure. A client gets at most the more generous version meanwhile
	// (limitertest.RunSkew); here the window is measured, not bounded.
	var first, last time.Duration
	for i, p := range before {
		at, ok := switched[p.Name]
		if !ok {
			t.Fatalf("pod %s still answers with the old policy after Enforced 2/2", p.Name)
		}
		if i == 0 || at < first {
			first = at
		}
		last = max(last, at)
	}
	t.Logf("policy edit: first replica served it after %v, the last after %v (replicas disagreed for %v); Enforced 2/2 after %v",
		first.Round(time.Millisecond), last.Round(time.Millisecond), (last - first).Round(time.Millisecond), enforced.Round(time.Millisecond))
	after := limiterdPods(t, n)
	if !slices.Equal(podNames(before), podNames(after)) {
		t.Fatalf("pods changed from %v to %v: the change was not served without a restart", podNames(before), podNames(after))
	}
	for _, p := range after {
		for _, s := range p.Status.ContainerStatuses {
			if s.RestartCount != 0 {
				t.Errorf("pod %s restarted", p.Name)
			}
		}
		// The sliding window of 3 now decides: exactly 3 of 6 for a new client on each replica.
		if got := admitted(t, []corev1.Pod{p}, "window-client-"+p.Name, 6); got != 3 {
			t.Errorf("pod %s admitted %d of 6 after the change to a sliding window of 3", p.Name, got)
		}
	}
}

// watchServedPolicy polls each pod with peeks (cost 0: nothing is charged) until the
// RateLimit-Policy field of its answer differs from the first one it gave, and returns a
// function that stops the polling and gives, per pod, when its answer changed (from the call
// of watchServedPolicy, at a polling step of 20 ms).
func watchServedPolicy(t *testing.T, pods []corev1.Pod) func() map[string]time.Duration {
	t.Helper()
	start := time.Now()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil}}
	peek := func(p corev1.Pod) (string, error) {
		resp, err := c.Get(fmt.Sprintf("%s/v1/allow?policy=%s&key=served-probe&cost=0", podURL(p, 8080), policy))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("pod %s answered a peek with %d", p.Name, resp.StatusCode)
		}
		return resp.Header.Get("RateLimit-Policy"), nil
	}
	var (
		mu       sync.Mutex
		switched = map[string]time.Duration{}
		errs     []error
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	for _, p := range pods {
		initial, err := peek(p)
		if err != nil || initial == "" {
			t.Fatalf("peek at pod %s: %q, %v", p.Name, initial, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				got, err := peek(p)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else if got != initial {
					switched[p.Name] = time.Since(start)
				}
				mu.Unlock()
				if err == nil && got != initial {
					return
				}
			}
		}()
	}
	return func() map[string]time.Duration {
		close(stop)
		wg.Wait()
		for _, err := range errs {
			t.Errorf("watching the served policy: %v", err)
		}
		return switched
	}
}

// --------------------------------------------------------------------------------- rolling restart

// load sends keep-alive requests through the Service from workers until stopped, counting
// answers that are not 200 (the load: tier is unlimited) and transport errors.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	stop       chan struct{}
	wg         sync.WaitGroup
}

func startLoad(url string, workers int) *load {
	l := &load{stop: make(chan struct{})}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}}
			key := fmt.Sprintf("load:%d", w)
			deadline := time.Now().Add(5 * time.Minute) // bounded, whatever happens
			for time.Now().Before(deadline) {
				select {
				case <-l.stop:
					return
				default:
				}
				d, err := allow(c, url, policy, key)
				switch {
				case err != nil:
					l.fail(err.Error())
				case d.status != http.StatusOK:
					l.fail(fmt.Sprintf("status %d", d.status))
				default:
					l.ok.Add(1)
				}
			}
		}()
	}
	return l
}

func (l *load) fail(msg string) {
	l.failed.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < 10 {
		l.errs = append(l.errs, time.Now().Format("15:04:05.000")+" "+msg)
	}
}

func (l *load) finish() { close(l.stop); l.wg.Wait() }

func testRollingRestart(t *testing.T, n *node) {
	ctx := t.Context()
	pdb, err := n.cs.PolicyV1().PodDisruptionBudgets(namespace).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	minAvailable := pdb.Spec.MinAvailable.IntValue()
	before := podNames(limiterdPods(t, n))

	l := startLoad(serviceURL(t, n, release, 8080), 8)
	time.Sleep(2 * time.Second)
	// Watch the ready endpoints of the Service while the Deployment rolls.
	minReady, watchStop := watchReadyEndpoints(t, n)
	started := time.Now()
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := n.cs.AppsV1().Deployments(namespace).Patch(ctx, release, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, 3*time.Minute, "rollout complete", func() error {
		d, err := n.cs.AppsV1().Deployments(namespace).Get(ctx, release, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s := d.Status
		if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != *d.Spec.Replicas || s.Replicas != *d.Spec.Replicas || s.AvailableReplicas != *d.Spec.Replicas {
			return fmt.Errorf("status %+v", s)
		}
		pods := limiterdPods(t, n)
		for _, p := range pods {
			if slices.Contains(before, p.Name) {
				return fmt.Errorf("old pod %s still exists", p.Name)
			}
		}
		return nil
	})
	rollout := time.Since(started)
	time.Sleep(3 * time.Second) // load on the new pods
	l.finish()
	watchStop()
	t.Logf("rollout restart took %v; %d requests ok, %d failed during it (%.0f/s); ready endpoints never below %d",
		rollout.Round(100*time.Millisecond), l.ok.Load(), l.failed.Load(), float64(l.ok.Load())/(rollout+5*time.Second).Seconds(), *minReady)
	if l.failed.Load() != 0 {
		t.Errorf("%d requests failed during the rolling restart: %v", l.failed.Load(), l.errs)
	}
	if l.ok.Load() < 100 {
		t.Errorf("only %d requests went through: no real load", l.ok.Load())
	}
	if *minReady < minAvailable {
		t.Errorf("ready endpoints fell to %d, below the PodDisruptionBudget's minAvailable %d", *minReady, minAvailable)
	}
	// Every old replica withdrew its status record: the Leases are those of the new pods.
	pods := readyPods(t, n, limiterdSelector, 2)
	testsupport.Eventually(t, 10*time.Second, "Leases of the new pods only", func() error {
		if got, want := leaseNames(replicaLeases(t, n)), podNames(pods); !slices.Equal(got, want) {
			return fmt.Errorf("Leases %v, pods %v", got, want)
		}
		return nil
	})
	waitEnforced(t, n, "2/2")
}

// watchReadyEndpoints polls the limiterd Service's ready endpoints every 100ms; the minimum seen
// is in *min once stop returns.
func watchReadyEndpoints(t *testing.T, n *node) (minSeen *int, stop func()) {
	t.Helper()
	m := 1 << 30
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			slices, err := n.cs.DiscoveryV1().EndpointSlices(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + release})
			if err != nil {
				continue
			}
			ready := 0
			for _, s := range slices.Items {
				for _, e := range s.Endpoints {
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						ready++
					}
				}
			}
			m = min(m, ready)
		}
	}()
	return &m, func() { close(done); <-finished }
}

// testPDB evicts through the Eviction API, as kubectl drain does: one of two replicas may go
// (minAvailable 1), a second at once is refused.
func testPDB(t *testing.T, n *node) {
	ctx := t.Context()
	testsupport.Eventually(t, 30*time.Second, "PDB allows one disruption", func() error {
		pdb, err := n.cs.PolicyV1().PodDisruptionBudgets(namespace).Get(ctx, release, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pdb.Status.ObservedGeneration != pdb.Generation || pdb.Status.DisruptionsAllowed != 1 || pdb.Status.CurrentHealthy != 2 {
			return fmt.Errorf("status %+v", pdb.Status)
		}
		return nil
	})
	pods := limiterdPods(t, n)
	evict := func(p corev1.Pod) error {
		return n.cs.PolicyV1().Evictions(namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: namespace}})
	}
	if err := evict(pods[0]); err != nil {
		t.Fatalf("evict %s: %v", pods[0].Name, err)
	}
	err := evict(pods[1])
	if !apierrors.IsTooManyRequests(err) {
		t.Fatalf("second eviction: %v, want refused by the PodDisruptionBudget (429)", err)
	}
	readyPods(t, n, limiterdSelector, 2)
	waitEnforced(t, n, "2/2")
}

// testReplicaLeaves scales limiterd to one replica: the leaving replica withdraws its record, so
// the status reads 1/1 at once, not 2/2 until the record expires.
func testReplicaLeaves(t *testing.T, n *node) {
	ctx := t.Context()
	lease := replicaLeases(t, n)[0]
	duration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	if _, err := n.cs.AppsV1().Deployments(namespace).Patch(ctx, release, types.MergePatchType, []byte(`{"spec":{"replicas":1}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// From the moment one pod is terminating until the status says 1/1.
	var gone time.Time
	testsupport.Eventually(t, time.Minute, "a pod terminating", func() error {
		for _, p := range limiterdPods(t, n) {
			if p.DeletionTimestamp != nil {
				gone = time.Now()
				return nil
			}
		}
		return errors.New("none")
	})
	testsupport.Eventually(t, duration+30*time.Second, "status 1/1", func() error {
		if p := getPolicy(t, n); p.Status.Enforced != "1/1" {
			return fmt.Errorf("status %q", p.Status.Enforced)
		}
		return nil
	})
	took := time.Since(gone)
	t.Logf("status read 1/1 %v after the replica started terminating (record duration %v)", took.Round(100*time.Millisecond), duration)
	// The terminating pod keeps serving for its shutdown delay; its record must go when it stops,
	// not when the record expires.
	pods := readyPods(t, n, limiterdSelector, 1)
	testsupport.Eventually(t, 10*time.Second, "one Lease", func() error {
		if got := leaseNames(replicaLeases(t, n)); !slices.Equal(got, podNames(pods)) {
			return fmt.Errorf("Leases %v", got)
		}
		return nil
	})
	if took >= duration {
		t.Errorf("status stayed at 2/2 for %v after a replica left: the record was not withdrawn", took)
	}
}

// ------------------------------------------------------------------------------------------ redis

func testRedis(t *testing.T, n *node) {
	addr := net.JoinHostPort(n.ip, redisPort)
	redis := exec.Command("redis-server", "--bind", n.ip, "--port", redisPort, "--save", "", "--appendonly", "no", "--protected-mode", "no")
	redis.Stdout, redis.Stderr = os.Stderr, os.Stderr
	if err := redis.Start(); err != nil {
		t.Fatal(err)
	}
	stopRedis := sync.OnceFunc(func() { _ = redis.Process.Kill(); _ = redis.Wait() })
	t.Cleanup(stopRedis)
	testsupport.Eventually(t, 10*time.Second, "redis-server listening", func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err
	})

	apply(t, n, policyYAML(slidingWindow10))
	// A store timeout of 1 s, not the default 50 ms: this step asks whether two replicas share
	// one window, not how fast a test node runs them. Right after the rollout the node is busy
	// (pods starting and stopping, a pod's CPU request is 100m), and with 50 ms one decision in
	// 30 missed its deadline now and then (a store error, which failure mode Local answers from
	// one replica's memory: 11 or 13 admitted). The store errors are asserted below either way.
	n.helm(t, "upgrade", release, filepath.Join(repoRoot(t), "charts", "limiterd"), "--namespace", namespace,
		"--reuse-values", "--wait", "--timeout", "3m", "--set", "limiterd.replicaCount=2",
		"--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.addrs[0]="+addr,
		"--set", "limiterd.store.timeout=1s")
	pods := readyPods(t, n, limiterdSelector, 2)
	for _, p := range pods {
		if !slices.ContainsFunc(p.Spec.Containers[0].Args, func(a string) bool { return a == "--store=redis" }) {
			t.Fatalf("pod %s args %v: not in Redis mode", p.Name, p.Spec.Containers[0].Args)
		}
	}
	waitEnforced(t, n, "2/2")
	// Both replicas share the window: exactly the limit, together, every request decided by
	// Redis (a store error would have the failure mode, Local, decide from one replica's memory).
	token := prometheusToken(t, n)
	before := storeErrors(t, pods, token)
	got := admitted(t, pods, "shared-client", 30)
	if errs := storeErrors(t, pods, token) - before; errs != 0 {
		t.Errorf("%v store errors while 2 replicas decided 30 requests on a running Redis, want none", errs)
	}
	if got != 10 {
		t.Errorf("2 replicas on one Redis admitted %d of 30, want exactly the limit 10", got)
	}
	// Redis gone: failureMode Local keeps answering from each replica's memory, and the store
	// errors are counted (the metrics step reads them).
	stopRedis()
	for _, p := range pods {
		for i := range 3 {
			d, err := allow(freshClient, podURL(p, 8080), policy, "redis-down")
			if err != nil || (d.status != 200 && d.status != 429) {
				t.Errorf("pod %s with Redis down, request %d: %v %d, want a local decision", p.Name, i, err, d.status)
			}
		}
	}
}

// storeErrors returns the sum of limiterd_store_errors_total over pods, scraped from their admin
// port with token.
func storeErrors(t *testing.T, pods []corev1.Pod, token string) float64 {
	t.Helper()
	total := 0.0
	for _, p := range pods {
		req, err := http.NewRequest(http.MethodGet, podURL(p, 9090)+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := freshClient.Do(req)
		if err == nil && resp.StatusCode != http.StatusOK {
			_ = resp.Body.Close()
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if err != nil {
			t.Fatalf("scrape %s: %v", p.Name, err)
		}
		ss, err := parseMetrics(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatalf("scrape %s: %v", p.Name, err)
		}
		for _, s := range ss {
			if s.name == "limiterd_store_errors_total" {
				total += s.value
			}
		}
	}
	return total
}

// ---------------------------------------------------------------------------------------- metrics

// testMetrics scrapes /metrics from each limiterd pod, as Prometheus does through the admin
// Service's endpoints, and checks that every metric the Grafana dashboard queries exists with the
// labels and label values the dashboard uses.
// memoryStoreOnly are the dashboard's metrics that a replica exports only for the policies it
// decides in memory (docs/metrics.md, "Leases"): testMetrics runs on --store redis, where they
// have no series. limiterd/metrics' TestLeaseMetrics holds them on the memory store.
var memoryStoreOnly = map[string]bool{"limiterd_leases_held": true, "limiterd_leases_expired_total": true}

func testMetrics(t *testing.T, n *node) {
	ctx := t.Context()
	// The target labels Prometheus adds to each series scraped through a ServiceMonitor.
	targetLabels := []string{"namespace", "pod", "service", "endpoint", "instance", "job", "container"}
	slices2, err := n.cs.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + release + "-admin"})
	if err != nil {
		t.Fatal(err)
	}
	token := prometheusToken(t, n)
	var all []series
	scraped := 0
	for _, s := range slices2.Items {
		for _, e := range s.Endpoints {
			if e.TargetRef == nil || len(e.Addresses) == 0 {
				continue
			}
			url := "http://" + net.JoinHostPort(e.Addresses[0], "9090") + "/metrics"
			// The admin API authenticates its callers: no token, no metrics.
			if resp, err := freshClient.Get(url); err != nil || resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("scrape %s without a token: %v %v, want 401", e.TargetRef.Name, err, resp)
			} else {
				_ = resp.Body.Close()
			}
			req, err := http.NewRequest(http.MethodGet, url, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := freshClient.Do(req)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			if err != nil {
				t.Fatalf("scrape %s: %v", e.TargetRef.Name, err)
			}
			ss, err := parseMetrics(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				t.Fatalf("scrape %s: %v", e.TargetRef.Name, err)
			}
			for i := range ss {
				ss[i].labels["namespace"], ss[i].labels["pod"] = namespace, e.TargetRef.Name
			}
			all = append(all, ss...)
			scraped++
		}
	}
	if scraped != 2 {
		t.Fatalf("scraped %d pods through the admin Service's endpoints, want 2", scraped)
	}

	b, err := os.ReadFile(filepath.Join(repoRoot(t), "charts", "limiterd", "files", "dashboards", "limiterd.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	metricRef := regexp.MustCompile(`\b(limiterd_[a-z0-9_]+)(\{[^}]*\})?`)
	matcher := regexp.MustCompile(`([a-z_]+)\s*(=~|!=|!~|=)\s*"([^"]*)"`)
	grouping := regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	checked := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			var groupLabels []string
			for _, g := range grouping.FindAllStringSubmatch(tg.Expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					groupLabels = append(groupLabels, strings.TrimSpace(l))
				}
			}
			for _, ref := range metricRef.FindAllStringSubmatch(tg.Expr, -1) {
				name := ref[1]
				var have []series
				for _, s := range all {
					if s.name == name {
						have = append(have, s)
					}
				}
				if len(have) == 0 && memoryStoreOnly[name] {
					continue // this step runs on --store redis: see memoryStoreOnly
				}
				if len(have) == 0 {
					t.Errorf("panel %q: %s is not exported by the pods", p.Title, name)
					continue
				}
				checked++
				hasLabel := func(l string) bool {
					return slices.Contains(targetLabels, l) || slices.ContainsFunc(have, func(s series) bool { _, ok := s.labels[l]; return ok })
				}
				for _, m := range matcher.FindAllStringSubmatch(ref[2], -1) {
					label, op, value := m[1], m[2], m[3]
					if !hasLabel(label) {
						t.Errorf("panel %q: %s has no label %s", p.Title, name, label)
					}
					// A literal value must occur (variables like $policy are the user's choice).
					if op == "=" && !strings.Contains(value, "$") &&
						!slices.ContainsFunc(have, func(s series) bool { return s.labels[label] == value }) {
						t.Errorf("panel %q: no series %s{%s=%q}", p.Title, name, label, value)
					}
				}
				for _, l := range groupLabels {
					if l != "" && !hasLabel(l) && (l != "le" || strings.HasSuffix(name, "_bucket")) {
						t.Errorf("panel %q: %s has no label %s to group by", p.Title, name, l)
					}
				}
			}
		}
	}
	if checked < 10 {
		t.Errorf("checked only %d metric references", checked)
	}
}

// prometheusToken returns a token of a ServiceAccount bound to the chart's metrics-reader
// ClusterRole, as a Prometheus scraping through the ServiceMonitor has.
func prometheusToken(t *testing.T, n *node) string {
	t.Helper()
	ctx := t.Context()
	const ns = "monitoring"
	if _, err := n.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := n.cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-limiterd-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: release + "-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}},
	}
	if _, err := n.cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := n.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "prometheus", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// -------------------------------------------------------------------------------------- uninstall

func testUninstall(t *testing.T, n *node) {
	ctx := t.Context()
	n.helm(t, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "3m")
	testsupport.Eventually(t, time.Minute, "the release's pods gone", func() error {
		list, err := n.cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
		if err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d pods left", len(list.Items))
		}
		return nil
	})
	// The CRD and the policies stay (crds.keep), as documented.
	if _, err := n.cs.RESTClient().Get().AbsPath("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ratelimitpolicies.limiterd.dev").DoRaw(ctx); err != nil {
		t.Errorf("the CRD is gone after helm uninstall: %v", err)
	}
	_ = getPolicy(t, n)
	// No status Lease outlives its pod.
	testsupport.Eventually(t, 30*time.Second, "no status Leases left", func() error {
		if got := leaseNames(replicaLeases(t, n)); len(got) > 0 {
			return fmt.Errorf("Leases %v remain", got)
		}
		return nil
	})
}

// -------------------------------------------------------------------------------------- node down

var nodeSysctls = []string{"net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables", "vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops"}

func readSysctls(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, k := range nodeSysctls {
		b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(k, ".", "/"))
		if err != nil {
			continue
		}
		m[k] = strings.TrimSpace(string(b))
	}
	return m
}

// testNodeDown stops the node twice and checks that nothing it made is left on the machine.
func testNodeDown(t *testing.T, n *node, sysctlsBefore map[string]string) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	for range 2 {
		if _, err := command(t, ctx, nodeScript(t), "down"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(n.dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists: %v", n.dir, err)
	}
	if out, err := exec.Command("ip", "-o", "link", "show").Output(); err != nil || strings.Contains(string(out), "limnode0") {
		t.Errorf("the bridge is left: %v\n%s", err, out)
	}
	if out, err := exec.Command("iptables-save").Output(); err != nil || strings.Contains(string(out), "KUBE-") || strings.Contains(string(out), "LIMITERD-NODE") {
		t.Errorf("iptables rules are left: %v\n%s", err, out)
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(b), n.dir) {
		t.Errorf("mounts are left under %s: %v", n.dir, err)
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup/*/limiterd-node"); len(left) > 0 {
		t.Errorf("cgroups are left: %v", left)
	}
	if got := readSysctls(t); !mapsEqual(got, sysctlsBefore) {
		t.Errorf("sysctls %v, were %v before the node", got, sysctlsBefore)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
