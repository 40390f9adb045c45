package helm_test

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	limiterdName = release // the full name of release "limiterd"
	operatorName = release + "-operator"
	// statusPolicyName names the status admission policy and its binding (cluster-scoped).
	statusPolicyName = limiterdName + "-replica-status." + namespace
	// operatorPolicyName names the admission policy narrowing the operator's ConfigMap deletions
	// during the upgrade step operator.legacyConfigMapCleanup.
	operatorPolicyName = limiterdName + "-operator-configmaps." + namespace
	// legacyCleanupName names the ClusterRole, and its binding, that let the operator delete
	// ConfigMaps outside the release namespace during that step.
	legacyCleanupName = operatorName + "-legacy-configmaps"
)

// TestLintStrict runs helm lint --strict with the defaults and with each ci/*-values.yaml.
func TestLintStrict(t *testing.T) {
	t.Parallel()
	scenarios := append([]string{""}, ciValues(t)...)
	for _, values := range scenarios {
		name := "defaults"
		if values != "" {
			name = filepath.Base(values)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			args := []string{"lint", "--strict", chartRel}
			if values != "" {
				args = append(args, "--values", values)
			}
			out, errOut, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
			}
			if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Fatalf("helm lint output lacks the success line:\n%s%s", out, errOut)
			}
			for _, line := range strings.Split(out+errOut, "\n") {
				if strings.Contains(line, "[WARNING]") || strings.Contains(line, "[ERROR]") {
					t.Errorf("helm lint: %s", line)
				}
			}
		})
	}
}

// TestTemplateDefaults checks the objects of the defaults and their security settings.
func TestTemplateDefaults(t *testing.T) {
	t.Parallel()
	m := render(t)
	_, appVersion := chartMeta(t)

	want := map[string]int{
		"CustomResourceDefinition": 1, "ServiceAccount": 2, "ClusterRole": 3, "ClusterRoleBinding": 2,
		"Role": 4, "RoleBinding": 4, "Service": 3, "Deployment": 2, "NetworkPolicy": 2,
		"ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1, // limiterd's status Lease
		"Secret": 1, // the reservation key
	}
	if got := m.kinds(); !mapsEqual(got, want) {
		t.Errorf("kinds = %v, want %v", got, want)
	}
	for _, o := range m {
		if o.GetKind() == "CustomResourceDefinition" || strings.HasPrefix(o.GetKind(), "Cluster") || strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			if o.GetNamespace() != "" {
				t.Errorf("%s %s is cluster-scoped but has namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
			}
		} else if o.GetNamespace() != namespace {
			t.Errorf("%s %s: namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), namespace)
		}
		l := o.GetLabels()
		if l["app.kubernetes.io/instance"] != release || l["app.kubernetes.io/managed-by"] != "Helm" || l["app.kubernetes.io/name"] != "limiterd" {
			t.Errorf("%s %s: labels %v lack the standard ones", o.GetKind(), o.GetName(), l)
		}
	}

	// limiterd.
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName))
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("limiterd replicas = %v, want 2", dep.Spec.Replicas)
	}
	checkPodSecurity(t, dep)
	c := container(t, dep, "limiterd")
	if want := "ghcr.io/limiterd/limiterd:" + appVersion; c.Image != want {
		t.Errorf("limiterd image = %q, want %q", c.Image, want)
	}
	checkArgs(t, c.Args, []string{"--addr=:8080", "--admin-addr=:9090", "--configmap-namespace=" + namespace, "--store=memory", "--max-clients=1000000", "--log-level=info",
		"--shutdown-delay=5s", "--shutdown-timeout=15s",
		"--replica-name=$(POD_NAME)", "--pod-uid=$(POD_UID)", "--status-namespace=" + namespace, "--status-interval=5s"},
		[]string{"--namespace", "--store-timeout", "--redis-addr", "--redis-tls", "--redis-password-file", "--kubeconfig", "--policy-file", "--grpc-addr", "--legacy-ratelimit-headers", "--top-clients"})
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}) {
		t.Errorf("limiterd env %+v lacks POD_NAME from metadata.name (its --replica-name)", c.Env)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_UID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.uid"
	}) {
		t.Errorf("limiterd env %+v lacks POD_UID from metadata.uid (its --pod-uid, the owner of its status Lease)", c.Env)
	}
	// The shutdown delay, the drain and the Lease's withdrawal fit in the grace period.
	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g <= 5+15+5 {
		t.Errorf("limiterd terminationGracePeriodSeconds = %v, want more than shutdownDelay + shutdownTimeout + 5 s", g)
	}
	checkPorts(t, c, map[string]int32{"http": 8080, "admin": 9090})
	checkProbes(t, c, "admin")
	if dep.Spec.Template.Spec.ServiceAccountName != limiterdName {
		t.Errorf("limiterd runs as ServiceAccount %q, want %q", dep.Spec.Template.Spec.ServiceAccountName, limiterdName)
	}
	if v := dep.Spec.Template.Spec.Volumes; len(v) != 1 || v[0].Name != "reservation-key" {
		t.Errorf("limiterd has volumes %v with the memory store, want the reservation key only", v)
	}

	// The operator.
	op := typed[appsv1.Deployment](t, m.get(t, "Deployment", operatorName))
	checkPodSecurity(t, op)
	oc := container(t, op, "manager")
	if want := "ghcr.io/limiterd/manager:" + appVersion; oc.Image != want {
		t.Errorf("operator image = %q, want %q", oc.Image, want)
	}
	checkArgs(t, oc.Args, []string{"--leader-elect", "--leader-election-namespace=" + namespace, "--configmap-namespace=" + namespace,
		"--metrics-bind-address=:8080", "--health-probe-bind-address=:8081"}, []string{"--remove-legacy-configmaps"})
	checkPorts(t, oc, map[string]int32{"metrics": 8080, "probes": 8081})
	checkProbes(t, oc, "probes")
	if op.Spec.Template.Spec.ServiceAccountName != operatorName {
		t.Errorf("operator runs as ServiceAccount %q, want %q", op.Spec.Template.Spec.ServiceAccountName, operatorName)
	}

	// Services select the right pods: the decisions Service exposes only the decisions port,
	// the admin Service is ClusterIP.
	svc := typed[corev1.Service](t, m.get(t, "Service", limiterdName))
	checkService(t, svc, dep, op, corev1.ServiceTypeClusterIP, map[string]int32{"http": 8080})
	admin := typed[corev1.Service](t, m.get(t, "Service", limiterdName+"-admin"))
	checkService(t, admin, dep, op, corev1.ServiceTypeClusterIP, map[string]int32{"admin": 9090})
	opSvc := typed[corev1.Service](t, m.get(t, "Service", operatorName+"-metrics"))
	checkService(t, opSvc, op, dep, corev1.ServiceTypeClusterIP, map[string]int32{"metrics": 8080})

	// limiterd's RBAC: read-only ConfigMaps of the release namespace alone, bound to its
	// ServiceAccount; no ClusterRole.
	checkConfigMapRole(t, m, namespace)
	checkStatusRole(t, m)
	checkStatusAdmission(t, m, limiterdName)
	opcrb := typed[rbacv1.ClusterRoleBinding](t, m.get(t, "ClusterRoleBinding", operatorName))
	checkBinding(t, opcrb.RoleRef, opcrb.Subjects, "ClusterRole", operatorName, operatorName)
	oprb := typed[rbacv1.RoleBinding](t, m.get(t, "RoleBinding", operatorName))
	checkBinding(t, oprb.RoleRef, oprb.Subjects, "Role", operatorName, operatorName)
	rb := typed[rbacv1.RoleBinding](t, m.get(t, "RoleBinding", operatorName+"-leader-election"))
	checkBinding(t, rb.RoleRef, rb.Subjects, "Role", operatorName+"-leader-election", operatorName)

	// The CRD is kept on uninstall.
	crd := m.get(t, "CustomResourceDefinition", "ratelimitpolicies.limiterd.dev")
	if got := crd.GetAnnotations()["helm.sh/resource-policy"]; got != "keep" {
		t.Errorf("CRD annotation helm.sh/resource-policy = %q, want keep", got)
	}
}

// TestTemplateAllFeatures checks every optional object of ci/all-features-values.yaml.
func TestTemplateAllFeatures(t *testing.T) {
	t.Parallel()
	m := render(t, "--values", chartRel+"/ci/all-features-values.yaml")
	want := map[string]int{
		"CustomResourceDefinition": 1, "ServiceAccount": 2, "ClusterRole": 4, "ClusterRoleBinding": 3, // with operator.legacyConfigMapCleanup's
		"Role": 4, "RoleBinding": 4, "Service": 3, "Deployment": 2, "Secret": 1,
		"HorizontalPodAutoscaler": 1, "PodDisruptionBudget": 1, "ServiceMonitor": 2, "NetworkPolicy": 2, "ConfigMap": 1,
		"ValidatingAdmissionPolicy": 2, "ValidatingAdmissionPolicyBinding": 2,
	}
	if got := m.kinds(); !mapsEqual(got, want) {
		t.Errorf("kinds = %v, want %v", got, want)
	}
	for _, o := range m {
		if o.GetLabels()["team"] != "platform" {
			t.Errorf("%s %s lacks commonLabels team=platform: %v", o.GetKind(), o.GetName(), o.GetLabels())
		}
	}
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName))
	op := typed[appsv1.Deployment](t, m.get(t, "Deployment", operatorName))
	checkPodSecurity(t, dep)
	checkPodSecurity(t, op)
	pod := dep.Spec.Template
	c := container(t, dep, "limiterd")
	checkPorts(t, c, map[string]int32{"http": 8080, "admin": 9090, "grpc": 8081})

	if dep.Spec.Replicas != nil {
		t.Errorf("limiterd replicas = %d with autoscaling on, want unset (the HPA owns it)", *dep.Spec.Replicas)
	}
	if want := "ghcr.io/limiterd/limiterd@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"; c.Image != want {
		t.Errorf("limiterd image = %q, want the digest %q", c.Image, want)
	}
	if got := pod.Spec.ImagePullSecrets; len(got) != 1 || got[0].Name != "ghcr-pull" {
		t.Errorf("imagePullSecrets = %v", got)
	}
	if pod.Labels["tier"] != "data-plane" || pod.Annotations["example.com/owner"] != "platform" {
		t.Errorf("pod labels/annotations = %v / %v", pod.Labels, pod.Annotations)
	}
	if pod.Spec.Affinity == nil || pod.Spec.Affinity.PodAntiAffinity == nil || len(pod.Spec.TopologySpreadConstraints) != 1 {
		t.Errorf("affinity or topology spread constraints missing")
	}
	if got := op.Spec.Template.Spec.PriorityClassName; got != "system-cluster-critical" {
		t.Errorf("operator priorityClassName = %q", got)
	}
	if got := op.Spec.Template.Spec.Tolerations; len(got) != 1 || got[0].Key != "dedicated" {
		t.Errorf("operator tolerations = %v", got)
	}

	// Redis with a password file and mutual TLS, each file from the named Secret.
	checkArgs(t, c.Args, []string{
		"--grpc-addr=:8081", "--store=redis", "--store-timeout=50ms", "--redis-addr=redis-master.redis.svc:6379", "--redis-tls",
		"--redis-tls-server-name=redis.example.internal", "--redis-clock=client", "--redis-local-reject-cache=10000", "--redis-max-flush-delay=100us", "--status-interval=10s",
		"--max-clients=2000000", "--log-level=debug", "--legacy-ratelimit-headers", "--top-clients", "--shutdown-timeout=20s", "--sweep-interval=30s",
		"--allowed-hosts=" + strings.Join([]string{limiterdName, limiterdName + "." + namespace, limiterdName + "." + namespace + ".svc",
			limiterdName + "." + namespace + ".svc.cluster.local", "ratelimit.example.com"}, ","),
	}, []string{"--namespace"})
	checkSecretFile(t, dep, c, "--redis-password-file", "limiterd-redis", "redis-password")
	checkSecretFile(t, dep, c, "--redis-ca-file", "limiterd-redis-tls", "ca.crt")
	checkSecretFile(t, dep, c, "--redis-cert-file", "limiterd-redis-tls", "tls.crt")
	checkSecretFile(t, dep, c, "--redis-key-file", "limiterd-redis-tls", "tls.key")
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" && e.Value == "450MiB" }) {
		t.Errorf("limiterd env = %v, want GOMEMLIMIT", c.Env)
	}

	// Services: the decisions Service is a LoadBalancer, the admin one stays ClusterIP.
	svc := typed[corev1.Service](t, m.get(t, "Service", limiterdName))
	checkService(t, svc, dep, op, corev1.ServiceTypeLoadBalancer, map[string]int32{"http": 8080, "grpc": 8081})
	admin := typed[corev1.Service](t, m.get(t, "Service", limiterdName+"-admin"))
	checkService(t, admin, dep, op, corev1.ServiceTypeClusterIP, map[string]int32{"admin": 9090})

	// HorizontalPodAutoscaler.
	hpa := typed[autoscalingv2.HorizontalPodAutoscaler](t, m.get(t, "HorizontalPodAutoscaler", limiterdName))
	if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != limiterdName || ref.APIVersion != "apps/v1" {
		t.Errorf("HPA targets %+v", ref)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 12 {
		t.Errorf("HPA replicas %v..%d, want 3..12", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	targets := map[corev1.ResourceName]int32{}
	for _, mt := range hpa.Spec.Metrics {
		if mt.Resource != nil && mt.Resource.Target.AverageUtilization != nil {
			targets[mt.Resource.Name] = *mt.Resource.Target.AverageUtilization
		}
	}
	if !mapsEqual(targets, map[corev1.ResourceName]int32{corev1.ResourceCPU: 60, corev1.ResourceMemory: 80}) {
		t.Errorf("HPA targets %v", targets)
	}
	if hpa.Spec.Behavior == nil || hpa.Spec.Behavior.ScaleDown == nil {
		t.Errorf("HPA behavior missing")
	}

	// PodDisruptionBudget.
	pdb := typed[policyv1.PodDisruptionBudget](t, m.get(t, "PodDisruptionBudget", limiterdName))
	if pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromString("25%") || pdb.Spec.MinAvailable != nil {
		t.Errorf("PDB maxUnavailable=%v minAvailable=%v, want 25%% and unset", pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
	}
	checkSelects(t, "PDB", pdb.Spec.Selector, dep, op)

	// ServiceMonitors: limiterd's scrapes the admin Service's admin port, not the decisions Service.
	sm := m.get(t, "ServiceMonitor", limiterdName)
	checkServiceMonitor(t, sm, admin, svc, "admin")
	osm := m.get(t, "ServiceMonitor", operatorName)
	checkServiceMonitor(t, osm, typed[corev1.Service](t, m.get(t, "Service", operatorName+"-metrics")), svc, "metrics")
	if sm.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor labels %v lack release=kube-prometheus-stack", sm.GetLabels())
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if ep := eps[0].(map[string]any); ep["interval"] != "15s" || ep["scrapeTimeout"] != "5s" || ep["metricRelabelings"] == nil {
		t.Errorf("ServiceMonitor endpoint %v", ep)
	}

	// NetworkPolicies (TestTemplateNetworkPolicy checks their rules).
	checkSelects(t, "NetworkPolicy", &typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", limiterdName)).Spec.PodSelector, dep, op)
	checkSelects(t, "operator NetworkPolicy", &typed[networkingv1.NetworkPolicy](t, m.get(t, "NetworkPolicy", operatorName)).Spec.PodSelector, op, dep)

	// Grafana dashboard, for the sidecar.
	cm := typed[corev1.ConfigMap](t, m.get(t, "ConfigMap", limiterdName+"-dashboard"))
	if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "limiterd" {
		t.Errorf("dashboard ConfigMap labels %v annotations %v", cm.Labels, cm.Annotations)
	}
	want2, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "grafana", "limiterd.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got, wantJSON any
	if err := json.Unmarshal([]byte(cm.Data["limiterd.json"]), &got); err != nil {
		t.Fatalf("dashboard ConfigMap: %v", err)
	}
	if err := json.Unmarshal(want2, &wantJSON); err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(got, wantJSON) {
		t.Errorf("dashboard ConfigMap data differs from docs/grafana/limiterd.json")
	}
}

// TestTemplateRedisCluster checks ci/redis-cluster-values.yaml: Redis with a password and TLS
// verified by a CA (no client certificate), and a PodDisruptionBudget by minAvailable.
func TestTemplateRedisCluster(t *testing.T) {
	t.Parallel()
	m := render(t, "--values", chartRel+"/ci/redis-cluster-values.yaml")
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName))
	c := container(t, dep, "limiterd")
	var addrs []string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--redis-addr="); ok {
			addrs = append(addrs, v)
		}
	}
	if len(addrs) != 3 || addrs[0] != "redis-cluster-0.redis-cluster-headless.redis.svc.cluster.local:6379" {
		t.Errorf("--redis-addr flags %v, want the three cluster nodes", addrs)
	}
	checkArgs(t, c.Args, []string{"--store=redis", "--redis-tls", "--store-timeout=25ms", "--redis-clock=server"},
		[]string{"--redis-cert-file", "--redis-key-file", "--redis-local-reject-cache", "--redis-tls-server-name"})
	checkSecretFile(t, dep, c, "--redis-password-file", "redis-auth", "password")
	checkSecretFile(t, dep, c, "--redis-ca-file", "redis-ca", "ca.crt")
	if *dep.Spec.Replicas != 3 {
		t.Errorf("replicas = %d, want 3", *dep.Spec.Replicas)
	}
	pdb := typed[policyv1.PodDisruptionBudget](t, m.get(t, "PodDisruptionBudget", limiterdName))
	if pdb.Spec.MinAvailable == nil || *pdb.Spec.MinAvailable != intstr.FromInt32(2) || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("PDB minAvailable=%v maxUnavailable=%v, want 2 and unset", pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
	}
	if n := len(m.ofKind("HorizontalPodAutoscaler")); n != 0 {
		t.Errorf("%d HPAs rendered, want none", n)
	}
}

// TestTemplateNamespaced checks ci/namespaced-values.yaml: limiterd reads one namespace through
// a Role where another release's operator renders the ConfigMaps; no operator, no CRD, no
// ClusterRole for ConfigMaps.
func TestTemplateNamespaced(t *testing.T) {
	t.Parallel()
	m := render(t, "--values", chartRel+"/ci/namespaced-values.yaml", "--namespace", "team-a-system")
	want := map[string]int{
		"ServiceAccount": 1, "Role": 2, "RoleBinding": 2, "Service": 2, "Deployment": 1, "NetworkPolicy": 1, "Secret": 1,
		"ClusterRole": 2, "ClusterRoleBinding": 1, // the admin API's (limiterd-auth-rbac.yaml), none for ConfigMaps
		"ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1,
	}
	if got := m.kinds(); !mapsEqual(got, want) {
		t.Errorf("kinds = %v, want %v", got, want)
	}
	role := typed[rbacv1.Role](t, m.get(t, "Role", limiterdName))
	if role.Namespace != "limiterd-system" {
		t.Errorf("Role namespace = %q, want limiterd-system, where the other release's operator renders", role.Namespace)
	}
	if got, want := ruleSet(role.Rules), ruleSet([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}); !mapsEqual(got, want) {
		t.Errorf("Role grants %v", keys(got))
	}
	rb := typed[rbacv1.RoleBinding](t, m.get(t, "RoleBinding", limiterdName))
	if rb.Namespace != "limiterd-system" || len(rb.Subjects) != 1 || rb.Subjects[0].Namespace != "team-a-system" || rb.Subjects[0].Name != limiterdName {
		t.Errorf("RoleBinding %s/%s binds %+v, want ServiceAccount team-a-system/%s", rb.Namespace, rb.Name, rb.Subjects, limiterdName)
	}
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName))
	checkArgs(t, container(t, dep, "limiterd").Args, []string{"--namespace=team-a", "--configmap-namespace=limiterd-system",
		"--store=memory", "--status-namespace=team-a-system"}, nil)
	if out := renderErr(t, "--set", "limiterd.configMapNamespace=elsewhere"); !strings.Contains(out, "limiterd.configMapNamespace is for a release whose operator is another release's") {
		t.Errorf("configMapNamespace with this release's operator: %s", out)
	}
}

// checkConfigMapRole checks limiterd's Role for the policy ConfigMaps: in namespace, only get,
// list and watch of ConfigMaps, bound to limiterd's ServiceAccount of the release namespace.
func checkConfigMapRole(t testing.TB, m manifest, namespace string) {
	t.Helper()
	role := typed[rbacv1.Role](t, m.get(t, "Role", limiterdName))
	want := ruleSet([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}})
	if got := ruleSet(role.Rules); role.Namespace != namespace || !mapsEqual(got, want) {
		t.Errorf("limiterd Role %s/%s grants %v, want %v in %s", role.Namespace, role.Name, keys(got), keys(want), namespace)
	}
	rb := typed[rbacv1.RoleBinding](t, m.get(t, "RoleBinding", limiterdName))
	if rb.Namespace != namespace {
		t.Errorf("limiterd RoleBinding namespace %q, want %q", rb.Namespace, namespace)
	}
	checkBinding(t, rb.RoleRef, rb.Subjects, "Role", limiterdName, limiterdName)
}

// checkOperatorAdmission checks the admission policy narrowing the operator's ConfigMap
// deletions: deletes of ConfigMaps by ServiceAccount sa outside the release namespace, admitted
// for a policy ConfigMap of an earlier version only.
func checkOperatorAdmission(t testing.TB, m manifest, sa string) {
	t.Helper()
	vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, m.get(t, "ValidatingAdmissionPolicy", operatorPolicyName))
	if fp := vap.Spec.FailurePolicy; fp == nil || *fp != admissionregistrationv1.Fail {
		t.Errorf("operator admission failurePolicy %v, want Fail", fp)
	}
	rules := vap.Spec.MatchConstraints.ResourceRules
	if len(rules) != 1 || !slices.Equal(rules[0].APIGroups, []string{""}) || !slices.Equal(rules[0].Resources, []string{"configmaps"}) ||
		!slices.Equal(rules[0].Operations, []admissionregistrationv1.OperationType{"DELETE"}) {
		t.Errorf("operator admission matches %+v, want ConfigMap deletes", rules)
	}
	mc := vap.Spec.MatchConditions
	if len(mc) != 2 || mc[0].Expression != "request.userInfo.username == 'system:serviceaccount:"+namespace+":"+sa+"'" ||
		mc[1].Expression != "request.namespace != '"+namespace+"'" {
		t.Errorf("operator admission match conditions %+v, want ServiceAccount %s outside %s", mc, sa, namespace)
	}
	b := typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, m.get(t, "ValidatingAdmissionPolicyBinding", operatorPolicyName))
	if b.Spec.PolicyName != operatorPolicyName || b.Spec.MatchResources != nil ||
		!slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("operator admission binding %+v", b.Spec)
	}
}

// TestTemplateCRDOptions checks crds.keep and crds.install.
func TestTemplateCRDOptions(t *testing.T) {
	t.Parallel()
	crd := render(t, "--set", "crds.keep=false").get(t, "CustomResourceDefinition", "ratelimitpolicies.limiterd.dev")
	if _, ok := crd.GetAnnotations()["helm.sh/resource-policy"]; ok {
		t.Errorf("crds.keep=false: CRD still annotated %v", crd.GetAnnotations())
	}
	if n := len(render(t, "--set", "crds.install=false").ofKind("CustomResourceDefinition")); n != 0 {
		t.Errorf("crds.install=false: %d CRDs rendered", n)
	}
}

// TestTemplateOptionalOff checks that the defaults render none of the optional objects and that
// switching off RBAC, ServiceAccounts and leader election drops their objects.
func TestTemplateOptionalOff(t *testing.T) {
	t.Parallel()
	m := render(t, "--set", "rbac.create=false", "--set", "limiterd.serviceAccount.create=false",
		"--set", "operator.serviceAccount.create=false", "--set", "operator.leaderElection.enabled=false")
	for _, k := range []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"} {
		if n := len(m.ofKind(k)); n != 0 {
			t.Errorf("%d %s rendered", n, k)
		}
	}
	op := typed[appsv1.Deployment](t, m.get(t, "Deployment", operatorName))
	checkArgs(t, container(t, op, "manager").Args, nil, []string{"--leader-elect", "--leader-election-namespace"})
	if sa := op.Spec.Template.Spec.ServiceAccountName; sa != "default" {
		t.Errorf("operator ServiceAccount = %q, want default", sa)
	}

	// Without RBAC the admission policy still narrows what limiterd's ServiceAccount (here the
	// namespace's default one) may write.
	checkStatusAdmission(t, m, "default")

	// Without the replica status, no Role for Leases, no admission policy and --status-interval=0.
	m = render(t, "--set", "limiterd.replicaStatus.enabled=false")
	for _, r := range m.ofKind("Role") {
		if r.GetName() == limiterdName+"-status" {
			t.Errorf("replicaStatus.enabled=false renders the status Role")
		}
	}
	for _, k := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if n := len(m.ofKind(k)); n != 0 {
			t.Errorf("replicaStatus.enabled=false renders %d %s, want none", n, k)
		}
	}
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName))
	checkArgs(t, container(t, dep, "limiterd").Args, []string{"--status-interval=0"}, []string{"--status-namespace", "--replica-name"})

	// restrictToOwnLease=false drops the admission policy only.
	m = render(t, "--set", "limiterd.replicaStatus.restrictToOwnLease=false")
	for _, k := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if n := len(m.ofKind(k)); n != 0 {
			t.Errorf("restrictToOwnLease=false renders %d %s, want none", n, k)
		}
	}
	checkStatusRole(t, m)
}

// TestTemplateLegacyConfigMapCleanup checks operator.legacyConfigMapCleanup, the one-time upgrade
// step that removes the ConfigMaps an earlier version rendered into the policies' namespaces:
// off by default, with nothing of it rendered; on, the operator's flag, a ClusterRole of its own
// granting delete on ConfigMaps (so that the operator's ClusterRole never holds a right on them)
// and the admission policy narrowing it, which restrictDeletes=false drops; rbac.create=false
// drops the ClusterRole and its binding.
func TestTemplateLegacyConfigMapCleanup(t *testing.T) {
	t.Parallel()
	legacyObjects := func(m manifest) []string {
		var out []string
		for _, o := range m {
			if o.GetName() == legacyCleanupName || o.GetName() == operatorPolicyName {
				out = append(out, o.GetKind()+" "+o.GetName())
			}
		}
		return out
	}
	operatorArgs := func(m manifest) []string {
		return container(t, typed[appsv1.Deployment](t, m.get(t, "Deployment", operatorName)), "manager").Args
	}

	m := render(t)
	if got := legacyObjects(m); len(got) != 0 {
		t.Errorf("defaults render %v, want nothing of the legacy cleanup", got)
	}
	checkArgs(t, operatorArgs(m), nil, []string{"--remove-legacy-configmaps"})

	m = render(t, "--set", "operator.legacyConfigMapCleanup.enabled=true")
	checkArgs(t, operatorArgs(m), []string{"--remove-legacy-configmaps"}, nil)
	role := typed[rbacv1.ClusterRole](t, m.get(t, "ClusterRole", legacyCleanupName))
	want := ruleSet([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"delete"}}})
	if got := ruleSet(role.Rules); !mapsEqual(got, want) {
		t.Errorf("ClusterRole %s grants %v, want %v", legacyCleanupName, keys(got), keys(want))
	}
	crb := typed[rbacv1.ClusterRoleBinding](t, m.get(t, "ClusterRoleBinding", legacyCleanupName))
	checkBinding(t, crb.RoleRef, crb.Subjects, "ClusterRole", legacyCleanupName, operatorName)
	// The operator's own ClusterRole still has no right on ConfigMaps: the step adds delete alone.
	for k := range ruleSet(typed[rbacv1.ClusterRole](t, m.get(t, "ClusterRole", operatorName)).Rules) {
		if strings.Contains(k, "configmaps") {
			t.Errorf("with the legacy cleanup, the operator's ClusterRole grants %s", k)
		}
	}
	got := operatorClusterRules(t, m, operatorName)
	for k := range ruleSet(typed[rbacv1.ClusterRole](t, m.get(t, "ClusterRole", operatorName)).Rules) {
		delete(got, k)
	}
	if !mapsEqual(got, want) {
		t.Errorf("the legacy cleanup adds %v to the operator's rights, want %v", keys(got), keys(want))
	}
	checkOperatorAdmission(t, m, operatorName)

	// restrictDeletes=false: the right without the admission policy.
	m = render(t, "--set", "operator.legacyConfigMapCleanup.enabled=true", "--set", "operator.legacyConfigMapCleanup.restrictDeletes=false")
	m.get(t, "ClusterRole", legacyCleanupName)
	for _, k := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		for _, o := range m.ofKind(k) {
			if o.GetName() == operatorPolicyName {
				t.Errorf("restrictDeletes=false renders %s %s", k, o.GetName())
			}
		}
	}

	// rbac.create=false: the admission policy still narrows what the operator's ServiceAccount
	// may delete, with whatever RBAC the cluster's administrator grants it.
	m = render(t, "--set", "operator.legacyConfigMapCleanup.enabled=true", "--set", "rbac.create=false")
	for _, k := range []string{"ClusterRole", "ClusterRoleBinding"} {
		if n := len(m.ofKind(k)); n != 0 {
			t.Errorf("rbac.create=false renders %d %s", n, k)
		}
	}
	checkOperatorAdmission(t, m, operatorName)

	// A release upgraded with --reuse-values from a chart without these values: off, and
	// restrictDeletes counts as its default when enabled is set alone.
	m = render(t, "--set", "operator.legacyConfigMapCleanup=null")
	if got := legacyObjects(m); len(got) != 0 {
		t.Errorf("legacyConfigMapCleanup unset renders %v, want nothing of it", got)
	}
	m = render(t, "--set", "operator.legacyConfigMapCleanup.restrictDeletes=null", "--set", "operator.legacyConfigMapCleanup.enabled=true")
	checkOperatorAdmission(t, m, operatorName)
}

// TestTemplateStatusAdmissionNames checks that the status admission policy follows the release:
// its name carries the full name and the release namespace (it is cluster-scoped), and it
// matches the ServiceAccount limiterd runs as.
func TestTemplateStatusAdmissionNames(t *testing.T) {
	t.Parallel()
	m := render(t, "--set", "fullnameOverride=edge", "--set", "limiterd.serviceAccount.name=edge-limiter")
	vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, m.get(t, "ValidatingAdmissionPolicy", "edge-replica-status."+namespace))
	if got := vap.Spec.MatchConditions[0].Expression; !strings.Contains(got, "'system:serviceaccount:"+namespace+":edge-limiter'") {
		t.Errorf("policy matches %q, want ServiceAccount %s/edge-limiter", got, namespace)
	}
	b := typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, m.get(t, "ValidatingAdmissionPolicyBinding", "edge-replica-status."+namespace))
	if b.Spec.PolicyName != vap.Name {
		t.Errorf("binding binds %q, want %q", b.Spec.PolicyName, vap.Name)
	}
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", "edge"))
	if sa := dep.Spec.Template.Spec.ServiceAccountName; sa != "edge-limiter" {
		t.Errorf("limiterd runs as %q, want edge-limiter", sa)
	}
}

// checkStatusAdmission checks the ValidatingAdmissionPolicy that keeps limiterd to its own status
// Lease and its binding: cluster-scoped, named after the release and its namespace, matching Lease
// writes of limiterd's ServiceAccount sa of the release namespace only, and bound in every
// namespace with Deny.
func checkStatusAdmission(t testing.TB, m manifest, sa string) {
	t.Helper()
	vap := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, m.get(t, "ValidatingAdmissionPolicy", statusPolicyName))
	if vap.Namespace != "" {
		t.Errorf("ValidatingAdmissionPolicy has namespace %q", vap.Namespace)
	}
	if fp := vap.Spec.FailurePolicy; fp == nil || *fp != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", fp)
	}
	rules := vap.Spec.MatchConstraints.ResourceRules
	if len(rules) != 1 || !slices.Equal(rules[0].APIGroups, []string{"coordination.k8s.io"}) || !slices.Equal(rules[0].Resources, []string{"leases"}) ||
		!slices.Equal(rules[0].Operations, []admissionregistrationv1.OperationType{"CREATE", "UPDATE", "DELETE"}) {
		t.Errorf("policy matches %+v, want Lease creates, updates and deletes", rules)
	}
	want := "request.userInfo.username == 'system:serviceaccount:" + namespace + ":" + sa + "'"
	if mc := vap.Spec.MatchConditions; len(mc) != 1 || mc[0].Expression != want {
		t.Errorf("policy match conditions %+v, want only %q", mc, want)
	}
	if len(vap.Spec.Validations) != 2 || !strings.Contains(vap.Spec.Validations[0].Expression, "request.name == variables.podName") {
		t.Errorf("policy validations %+v, want the Lease named after the pod", vap.Spec.Validations)
	}
	b := typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, m.get(t, "ValidatingAdmissionPolicyBinding", statusPolicyName))
	if b.Namespace != "" || b.Spec.PolicyName != statusPolicyName || b.Spec.ParamRef != nil || b.Spec.MatchResources != nil ||
		!slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding %s: %+v, want policy %s in every namespace with Deny", b.Name, b.Spec, statusPolicyName)
	}
}

// checkStatusRole checks limiterd's Role for its status Leases: in the release namespace, only
// get, create, update and delete of Leases, bound to limiterd's ServiceAccount.
func checkStatusRole(t testing.TB, m manifest) {
	t.Helper()
	role := typed[rbacv1.Role](t, m.get(t, "Role", limiterdName+"-status"))
	if role.Namespace != namespace {
		t.Errorf("status Role namespace %q, want %q", role.Namespace, namespace)
	}
	want := ruleSet([]rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update", "delete"}}})
	if got := ruleSet(role.Rules); !mapsEqual(got, want) {
		t.Errorf("status Role grants %v, want %v", keys(got), keys(want))
	}
	rb := typed[rbacv1.RoleBinding](t, m.get(t, "RoleBinding", limiterdName+"-status"))
	checkBinding(t, rb.RoleRef, rb.Subjects, "Role", limiterdName+"-status", limiterdName)
}

// TestTemplateRedisSentinel checks Redis Sentinel: the master's name, the Sentinels'
// addresses and their password file from its Secret, beside the master's, and no --redis-addr.
func TestTemplateRedisSentinel(t *testing.T) {
	t.Parallel()
	m := render(t, "--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.sentinel.masterName=mymaster",
		"--set", "limiterd.store.redis.sentinel.addrs={sentinel-0.redis:26379,sentinel-1.redis:26379}",
		"--set", "limiterd.store.redis.sentinel.passwordSecret.name=sentinel-auth",
		"--set", "limiterd.store.redis.sentinel.passwordSecret.key=sentinel-password",
		"--set", "limiterd.store.redis.passwordSecret.name=redis-auth")
	dep := typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName))
	c := container(t, dep, "limiterd")
	checkArgs(t, c.Args, []string{"--store=redis", "--redis-sentinel-master=mymaster",
		"--redis-sentinel-addr=sentinel-0.redis:26379", "--redis-sentinel-addr=sentinel-1.redis:26379"},
		[]string{"--redis-addr", "--redis-tls"})
	checkSecretFile(t, dep, c, "--redis-sentinel-password-file", "sentinel-auth", "sentinel-password")
	checkSecretFile(t, dep, c, "--redis-password-file", "redis-auth", "password")

	// Without a Secret, no Sentinel password.
	m = render(t, "--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.sentinel.masterName=mymaster",
		"--set", "limiterd.store.redis.sentinel.addrs={sentinel-0.redis:26379}")
	c = container(t, typed[appsv1.Deployment](t, m.get(t, "Deployment", limiterdName)), "limiterd")
	checkArgs(t, c.Args, []string{"--redis-sentinel-master=mymaster"}, []string{"--redis-sentinel-password-file", "--redis-password-file"})
}

// TestTemplateRefusesInconsistentValues checks the cross-key checks the schema cannot make.
func TestTemplateRefusesInconsistentValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"redis without address", []string{"--set", "limiterd.store.type=redis"}, "limiterd/store/redis/addrs"},
		{"redis addresses and sentinel", []string{"--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.addrs={r:6379}",
			"--set", "limiterd.store.redis.sentinel.masterName=m", "--set", "limiterd.store.redis.sentinel.addrs={s:26379}"},
			"limiterd.store.redis.addrs and limiterd.store.redis.sentinel exclude each other"},
		{"sentinel addresses without the master's name", []string{"--set", "limiterd.store.redis.sentinel.addrs={s:26379}"},
			"sentinel.masterName and limiterd.store.redis.sentinel.addrs must be given together"},
		{"client certificate without key", []string{"--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.addrs={r:6379}",
			"--set", "limiterd.store.redis.tls.enabled=true", "--set", "limiterd.store.redis.tls.secretName=s", "--set", "limiterd.store.redis.tls.certKey=tls.crt"},
			"certKey and limiterd.store.redis.tls.keyKey must be given together"},
		{"redis TLS without a CA Secret", []string{"--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.addrs={r:6379}",
			"--set", "limiterd.store.redis.tls.enabled=true"},
			"limiterd.store.redis.tls.enabled needs limiterd.store.redis.tls.secretName and caKey"},
		{"redis TLS without a CA key", []string{"--set", "limiterd.store.type=redis", "--set", "limiterd.store.redis.addrs={r:6379}",
			"--set", "limiterd.store.redis.tls.enabled=true", "--set", "limiterd.store.redis.tls.secretName=s", "--set", "limiterd.store.redis.tls.caKey="},
			"limiterd.store.redis.tls.enabled needs limiterd.store.redis.tls.secretName and caKey"},
		{"autoscaling min above max", []string{"--set", "limiterd.autoscaling.enabled=true", "--set", "limiterd.autoscaling.minReplicas=5", "--set", "limiterd.autoscaling.maxReplicas=3"},
			"minReplicas must not exceed maxReplicas"},
		{"status admission on a ServiceAccount shared with the operator", []string{"--set", "limiterd.serviceAccount.name=shared", "--set", "operator.serviceAccount.name=shared"},
			"limiterd.replicaStatus.restrictToOwnLease would refuse the operator's leader election Lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if out := renderErr(t, tc.args...); !strings.Contains(out, tc.want) {
				t.Errorf("error %q does not mention %q", out, tc.want)
			}
		})
	}
}

// container returns a Deployment's container by name.
func container(t testing.TB, d *appsv1.Deployment, name string) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == name {
			return c
		}
	}
	t.Fatalf("Deployment %s has no container %q", d.Name, name)
	return nil
}

// checkPodSecurity checks the secure defaults of a Deployment's pod and every container.
func checkPodSecurity(t testing.TB, d *appsv1.Deployment) {
	t.Helper()
	ps := d.Spec.Template.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot {
		t.Errorf("%s: pod securityContext.runAsNonRoot is not true", d.Name)
	}
	if ps == nil || ps.RunAsUser == nil || *ps.RunAsUser != 65532 {
		t.Errorf("%s: pod runs as user %v, want 65532", d.Name, ps.RunAsUser)
	}
	if ps == nil || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod seccompProfile is not RuntimeDefault", d.Name)
	}
	if len(d.Spec.Template.Spec.Containers) == 0 {
		t.Fatalf("%s: no containers", d.Name)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("%s/%s: no securityContext", d.Name, c.Name)
			continue
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Errorf("%s/%s: allowPrivilegeEscalation is not false", d.Name, c.Name)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Errorf("%s/%s: readOnlyRootFilesystem is not true", d.Name, c.Name)
		case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
			t.Errorf("%s/%s: runAsNonRoot is not true", d.Name, c.Name)
		case sc.Privileged != nil && *sc.Privileged:
			t.Errorf("%s/%s: privileged", d.Name, c.Name)
		case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0:
			t.Errorf("%s/%s: capabilities %+v, want drop [ALL] and no add", d.Name, c.Name, sc.Capabilities)
		case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
			t.Errorf("%s/%s: seccompProfile is not RuntimeDefault", d.Name, c.Name)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
				t.Errorf("%s/%s: no %s request", d.Name, c.Name, r)
			}
		}
		lim, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok {
			t.Errorf("%s/%s: no memory limit", d.Name, c.Name)
		} else if req := c.Resources.Requests[corev1.ResourceMemory]; lim.Cmp(req) < 0 {
			t.Errorf("%s/%s: memory limit %s below request %s", d.Name, c.Name, lim.String(), req.String())
		}
		if lim, ok := c.Resources.Limits[corev1.ResourceCPU]; ok && lim.Cmp(resource.MustParse("10m")) < 0 {
			t.Errorf("%s/%s: cpu limit %s", d.Name, c.Name, lim.String())
		}
	}
	if d.Spec.Template.Spec.HostNetwork || d.Spec.Template.Spec.HostPID || d.Spec.Template.Spec.HostIPC {
		t.Errorf("%s: uses host namespaces", d.Name)
	}
}

// checkProbes checks the liveness probe on /healthz and the readiness probe on /readyz, both on
// the named container port.
func checkProbes(t testing.TB, c *corev1.Container, port string) {
	t.Helper()
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s probe", c.Name, p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != intstr.FromString(port) {
			t.Errorf("%s: %s probe on %s port %v, want %s port %s", c.Name, p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path, port)
		}
		if p.probe.PeriodSeconds < 1 || p.probe.TimeoutSeconds < 1 || p.probe.FailureThreshold < 1 {
			t.Errorf("%s: %s probe timing %+v", c.Name, p.name, p.probe.ProbeHandler)
		}
	}
}

// checkPorts checks a container's named TCP ports.
func checkPorts(t testing.TB, c *corev1.Container, want map[string]int32) {
	t.Helper()
	got := map[string]int32{}
	for _, p := range c.Ports {
		if p.Protocol != corev1.ProtocolTCP {
			t.Errorf("%s: port %s protocol %s", c.Name, p.Name, p.Protocol)
		}
		got[p.Name] = p.ContainerPort
	}
	if !mapsEqual(got, want) {
		t.Errorf("%s: ports %v, want %v", c.Name, got, want)
	}
}

// checkArgs checks that args contain each of want and no flag named in absent.
func checkArgs(t testing.TB, args, want, absent []string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(args, w) {
			t.Errorf("args %q lack %q", args, w)
		}
	}
	for _, a := range absent {
		for _, arg := range args {
			if arg == a || strings.HasPrefix(arg, a+"=") {
				t.Errorf("args %q contain %q", args, arg)
			}
		}
	}
}

// flagValue returns the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// checkSecretFile checks that flag names a file mounted read-only from key of the Secret.
func checkSecretFile(t testing.TB, d *appsv1.Deployment, c *corev1.Container, flag, secret, key string) {
	t.Helper()
	file, ok := flagValue(c.Args, flag)
	if !ok {
		t.Errorf("args %q lack %s", c.Args, flag)
		return
	}
	for _, vm := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok {
			continue
		}
		if !vm.ReadOnly {
			t.Errorf("%s: volume %s is mounted writable", flag, vm.Name)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != vm.Name {
				continue
			}
			if v.Secret == nil || v.Secret.SecretName != secret {
				t.Errorf("%s: volume %s is not Secret %s: %+v", flag, v.Name, secret, v.VolumeSource)
				return
			}
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
				t.Errorf("%s: Secret volume %s is world-readable (mode %v)", flag, v.Name, v.Secret.DefaultMode)
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					if it.Key != key {
						t.Errorf("%s: file %s is key %q of Secret %s, want %q", flag, file, it.Key, secret, key)
					}
					return
				}
			}
			t.Errorf("%s: Secret volume %s has no item for %s: %+v", flag, v.Name, rel, v.Secret.Items)
			return
		}
		t.Errorf("%s: no volume %s", flag, vm.Name)
		return
	}
	t.Errorf("%s=%s is under no volume mount of %s (%+v)", flag, file, c.Name, c.VolumeMounts)
}

// podLabels returns the labels of a Deployment's pods.
func podLabels(d *appsv1.Deployment) labels.Set { return labels.Set(d.Spec.Template.Labels) }

// checkSelects checks that sel selects the pods of d and not those of other.
func checkSelects(t testing.TB, what string, sel *metav1.LabelSelector, d, other *appsv1.Deployment) {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("%s selector: %v", what, err)
	}
	if s.Empty() || !s.Matches(podLabels(d)) {
		t.Errorf("%s selector %v does not select %s's pods %v", what, s, d.Name, podLabels(d))
	}
	if s.Matches(podLabels(other)) {
		t.Errorf("%s selector %v also selects %s's pods", what, s, other.Name)
	}
	// The Deployment's own selector must select its pods too.
	ds, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !ds.Matches(podLabels(d)) {
		t.Errorf("Deployment %s selector %v does not select its pods", d.Name, d.Spec.Selector)
	}
}

// checkService checks a Service's type, that it selects d's pods (not other's), and that its
// ports are exactly ports (name to number), each forwarding to the container port of that name.
func checkService(t testing.TB, s *corev1.Service, d, other *appsv1.Deployment, typ corev1.ServiceType, ports map[string]int32) {
	t.Helper()
	if s.Spec.Type != typ {
		t.Errorf("Service %s type %s, want %s", s.Name, s.Spec.Type, typ)
	}
	checkSelects(t, "Service "+s.Name, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, d, other)
	got := map[string]int32{}
	for _, p := range s.Spec.Ports {
		got[p.Name] = p.Port
		if p.TargetPort != intstr.FromString(p.Name) {
			t.Errorf("Service %s port %s targets %s, want the container port of the same name", s.Name, p.Name, p.TargetPort.String())
		}
		found := false
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, cp := range c.Ports {
				found = found || cp.Name == p.Name
			}
		}
		if !found {
			t.Errorf("Service %s targets port %q, which no container of %s names", s.Name, p.Name, d.Name)
		}
	}
	if !mapsEqual(got, ports) {
		t.Errorf("Service %s ports %v, want %v", s.Name, got, ports)
	}
}

// checkServiceMonitor checks that a ServiceMonitor selects svc (and not other) in the release
// namespace and scrapes port's /metrics.
func checkServiceMonitor(t testing.TB, sm *unstructured.Unstructured, svc, other *corev1.Service, port string) {
	t.Helper()
	if sm.GetAPIVersion() != "monitoring.coreos.com/v1" {
		t.Errorf("ServiceMonitor apiVersion %s", sm.GetAPIVersion())
	}
	ml, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	sel := labels.SelectorFromSet(ml)
	if len(ml) == 0 || !sel.Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor %s selector %v does not select Service %s (%v)", sm.GetName(), ml, svc.Name, svc.Labels)
	}
	if sel.Matches(labels.Set(other.Labels)) {
		t.Errorf("ServiceMonitor %s selector %v also selects Service %s", sm.GetName(), ml, other.Name)
	}
	names, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "namespaceSelector", "matchNames")
	if !slices.Equal(names, []string{namespace}) {
		t.Errorf("ServiceMonitor %s namespaces %v", sm.GetName(), names)
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor %s endpoints %v", sm.GetName(), eps)
	}
	ep := eps[0].(map[string]any)
	if ep["port"] != port || ep["path"] != "/metrics" {
		t.Errorf("ServiceMonitor %s endpoint %v, want port %s path /metrics", sm.GetName(), ep, port)
	}
	if svc.Spec.Ports[0].Name != port {
		t.Errorf("Service %s has no port %s", svc.Name, port)
	}
}

// checkBinding checks a binding's role and that its only subject is the ServiceAccount sa of the
// release namespace.
func checkBinding(t testing.TB, ref rbacv1.RoleRef, subjects []rbacv1.Subject, kind, role, sa string) {
	t.Helper()
	if ref.Kind != kind || ref.Name != role || ref.APIGroup != rbacv1.GroupName {
		t.Errorf("binding refers to %+v, want %s %s", ref, kind, role)
	}
	if len(subjects) != 1 || subjects[0].Kind != rbacv1.ServiceAccountKind || subjects[0].Name != sa || subjects[0].Namespace != namespace {
		t.Errorf("binding subjects %+v, want ServiceAccount %s/%s", subjects, namespace, sa)
	}
}

// ruleSet expands RBAC rules into "group/resource:verb" triples (no wildcards allowed).
func ruleSet(rules []rbacv1.PolicyRule) map[string]bool {
	out := map[string]bool{}
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out[path.Join(g, res)+":"+v] = true
				}
			}
		}
		if len(r.NonResourceURLs) > 0 || len(r.ResourceNames) > 0 {
			out["nonResourceURLs or resourceNames"] = true
		}
	}
	return out
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func keys[K ~string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func jsonEqual(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

func typedDeployment(t testing.TB, u *unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	return typed[appsv1.Deployment](t, u)
}
