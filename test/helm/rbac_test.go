package helm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/controllers"
	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// TestBinariesRunWithChartRBAC installs the chart into a test API server (which enforces RBAC and
// the chart's admission policies) and runs bin/manager and bin/limiterd (make build), with the
// arguments of the chart's Deployments and as their ServiceAccounts (an administrator's
// credentials impersonating them; limiterd as its pod's bound token would): with exactly the
// chart's RBAC, a policy of another namespace is rendered, served and deleted again, and neither
// identity can read or write a ConfigMap of that namespace, not even delete the one an earlier
// version rendered there: the operator, whose ClusterRole has no right on ConfigMaps, leaves that
// one in place and says so in an event.
func TestBinariesRunWithChartRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server and runs both binaries")
	}
	s := startAPIServer(t)
	ctx := t.Context()
	manager, limiterdBin := testbin.Need(t, testbin.Manager), testbin.Need(t, testbin.Limiterd)
	if err := s.client.Create(ctx, ns("shop")); err != nil {
		t.Fatal(err)
	}
	s.helm(t, "install", release, chartRel, "--namespace", namespace, "--create-namespace", "--wait=false")
	s.waitEstablished(t, crdName)
	// Before the operator starts: a policy as an earlier operator left it, its ConfigMap in the
	// policy's namespace, controlled by the policy and named in its status.
	legacyPolicy, legacyCM := createLegacyPolicy(t, s, "shop", "old")

	deployment := func(name string) *appsv1.Deployment {
		d := &appsv1.Deployment{}
		if err := s.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	// The chart's arguments, but for the addresses (loopback, free ports) and the pod name.
	const pod = limiterdName + "-5d8c7b9f4-abcde"
	args := func(d *appsv1.Deployment, override map[string]string) []string {
		var out []string
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if v, ok := override[name]; ok {
				a = "--" + name + "=" + v
				delete(override, name)
			}
			out = append(out, strings.ReplaceAll(a, "$(POD_NAME)", pod))
		}
		for name, v := range override {
			out = append(out, "--"+name+"="+v)
		}
		return out
	}
	opProbes := freeLoopback(t)
	startBinary(t, "manager", manager, s.impersonatingKubeconfig(t, namespace, operatorName, operatorName+"-7d4f9-x2x8q"),
		args(deployment(operatorName), map[string]string{"metrics-bind-address": "0", "health-probe-bind-address": opProbes}), nil)
	decisions, admin := freeLoopback(t), freeLoopback(t)
	kubeconfig := s.impersonatingKubeconfig(t, namespace, limiterdName, pod)
	// The chart mounts the reservation key from its Secret; here the key is a file of our own.
	reservationKey := filepath.Join(t.TempDir(), "reservation-key")
	if err := os.WriteFile(reservationKey, bytes.Repeat([]byte{0x5a}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	startBinary(t, "limiterd", limiterdBin, kubeconfig,
		args(deployment(limiterdName), map[string]string{"addr": decisions, "admin-addr": admin, "kubeconfig": kubeconfig, "status-interval": "1s",
			"reservation-key-file": reservationKey}),
		[]string{"POD_NAME=" + pod})
	for _, url := range []string{"http://" + opProbes + "/readyz", "http://" + admin + "/readyz"} {
		testsupport.Eventually(t, 2*time.Minute, url+" answers 200", func() error { return httpStatus(url, http.StatusOK) })
	}

	// A policy of namespace shop is rendered into the release namespace and served.
	policy := &unstructured.Unstructured{}
	policy.SetGroupVersionKind(schema.GroupVersionKind{Group: "limiterd.dev", Version: "v1alpha1", Kind: "RateLimitPolicy"})
	policy.SetNamespace("shop")
	policy.SetName("api")
	policy.Object["spec"] = map[string]any{"defaultTier": "free", "tiers": []any{map[string]any{
		"name": "free", "algorithm": "TokenBucket", "tokenBucket": map[string]any{"capacity": int64(5), "refillRate": int64(1)}}}}
	if err := s.client.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	allow := "http://" + decisions + "/v1/allow?policy=shop/api&key=k"
	testsupport.Eventually(t, time.Minute, "policy of namespace shop served", func() error { return httpStatus(allow, http.StatusOK) })
	cmKey := client.ObjectKey{Namespace: namespace, Name: v1alpha1.ConfigMapName(v1alpha1.NewPolicyID("shop", "api"))}
	if err := s.client.Get(ctx, cmKey, &corev1.ConfigMap{}); err != nil {
		t.Errorf("the policy's ConfigMap %s: %v", cmKey, err)
	}
	// The operator reports every replica enforcing it, from limiterd's status Lease.
	testsupport.Eventually(t, time.Minute, "policy enforced 1/1", func() error {
		if err := s.client.Get(ctx, client.ObjectKeyFromObject(policy), policy); err != nil {
			return err
		}
		if got, _, _ := unstructured.NestedString(policy.Object, "status", "enforced"); got != "1/1" {
			return fmt.Errorf("status.enforced %q, want 1/1", got)
		}
		return nil
	})

	// The policy of the earlier layout is rendered into the release namespace, its status names
	// the new ConfigMap, and its old ConfigMap is left in place, with a warning event naming it.
	testsupport.Eventually(t, time.Minute, "legacy policy moved to its new ConfigMap", func() error {
		if err := s.client.Get(ctx, client.ObjectKeyFromObject(legacyPolicy), legacyPolicy); err != nil {
			return err
		}
		want := v1alpha1.ConfigMapName(v1alpha1.NewPolicyID("shop", "old"))
		if got, _, _ := unstructured.NestedString(legacyPolicy.Object, "status", "configMapName"); got != want {
			return fmt.Errorf("status.configMapName %q, want %q", got, want)
		}
		return s.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: want}, &corev1.ConfigMap{})
	})
	testsupport.Eventually(t, time.Minute, "event "+controllers.ReasonLegacyConfigMapLeft, func() error {
		var list eventsv1.EventList
		if err := s.client.List(ctx, &list, client.InNamespace("shop")); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Regarding.UID == legacyPolicy.GetUID() && e.Type == corev1.EventTypeWarning && e.Reason == controllers.ReasonLegacyConfigMapLeft &&
				strings.Contains(e.Note, legacyCM.Name) {
				return nil
			}
		}
		return fmt.Errorf("no warning %s naming %s about policy shop/old among %d events", controllers.ReasonLegacyConfigMapLeft, legacyCM.Name, len(list.Items))
	})

	// Neither identity reaches a ConfigMap of namespace shop: not the tenant's, and not the one
	// an earlier version of the operator rendered (RBAC alone refuses it, before any admission).
	tenant := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "app-config"}, Data: map[string]string{"password": "hunter2"}}
	if err := s.client.Create(ctx, tenant); err != nil {
		t.Fatal(err)
	}
	for _, who := range []struct{ sa, pod string }{{limiterdName, pod}, {operatorName, operatorName + "-7d4f9-x2x8q"}} {
		c := s.asServiceAccount(t, namespace, who.sa, who.pod)
		for what, err := range map[string]error{
			"get":                    c.Get(ctx, client.ObjectKeyFromObject(tenant), &corev1.ConfigMap{}),
			"list":                   c.List(ctx, &corev1.ConfigMapList{}, client.InNamespace("shop")),
			"list every namespace's": c.List(ctx, &corev1.ConfigMapList{}),
			"create":                 c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "planted"}}),
			"update":                 c.Update(ctx, tenant.DeepCopy()),
			"delete":                 c.Delete(ctx, tenant.DeepCopy()),
			"delete the legacy":      c.Delete(ctx, legacyCM.DeepCopy()),
		} {
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s may %s ConfigMaps of namespace shop: %v, want Forbidden", who.sa, what, err)
			}
		}
		if who.sa == operatorName && s.can(t, namespace, who.sa, "delete", "", "configmaps", "", "shop") {
			t.Errorf("RBAC lets the operator delete ConfigMaps of namespace shop")
		}
	}
	if err := s.client.Get(ctx, client.ObjectKeyFromObject(legacyCM), &corev1.ConfigMap{}); err != nil {
		t.Errorf("the legacy ConfigMap %s/%s: %v, want it left in place", legacyCM.Namespace, legacyCM.Name, err)
	}

	// Deleting the policy deletes its ConfigMap (no owner reference crosses namespaces), and
	// limiterd stops serving it.
	if err := s.client.Delete(ctx, policy); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, time.Minute, "ConfigMap of the deleted policy gone", func() error {
		err := s.client.Get(ctx, cmKey, &corev1.ConfigMap{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("ConfigMap of the deleted policy: %w, want NotFound", err)
		}
		return httpStatus(allow, http.StatusNotFound)
	})
}

// createLegacyPolicy creates policy name of namespace ns as an operator of the earlier layout left
// it: a ConfigMap rlp-<name> in ns, labelled and controlled by the policy, named in the policy's
// status. It returns the policy and that ConfigMap.
func createLegacyPolicy(t *testing.T, s *apiServer, ns, name string) (*unstructured.Unstructured, *corev1.ConfigMap) {
	t.Helper()
	ctx := t.Context()
	policy := &unstructured.Unstructured{}
	policy.SetGroupVersionKind(schema.GroupVersionKind{Group: "limiterd.dev", Version: "v1alpha1", Kind: "RateLimitPolicy"})
	policy.SetNamespace(ns)
	policy.SetName(name)
	policy.Object["spec"] = map[string]any{"defaultTier": "free", "tiers": []any{map[string]any{
		"name": "free", "algorithm": "TokenBucket", "tokenBucket": map[string]any{"capacity": int64(1), "refillRate": int64(1)}}}}
	if err := s.client.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.LegacyConfigMapName(name),
		Labels: map[string]string{v1alpha1.PolicyLabel: name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "limiterd.dev/v1alpha1", Kind: "RateLimitPolicy", Name: name,
			UID: policy.GetUID(), Controller: ptr.To(true)}}}}
	if err := s.client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(policy.Object, cm.Name, "status", "configMapName"); err != nil {
		t.Fatal(err)
	}
	if err := s.client.Status().Update(ctx, policy); err != nil {
		t.Fatal(err)
	}
	return policy, cm
}

// impersonatingKubeconfig writes a kubeconfig with the API server's administrator credentials
// impersonating the ServiceAccount sa of saNamespace in a pod named pod, and returns its path.
func (s *apiServer) impersonatingKubeconfig(t *testing.T, saNamespace, sa, pod string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(s.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range cfg.AuthInfos {
		auth.Impersonate = "system:serviceaccount:" + saNamespace + ":" + sa
		auth.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"}
		auth.ImpersonateUserExtra = map[string][]string{"authentication.kubernetes.io/pod-name": {pod}}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig-"+sa)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// startBinary runs binary with args, KUBECONFIG=kubeconfig and env until t ends (SIGTERM, then
// SIGKILL after 30s); its output is printed if t failed.
func startBinary(t *testing.T, name, binary, kubeconfig string, args, env []string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+kubeconfig), env...)
	logs := &testsupport.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s exited after SIGTERM: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not exit within 30s of SIGTERM", name)
		}
		if t.Failed() {
			t.Logf("%s %s\n%s", name, strings.Join(args, " "), logs.String())
		}
	})
}

// freeLoopback returns a loopback address with a port free at the time of the call.
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// httpStatus fails unless GET url answers want.
func httpStatus(url string, want int) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		var body json.RawMessage
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return fmt.Errorf("GET %s: %s %s, want %d", url, resp.Status, body, want)
	}
	return nil
}
