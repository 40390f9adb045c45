package helm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

const crdName = "ratelimitpolicies.limiterd.dev"

// apiServer is a test API server (etcd and kube-apiserver, no nodes or controllers) without the
// RateLimitPolicy CRD, which the chart installs.
type apiServer struct {
	client     client.Client
	cfg        *rest.Config
	kubeconfig string
}

// startAPIServer starts an API server for t, stopped when t ends.
func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	assets := testenv.NeedAssets(t)
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	env := &envtest.Environment{BinaryAssetsDirectory: assets, Scheme: scheme}
	cfg, err := env.Start()
	if err != nil {
		_ = env.Stop()
		t.Fatalf("start API server (assets %s): %v", assets, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop API server: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return &apiServer{client: c, cfg: cfg, kubeconfig: kubeconfig}
}

// asServiceAccount returns a client that impersonates the ServiceAccount sa of saNamespace, as
// the token of a pod named pod identifies it (the pod name in the user's extra, which the status
// admission policy reads); with pod empty, as a token not bound to a pod.
func (s *apiServer) asServiceAccount(t *testing.T, saNamespace, sa, pod string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(s.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", saNamespace, sa),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
	}
	if pod != "" {
		cfg.Impersonate.Extra = map[string][]string{"authentication.kubernetes.io/pod-name": {pod}}
	}
	c, err := client.New(cfg, client.Options{Scheme: s.client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// replicaLease is the status Lease of replica name in the release namespace, labelled as a
// replica's record or not.
func replicaLease(name string, labelled bool) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if labelled {
		l.Labels = map[string]string{v1alpha1.ReplicaLabel: name}
	}
	return l
}

// checkStatusAdmission checks, as the API server enforces the chart's admission policy, that
// limiterd's ServiceAccount (sa) writes only the Lease named after its own pod, labelled as a
// replica's record, and that other users (the operator's ServiceAccount) are not restricted.
func (s *apiServer) checkStatusAdmission(t *testing.T, sa, operatorSA string) {
	t.Helper()
	ctx := t.Context()
	a := s.asServiceAccount(t, namespace, sa, "limiterd-a")
	denied := func(what string, err error, message string) {
		t.Helper()
		if err == nil || (!apierrors.IsInvalid(err) && !apierrors.IsForbidden(err)) || !strings.Contains(err.Error(), message) {
			t.Errorf("%s: %v; want refused with %q", what, err, message)
		}
	}

	// The policy takes effect once the API server has loaded it.
	testsupport.Eventually(t, 30*time.Second, "limiterd-a refused the Lease of limiterd-b", func() error {
		err := a.Create(ctx, replicaLease("limiterd-b", true))
		if err == nil {
			_ = s.client.Delete(ctx, replicaLease("limiterd-b", true))
			return fmt.Errorf("pod limiterd-a created the Lease of limiterd-b")
		}
		if !strings.Contains(err.Error(), "may write only the Lease limiterd-a, not limiterd-b") {
			return fmt.Errorf("create another pod's Lease: %w", err)
		}
		return nil
	})
	denied("create its own Lease unlabelled", a.Create(ctx, replicaLease("limiterd-a", false)),
		"must be labelled limiterd.dev/replica=limiterd-a")
	denied("create without a pod-bound token", s.asServiceAccount(t, namespace, sa, "").Create(ctx, replicaLease("limiterd-a", true)),
		"only with a pod-bound service account token")

	own := replicaLease("limiterd-a", true)
	if err := a.Create(ctx, own); err != nil {
		t.Fatalf("create its own Lease: %v", err)
	}
	own.Annotations = map[string]string{v1alpha1.ReplicaStatusAnnotation: "{}"}
	if err := a.Update(ctx, own); err != nil {
		t.Errorf("update its own Lease: %v", err)
	}

	other := replicaLease("limiterd-b", true)
	if err := s.client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := a.Get(ctx, client.ObjectKeyFromObject(other), other); err != nil {
		t.Fatalf("get another pod's Lease: %v", err)
	}
	other.Annotations = map[string]string{v1alpha1.ReplicaStatusAnnotation: "{}"}
	denied("update another pod's Lease", a.Update(ctx, other), "may write only the Lease limiterd-a, not limiterd-b")
	denied("delete another pod's Lease", a.Delete(ctx, other), "may write only the Lease limiterd-a, not limiterd-b")
	if err := a.Delete(ctx, replicaLease("limiterd-a", true)); err != nil {
		t.Errorf("delete its own Lease: %v", err)
	}
	if err := s.client.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}

	// The operator's ServiceAccount is not matched: it keeps its leader election Lease.
	op := s.asServiceAccount(t, namespace, operatorSA, operatorSA+"-7d4f9-x2x8q")
	election := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "limiterd-operator-election"}}
	if err := op.Create(ctx, election); err != nil {
		t.Errorf("the operator creates its leader election Lease: %v", err)
	} else if err := op.Delete(ctx, election); err != nil {
		t.Errorf("the operator deletes its leader election Lease: %v", err)
	}
}

// helm runs helm against the API server and returns its stdout; it fails t on an error.
func (s *apiServer) helm(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := runHelm(t, append(args, "--kubeconfig", s.kubeconfig)...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// installServiceMonitorCRD installs a minimal monitoring.coreos.com/v1 ServiceMonitor CRD (the
// Prometheus Operator's is not in the test API server), so that the chart's ServiceMonitors
// can be created.
func (s *apiServer) installServiceMonitorCRD(t *testing.T) {
	t.Helper()
	preserve := true
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "servicemonitors.monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "ServiceMonitor", ListKind: "ServiceMonitorList", Plural: "servicemonitors", Singular: "servicemonitor"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", XPreserveUnknownFields: &preserve},
					},
				}},
			}},
		},
	}
	ctx := t.Context()
	if err := s.client.Create(ctx, crd); err != nil {
		t.Fatal(err)
	}
	s.waitEstablished(t, crd.Name)
}

// waitEstablished waits until a CRD is established.
func (s *apiServer) waitEstablished(t *testing.T, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := s.client.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CRD %s not established: %v", name, err)
	}
}

// getCRD returns the RateLimitPolicy CRD, or nil when it does not exist.
func (s *apiServer) getCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	var crd apiextensionsv1.CustomResourceDefinition
	err := s.client.Get(t.Context(), client.ObjectKey{Name: crdName}, &crd)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &crd
}

// mustExist fails t unless each object exists.
func (s *apiServer) mustExist(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := s.client.Get(t.Context(), client.ObjectKeyFromObject(o), o); err != nil {
			t.Errorf("%T %s/%s: %v", o, o.GetNamespace(), o.GetName(), err)
		}
	}
}

// mustNotExist fails t if any object still exists.
func (s *apiServer) mustNotExist(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		err := s.client.Get(t.Context(), client.ObjectKeyFromObject(o), o)
		if !apierrors.IsNotFound(err) {
			t.Errorf("%T %s/%s still exists after uninstall (err %v)", o, o.GetNamespace(), o.GetName(), err)
		}
	}
}

// can asks the API server's RBAC authorizer whether a ServiceAccount may do something.
func (s *apiServer) can(t *testing.T, saNamespace, sa, verb, group, resource, subresource, namespace string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   fmt.Sprintf("system:serviceaccount:%s:%s", saNamespace, sa),
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: verb, Group: group, Resource: resource, Subresource: subresource,
		},
	}}
	if err := s.client.Create(t.Context(), sar); err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

type permission struct {
	verb, group, resource, subresource, namespace string
	allowed                                       bool
}

func (s *apiServer) checkPermissions(t *testing.T, saNamespace, sa string, perms []permission) {
	t.Helper()
	for _, p := range perms {
		if got := s.can(t, saNamespace, sa, p.verb, p.group, p.resource, p.subresource, p.namespace); got != p.allowed {
			res := p.resource
			if p.subresource != "" {
				res += "/" + p.subresource
			}
			t.Errorf("ServiceAccount %s/%s may %s %s.%s in %q: %v, want %v", saNamespace, sa, p.verb, res, p.group, p.namespace, got, p.allowed)
		}
	}
}

func ns(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// checkOperatorDeletes checks, as the API server enforces the chart's operator admission policy
// (with operator.legacyConfigMapCleanup on), that the operator's ServiceAccount (sa) can delete a
// ConfigMap outside the release namespace only when an earlier version rendered it (labelled
// limiterd.dev/policy, controlled by a RateLimitPolicy), and can neither read nor write any other.
func (s *apiServer) checkOperatorDeletes(t *testing.T, sa string) {
	t.Helper()
	ctx := t.Context()
	op := s.asServiceAccount(t, namespace, sa, sa+"-7d4f9-x2x8q")
	if err := s.client.Create(ctx, ns("tenant")); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	secret := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "app-config",
		Labels: map[string]string{v1alpha1.PolicyLabel: "forged"}}, Data: map[string]string{"password": "hunter2"}}
	if err := s.client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	// The admission policy takes effect once the API server has loaded it.
	testsupport.Eventually(t, 30*time.Second, "operator refused to delete a ConfigMap of no policy", func() error {
		err := op.Delete(ctx, secret.DeepCopy())
		if err == nil {
			t.Fatalf("the operator deleted ConfigMap tenant/app-config, which no policy controls")
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only a policy ConfigMap an earlier") {
			return fmt.Errorf("delete another's ConfigMap: %w", err)
		}
		return nil
	})
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("the operator may %s: %v, want Forbidden", what, err)
		}
	}
	forbidden("get a ConfigMap of another namespace", op.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.ConfigMap{}))
	forbidden("list ConfigMaps of another namespace", op.List(ctx, &corev1.ConfigMapList{}, client.InNamespace("tenant")))
	changed := secret.DeepCopy()
	changed.Data = map[string]string{"password": "owned"}
	forbidden("update a ConfigMap of another namespace", op.Update(ctx, changed))
	forbidden("create a ConfigMap in another namespace", op.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "planted"}}))
	forbidden("delete every ConfigMap of another namespace", op.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace("tenant")))

	// A ConfigMap an earlier version rendered: labelled and controlled by its policy.
	policy := &unstructured.Unstructured{}
	policy.SetGroupVersionKind(schema.GroupVersionKind{Group: "limiterd.dev", Version: "v1alpha1", Kind: "RateLimitPolicy"})
	policy.SetNamespace("tenant")
	policy.SetName("old")
	policy.Object["spec"] = map[string]any{"defaultTier": "free", "tiers": []any{map[string]any{
		"name": "free", "algorithm": "TokenBucket", "tokenBucket": map[string]any{"capacity": int64(1), "refillRate": int64(1)}}}}
	if err := s.client.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	legacy := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: v1alpha1.LegacyConfigMapName("old"),
		Labels: map[string]string{v1alpha1.PolicyLabel: "old"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "limiterd.dev/v1alpha1", Kind: "RateLimitPolicy", Name: "old",
			UID: policy.GetUID(), Controller: ptr.To(true)}}}}
	if err := s.client.Create(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	if err := op.Delete(ctx, legacy); err != nil {
		t.Errorf("the operator deletes a legacy policy ConfigMap: %v", err)
	}
	if err := s.client.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.ConfigMap{}); err != nil {
		t.Errorf("ConfigMap tenant/app-config after the operator's attempts: %v", err)
	}
}

// TestInstall installs the chart into a real API server, which validates every object, then
// upgrades and uninstalls it: the CRD and the policies are kept unless crds.keep=false; the
// ServiceAccounts get exactly their permissions, and the status admission policy keeps limiterd
// to its own pod's Lease; the namespaced scenario is confined to its namespace. Pods never run (the server has no nodes), so helm does not wait for them.
func TestInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server")
	}
	s := startAPIServer(t)
	s.installServiceMonitorCRD(t)
	ctx := t.Context()
	for _, name := range []string{"team-a", "shop"} {
		if err := s.client.Create(ctx, ns(name)); err != nil {
			t.Fatal(err)
		}
	}

	// 1. crds.keep=false: uninstalling deletes the CRD.
	t.Run("crds.keep=false deletes the CRD on uninstall", func(t *testing.T) {
		s.helm(t, "install", "dropper", chartRel, "--namespace", "dropper", "--create-namespace", "--wait=false", "--set", "crds.keep=false")
		crd := s.getCRD(t)
		if crd == nil {
			t.Fatal("CRD not installed")
		}
		if _, ok := crd.Annotations["helm.sh/resource-policy"]; ok {
			t.Errorf("CRD annotated %v with crds.keep=false", crd.Annotations)
		}
		s.helm(t, "uninstall", "dropper", "--namespace", "dropper", "--wait=false")
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return s.getCRD(t) == nil, nil
		})
		if err != nil {
			t.Fatalf("CRD still present after uninstall with crds.keep=false: %v", err)
		}
	})

	// 2. Every feature on: the server accepts every object.
	policy := &unstructured.Unstructured{}
	policy.SetGroupVersionKind(schema.GroupVersionKind{Group: "limiterd.dev", Version: "v1alpha1", Kind: "RateLimitPolicy"})
	policy.SetNamespace("shop")
	policy.SetName("public-api")
	t.Run("install with every feature", func(t *testing.T) {
		out := s.helm(t, "install", release, chartRel, "--namespace", namespace, "--create-namespace", "--wait=false",
			"--values", chartRel+"/ci/all-features-values.yaml")
		for _, want := range []string{
			"STATUS: deployed",
			"kubectl port-forward -n " + namespace + " svc/" + limiterdName + " 8080:8080",
			"curl -sS -X POST http://127.0.0.1:8080/v1/allow",
			// A gateway's address: forward-auth on the decisions port, ext_authz on the gRPC port.
			"http://" + limiterdName + "." + namespace + ".svc:8080/v1/forward-auth/<namespace>/<name>",
			"its gRPC ext_authz (Istio's CUSTOM provider, Envoy Gateway's extAuth) use\n" + limiterdName + "." + namespace + ".svc:8081.",
			// /metrics answers 401 without a token (test/cluster): NOTES shows how to get one.
			"--clusterrole=" + limiterdName + "-metrics-reader",
			`curl -sS -H "Authorization: Bearer $(kubectl create token metrics-probe -n ` + namespace + `)"`,
			"kind: RateLimitPolicy",
			"NetworkPolicies are on (enforced only by a network plugin that implements them)",
			"the admin port admits pods of monitoring, platform-ops only",
			"the operator's metrics port admits pods of monitoring only",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("helm install output (NOTES) lacks %q:\n%s", want, out)
			}
		}
		crd := s.getCRD(t)
		if crd == nil {
			t.Fatal("CRD not installed")
		}
		if crd.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD annotations %v lack helm.sh/resource-policy: keep", crd.Annotations)
		}
		s.waitEstablished(t, crdName)

		// The first policy NOTES tells to apply is valid.
		_, rest, ok := strings.Cut(out, "<<'YAML'\n")
		doc, _, ok2 := strings.Cut(rest, "\nYAML\n")
		if !ok || !ok2 {
			t.Fatalf("NOTES has no <<'YAML' ... YAML policy:\n%s", out)
		}
		first := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &first.Object); err != nil {
			t.Fatalf("NOTES policy: %v\n%s", err, doc)
		}
		first.SetNamespace("default")
		if err := s.client.Create(ctx, first); err != nil {
			t.Errorf("apply the policy of NOTES: %v", err)
		}

		s.mustExist(t,
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: operatorName}},
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName + "-admin"}},
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: operatorName + "-metrics"}},
			&autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: operatorName}},
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName + "-dashboard"}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: operatorName}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: operatorName}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: operatorName + "-leader-election"}},
			&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: statusPolicyName}},
			&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: statusPolicyName}},
			// operator.legacyConfigMapCleanup, on in all-features-values.yaml.
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: legacyCleanupName}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: legacyCleanupName}},
			&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: operatorPolicyName}},
			&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: operatorPolicyName}},
		)
		s.mustNotExist(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: limiterdName}})
		var sms unstructured.UnstructuredList
		sms.SetGroupVersionKind(schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitorList"})
		if err := s.client.List(ctx, &sms, client.InNamespace(namespace)); err != nil || len(sms.Items) != 2 {
			t.Errorf("ServiceMonitors: %d, err %v; want 2", len(sms.Items), err)
		}

		// The installed CRD serves and validates policies.
		policy.Object["spec"] = map[string]any{
			"defaultTier": "free",
			"tiers": []any{map[string]any{
				"name": "free", "algorithm": "TokenBucket",
				"tokenBucket": map[string]any{"capacity": int64(10), "refillRate": int64(5), "refillPeriod": "1s"},
			}},
		}
		if err := s.client.Create(ctx, policy); err != nil {
			t.Fatalf("create a RateLimitPolicy through the chart's CRD: %v", err)
		}
		bad := policy.DeepCopy()
		bad.SetName("bad")
		bad.Object["spec"] = map[string]any{"defaultTier": "free", "tiers": "not-a-list"}
		if err := s.client.Create(ctx, bad); err == nil {
			t.Errorf("the CRD accepted a policy whose tiers is a string")
		}

		// Least privilege, as the API server's RBAC authorizer decides it.
		s.checkPermissions(t, namespace, limiterdName, []permission{
			{"list", "", "configmaps", "", namespace, true},
			{"watch", "", "configmaps", "", namespace, true},
			{"get", "", "configmaps", "", namespace, true},
			{"list", "", "configmaps", "", "shop", false},
			{"watch", "", "configmaps", "", "", false},
			{"get", "", "configmaps", "", "team-a", false},
			{"create", "", "configmaps", "", namespace, false},
			{"delete", "", "configmaps", "", namespace, false},
			{"create", "", "configmaps", "", "shop", false},
			{"update", "", "configmaps", "", "shop", false},
			{"delete", "", "configmaps", "", "shop", false},
			{"get", "", "secrets", "", namespace, false},
			{"list", "limiterd.dev", "ratelimitpolicies", "", "shop", false},
			{"create", "coordination.k8s.io", "leases", "", namespace, true}, // its status Lease
			{"update", "coordination.k8s.io", "leases", "", namespace, true},
			{"list", "coordination.k8s.io", "leases", "", namespace, false},
			{"create", "coordination.k8s.io", "leases", "", "shop", false},
		})
		s.checkPermissions(t, namespace, operatorName, []permission{
			{"watch", "limiterd.dev", "ratelimitpolicies", "", "", true},
			{"patch", "limiterd.dev", "ratelimitpolicies", "status", "shop", true},
			{"update", "limiterd.dev", "ratelimitpolicies", "", "shop", false},
			{"delete", "limiterd.dev", "ratelimitpolicies", "", "shop", false},
			{"create", "", "configmaps", "", namespace, true},
			{"update", "", "configmaps", "", namespace, true},
			{"delete", "", "configmaps", "", namespace, true},
			{"watch", "", "configmaps", "", namespace, true},
			{"get", "", "configmaps", "", "shop", false},
			{"list", "", "configmaps", "", "", false},
			{"create", "", "configmaps", "", "shop", false},
			{"update", "", "configmaps", "", "shop", false},
			{"patch", "", "configmaps", "", "shop", false},
			{"deletecollection", "", "configmaps", "", "shop", false},
			{"delete", "", "configmaps", "", "shop", true}, // legacyConfigMapCleanup: legacy ConfigMaps only, see checkOperatorDeletes
			{"list", "coordination.k8s.io", "leases", "", namespace, true},
			{"create", "events.k8s.io", "events", "", "shop", true},
			{"create", "", "events", "", "shop", true},
			{"create", "coordination.k8s.io", "leases", "", namespace, true},
			{"create", "coordination.k8s.io", "leases", "", "shop", false},
			{"get", "", "secrets", "", namespace, false},
			{"list", "", "pods", "", namespace, false},
			{"create", "apps", "deployments", "", namespace, false},
		})
	})

	// 2b. The API server accepted the status admission policy (it compiles its CEL) and enforces
	// it: limiterd's ServiceAccount writes only the Lease of its own pod.
	t.Run("limiterd writes only its own status Lease", func(t *testing.T) {
		s.checkStatusAdmission(t, limiterdName, operatorName)
	})

	// 2c. During the upgrade step, the operator may delete, outside its namespace, only the
	// ConfigMaps earlier versions rendered there.
	t.Run("the operator deletes only legacy ConfigMaps elsewhere", func(t *testing.T) {
		s.checkOperatorDeletes(t, operatorName)
	})

	// 3. Upgrade to the Redis scenario: the CRD is upgraded in place, the HPA removed.
	t.Run("upgrade", func(t *testing.T) {
		s.helm(t, "upgrade", release, chartRel, "--namespace", namespace, "--wait=false",
			"--values", chartRel+"/ci/redis-cluster-values.yaml")
		var dep appsv1.Deployment
		if err := s.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: limiterdName}, &dep); err != nil {
			t.Fatal(err)
		}
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
			t.Errorf("replicas after upgrade = %v, want 3", dep.Spec.Replicas)
		}
		if !strings.Contains(strings.Join(dep.Spec.Template.Spec.Containers[0].Args, " "), "--redis-addr=redis-cluster-0.redis-cluster-headless.redis.svc.cluster.local:6379") {
			t.Errorf("args after upgrade: %v", dep.Spec.Template.Spec.Containers[0].Args)
		}
		s.mustNotExist(t, &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}})
		if s.getCRD(t) == nil {
			t.Fatal("CRD gone after upgrade")
		}
		// The upgrade step is over (legacyConfigMapCleanup off): the operator has no right on
		// ConfigMaps outside its namespace left.
		s.mustNotExist(t,
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: legacyCleanupName}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: legacyCleanupName}},
			&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: operatorPolicyName}},
			&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: operatorPolicyName}},
		)
		var perms []permission
		for _, verb := range []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"} {
			perms = append(perms, permission{verb, "", "configmaps", "", "shop", false}, permission{verb, "", "configmaps", "", "", false})
		}
		perms = append(perms, permission{"delete", "", "configmaps", "", namespace, true})
		s.checkPermissions(t, namespace, operatorName, perms)
	})

	// 4. Uninstall: everything goes but the CRD and the policies.
	t.Run("uninstall keeps the CRD and the policies", func(t *testing.T) {
		// --wait returns once every resource helm deleted is gone, so a CRD it had deleted would
		// be gone by now: the API server finishes a CRD's deletion by itself.
		s.helm(t, "uninstall", release, "--namespace", namespace, "--wait")
		s.mustNotExist(t,
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: operatorName}},
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: limiterdName}},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: operatorName}},
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdName}},
			&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: statusPolicyName}},
			&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: statusPolicyName}},
		)
		crd := s.getCRD(t)
		if crd == nil || crd.DeletionTimestamp != nil {
			t.Fatalf("CRD deleted by uninstall: %v", crd)
		}
		if err := s.client.Get(ctx, client.ObjectKeyFromObject(policy), policy.DeepCopy()); err != nil {
			t.Errorf("RateLimitPolicy gone after uninstall: %v", err)
		}
	})

	// 5. Reinstalling the same release adopts the kept CRD.
	t.Run("reinstall adopts the kept CRD", func(t *testing.T) {
		s.helm(t, "install", release, chartRel, "--namespace", namespace, "--wait=false")
		if crd := s.getCRD(t); crd == nil || crd.Labels["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("CRD after reinstall: %v", crd)
		}
		s.helm(t, "uninstall", release, "--namespace", namespace, "--wait=false")
	})

	// 6. Namespaced: limiterd serves the policies of team-a only, reading the ConfigMaps that
	// another release's operator renders into limiterd-system; the CRD is left to others.
	t.Run("namespaced", func(t *testing.T) {
		const rel = "team-a"
		if s.getCRD(t) == nil {
			t.Fatal("the CRD kept by the previous steps is gone")
		}
		s.helm(t, "install", rel, chartRel, "--namespace", "team-a-system", "--create-namespace", "--wait=false",
			"--values", chartRel+"/ci/namespaced-values.yaml")
		sa := rel + "-limiterd"
		s.mustExist(t,
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a-system", Name: sa}},
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "limiterd-system", Name: sa}},
			// Named after its release namespace, so it does not collide with another release's.
			&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: sa + "-replica-status.team-a-system"}},
		)
		s.mustNotExist(t,
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: sa}},
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a-system", Name: sa + "-operator"}},
		)
		s.checkPermissions(t, "team-a-system", sa, []permission{
			{"list", "", "configmaps", "", "limiterd-system", true},
			{"watch", "", "configmaps", "", "limiterd-system", true},
			{"list", "", "configmaps", "", "team-a", false},
			{"list", "", "configmaps", "", "team-a-system", false},
			{"list", "", "configmaps", "", "", false},
			{"create", "", "configmaps", "", "limiterd-system", false},
		})
		s.helm(t, "uninstall", rel, "--namespace", "team-a-system", "--wait=false")
		if s.getCRD(t) == nil {
			t.Errorf("uninstalling a release with crds.install=false removed the CRD")
		}
	})
}
