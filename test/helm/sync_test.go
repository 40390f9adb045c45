package helm_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// TestCRDMatchesConfig checks that the CRD the chart installs is config/crd/bases' one, with only
// the chart's labels and the keep annotation added.
func TestCRDMatchesConfig(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRD in config/crd/bases: %v", err)
	}
	m := render(t)
	crds := m.ofKind("CustomResourceDefinition")
	if len(crds) != len(files) {
		t.Fatalf("chart renders %d CRDs, config/crd/bases has %d", len(crds), len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var want apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &want); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		got := typed[apiextensionsv1.CustomResourceDefinition](t, m.get(t, "CustomResourceDefinition", want.Name))
		if !reflect.DeepEqual(got.Spec, want.Spec) {
			t.Errorf("CRD %s: the chart's spec differs from %s; run `make chart-docs`", want.Name, f)
		}
		for k, v := range want.Annotations {
			if got.Annotations[k] != v {
				t.Errorf("CRD %s: annotation %s = %q, want %q", want.Name, k, got.Annotations[k], v)
			}
		}
		if got.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s is not kept on uninstall", want.Name)
		}
	}
}

// TestOperatorRBACMatchesConfig checks that the operator's ClusterRole, and its Roles of the
// release namespace together, grant exactly what config/rbac/role.yaml (generated from the
// controllers' +kubebuilder:rbac markers) grants: no more, no less. Neither grants any right on
// ConfigMaps outside the release namespace, and no other ClusterRole is bound to the operator
// (TestTemplateLegacyConfigMapCleanup checks the one-time upgrade step that adds one).
func TestOperatorRBACMatchesConfig(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := parseManifest(string(b))
	if err != nil {
		t.Fatal(err)
	}
	wantCluster, wantNS := map[string]bool{}, map[string]bool{}
	for _, d := range docs {
		switch d.GetKind() {
		case "ClusterRole":
			for k := range ruleSet(typed[rbacv1.ClusterRole](t, d).Rules) {
				wantCluster[k] = true
			}
		case "Role":
			for k := range ruleSet(typed[rbacv1.Role](t, d).Rules) {
				wantNS[k] = true
			}
		}
	}
	if len(wantCluster) == 0 || len(wantNS) == 0 {
		t.Fatalf("config/rbac/role.yaml: no ClusterRole or Role rules")
	}
	m := render(t)
	gotCluster := ruleSet(typed[rbacv1.ClusterRole](t, m.get(t, "ClusterRole", operatorName)).Rules)
	gotNS := ruleSet(typed[rbacv1.Role](t, m.get(t, "Role", operatorName)).Rules)
	for k := range ruleSet(typed[rbacv1.Role](t, m.get(t, "Role", operatorName+"-leader-election")).Rules) {
		gotNS[k] = true
	}
	diff := func(what string, got, want map[string]bool) {
		for k := range got {
			if !want[k] {
				t.Errorf("%s grants %s, which config/rbac/role.yaml does not", what, k)
			}
		}
		for k := range want {
			if !got[k] {
				t.Errorf("%s lacks %s, which config/rbac/role.yaml grants", what, k)
			}
		}
	}
	diff("operator ClusterRole", gotCluster, wantCluster)
	diff("operator Roles", gotNS, wantNS)
	for k := range gotCluster {
		if strings.Contains(k, "*") || strings.HasPrefix(k, "secrets") || strings.HasPrefix(k, "/secrets") {
			t.Errorf("operator ClusterRole grants %s", k)
		}
	}
	for k := range wantCluster {
		if strings.Contains(k, "configmaps") || strings.Contains(k, "*") {
			t.Errorf("config/rbac/role.yaml's ClusterRole grants %s; ConfigMaps are the operator's in its namespace only", k)
		}
	}
	if got := operatorClusterRules(t, m, operatorName); !mapsEqual(got, gotCluster) {
		t.Errorf("ClusterRoles bound to the operator grant %v, want its ClusterRole's %v alone", keys(got), keys(gotCluster))
	}
	for k := range operatorClusterRules(t, m, operatorName) {
		if strings.Contains(k, "configmaps") {
			t.Errorf("a ClusterRole bound to the operator grants %s: a right on the ConfigMaps of every namespace", k)
		}
	}
}

// operatorClusterRules returns the rules (ruleSet) of every ClusterRole of m bound by a
// ClusterRoleBinding of m to the ServiceAccount sa of the release namespace: what it may do in
// every namespace.
func operatorClusterRules(t testing.TB, m manifest, sa string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, d := range m.ofKind("ClusterRoleBinding") {
		crb := typed[rbacv1.ClusterRoleBinding](t, d)
		if !slices.ContainsFunc(crb.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == namespace
		}) {
			continue
		}
		if crb.RoleRef.Kind != "ClusterRole" {
			t.Fatalf("ClusterRoleBinding %s binds %s %s", crb.Name, crb.RoleRef.Kind, crb.RoleRef.Name)
		}
		for k := range ruleSet(typed[rbacv1.ClusterRole](t, m.get(t, "ClusterRole", crb.RoleRef.Name)).Rules) {
			out[k] = true
		}
	}
	return out
}

// TestStatusAdmissionMatchesConfig checks that the chart's status admission policy and binding
// are config/limiterd/status_admission.yaml's: the same spec, since release "limiterd" in
// limiterd-system runs limiterd as ServiceAccount limiterd-system/limiterd, as config/ does.
func TestStatusAdmissionMatchesConfig(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "limiterd", "status_admission.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := parseManifest(string(b))
	if err != nil {
		t.Fatal(err)
	}
	m := render(t)
	var n int
	for _, d := range docs {
		switch d.GetKind() {
		case "ValidatingAdmissionPolicy":
			n++
			want := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, d)
			got := typed[admissionregistrationv1.ValidatingAdmissionPolicy](t, m.get(t, d.GetKind(), statusPolicyName))
			if !reflect.DeepEqual(got.Spec, want.Spec) {
				t.Errorf("the chart's ValidatingAdmissionPolicy differs from config/limiterd/status_admission.yaml's:\n%+v\nwant\n%+v", got.Spec, want.Spec)
			}
		case "ValidatingAdmissionPolicyBinding":
			n++
			want := typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, d)
			got := typed[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, m.get(t, d.GetKind(), statusPolicyName))
			want.Spec.PolicyName = statusPolicyName
			if !reflect.DeepEqual(got.Spec, want.Spec) {
				t.Errorf("the chart's ValidatingAdmissionPolicyBinding %+v differs from config's %+v", got.Spec, want.Spec)
			}
		}
	}
	if n != 2 {
		t.Fatalf("config/limiterd/status_admission.yaml: %d policies and bindings, want 2", n)
	}
}

// TestFlagsMatchBinaries checks that every flag the chart passes is defined by the binaries'
// sources (limiterd in cmd/limiterd, the operator in main.go plus controller-runtime's zap
// flags), so that a renamed flag fails here rather than in a crash-looping pod.
func TestFlagsMatchBinaries(t *testing.T) {
	t.Parallel()
	defined := func(paths ...string) map[string]bool {
		out := map[string]bool{}
		re := regexp.MustCompile(`\.(?:String|Bool|Int|Int64|Uint|Uint64|Duration|Float64|Text|Func|BoolFunc)?Var\([^,]+,\s*"([a-z0-9-]+)"|\.(?:String|Bool|Int|Int64|Uint|Uint64|Duration|Float64)\(\s*"([a-z0-9-]+)"`)
		for _, p := range paths {
			matches, _ := filepath.Glob(filepath.Join(repoRoot(t), p))
			for _, f := range matches {
				if strings.HasSuffix(f, "_test.go") {
					continue
				}
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range re.FindAllStringSubmatch(string(b), -1) {
					out[m[1]+m[2]] = true
				}
			}
		}
		return out
	}
	limiterdFlags := defined("cmd/limiterd/*.go")
	operatorFlags := defined("main.go")
	operatorFlags["zap-log-level"] = true // zap.Options.BindFlags
	operatorFlags["zap-encoder"] = true
	operatorFlags["zap-devel"] = true
	if len(limiterdFlags) == 0 || len(operatorFlags) < 4 {
		t.Fatalf("found no flag definitions (limiterd %v, operator %v)", limiterdFlags, operatorFlags)
	}
	// The operator reads zap's flags only when main.go binds them.
	if b, err := os.ReadFile(filepath.Join(repoRoot(t), "main.go")); err != nil || !strings.Contains(string(b), "BindFlags(") {
		t.Errorf("main.go does not bind zap's flags, yet the chart passes --zap-log-level")
	}
	flagsOf := func(args []string) []string {
		var out []string
		for _, a := range args {
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			out = append(out, name)
		}
		return out
	}
	check := func(what string, args []string, defined map[string]bool, extra []string) {
		for _, f := range flagsOf(args) {
			if !defined[f] && !slices.Contains(extra, f) {
				t.Errorf("%s: the chart passes --%s, which the binary does not define (defined: %v)", what, f, keys(defined))
			}
		}
	}
	for _, values := range append([]string{""}, ciValues(t)...) {
		var m manifest
		if values == "" {
			m = render(t)
		} else {
			m = render(t, "--values", values)
		}
		for _, d := range m.ofKind("Deployment") {
			dep := typedDeployment(t, d)
			for _, c := range dep.Spec.Template.Spec.Containers {
				switch c.Name {
				case "limiterd":
					check(values+" limiterd", c.Args, limiterdFlags, nil)
				case "manager":
					check(values+" operator", c.Args, operatorFlags, nil)
				}
			}
		}
	}
}

// TestHelpersCommented checks that every helper of _helpers.tpl is preceded by a comment that
// names it.
func TestHelpersCommented(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(chartDir(t), "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	define := regexp.MustCompile(`\{\{-? define "([^"]+)" -?\}\}`)
	src := string(b)
	locs := define.FindAllStringSubmatchIndex(src, -1)
	if len(locs) < 10 {
		t.Fatalf("only %d helpers", len(locs))
	}
	for _, loc := range locs {
		name := src[loc[2]:loc[3]]
		before := strings.TrimRight(src[:loc[0]], "\n ")
		if !strings.HasSuffix(before, "*/}}") {
			t.Errorf("helper %s has no comment before it", name)
			continue
		}
		comment := before[strings.LastIndex(before, "{{/*"):]
		if !strings.Contains(comment, name+":") {
			t.Errorf("the comment before helper %s does not describe it: %q", name, comment)
		}
	}
}
