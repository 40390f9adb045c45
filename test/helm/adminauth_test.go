package helm_test

import (
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestTemplateAdminAuthRBAC checks the RBAC of the admin API's authentication: limiterd may
// review tokens and access, and the roles granted to its callers name exactly the actions
// limiterd authorizes (package adminauth).
func TestTemplateAdminAuthRBAC(t *testing.T) {
	t.Parallel()
	m := render(t)
	crb := typed[rbacv1.ClusterRoleBinding](t, m.get(t, "ClusterRoleBinding", limiterdName+"-auth-delegator"))
	checkBinding(t, crb.RoleRef, crb.Subjects, "ClusterRole", "system:auth-delegator", limiterdName)

	ca := typed[rbacv1.ClusterRole](t, m.get(t, "ClusterRole", "limiterd-client-admin"))
	want := ruleSet([]rbacv1.PolicyRule{
		{APIGroups: []string{"limiterd.dev"}, Resources: []string{"ratelimitpolicies/clients"}, Verbs: []string{"get", "delete"}},
		{APIGroups: []string{"limiterd.dev"}, Resources: []string{"ratelimitpolicies"}, Verbs: []string{"get", "list", "watch"}},
	})
	if got := ruleSet(ca.Rules); !mapsEqual(got, want) {
		t.Errorf("limiterd-client-admin grants %v, want %v", keys(got), keys(want))
	}
	for _, role := range []string{"admin", "edit"} {
		if ca.Labels["rbac.authorization.k8s.io/aggregate-to-"+role] != "true" {
			t.Errorf("limiterd-client-admin is not aggregated to %s: labels %v", role, ca.Labels)
		}
	}
	if ca.Labels["rbac.authorization.k8s.io/aggregate-to-view"] != "" {
		t.Error("limiterd-client-admin is aggregated to view, which must not reset clients")
	}

	mr := typed[rbacv1.ClusterRole](t, m.get(t, "ClusterRole", limiterdName+"-metrics-reader"))
	if len(mr.Rules) != 1 || len(mr.Rules[0].NonResourceURLs) != 1 || mr.Rules[0].NonResourceURLs[0] != "/metrics" ||
		len(mr.Rules[0].Verbs) != 1 || mr.Rules[0].Verbs[0] != "get" {
		t.Errorf("metrics-reader rules %+v, want get /metrics only", mr.Rules)
	}

	plain := render(t, "--set", "rbac.clientAdmin.aggregate=false")
	ca = typed[rbacv1.ClusterRole](t, plain.get(t, "ClusterRole", "limiterd-client-admin"))
	if len(ca.Labels) == 0 || ca.Labels["rbac.authorization.k8s.io/aggregate-to-admin"] != "" {
		t.Errorf("limiterd-client-admin labels with aggregate=false: %v", ca.Labels)
	}

	sm := render(t, "--set", "metrics.serviceMonitor.enabled=true").get(t, "ServiceMonitor", limiterdName)
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if ep := eps[0].(map[string]any); ep["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Errorf("limiterd ServiceMonitor endpoint %v sends no token", ep)
	}
}
