package docs

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	schemacel "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	"k8s.io/apimachinery/pkg/util/version"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// The oldest Kubernetes the pages name: compatibility.md's table and the README's prerequisites.
var (
	supportedRow  = regexp.MustCompile(`(?m)^\| Supported \| \*\*1\.(\d+) or later\*\*`)
	prerequisites = regexp.MustCompile(`\*\*Kubernetes 1\.(\d+) or later\*\*`)
)

// TestOldestKubernetesTakesTheCRD holds the oldest Kubernetes that compatibility.md and the README
// name to the CRD's CEL rules: an API server compiles a CRD's new rules with the CEL libraries of
// its minimum compatibility version, one minor below its own, and refuses the CRD if one does
// not compile. Every rule must compile there, and one must fail a minor earlier, so the number
// is neither too old (the CRD would be refused) nor younger than it needs to be. The tests run
// one Kubernetes only (1.37), which would take a CRD that older ones refuse.
func TestOldestKubernetesTakesTheCRD(t *testing.T) {
	page, err := os.ReadFile("compatibility.md")
	if err != nil {
		t.Fatal(err)
	}
	m := supportedRow.FindSubmatch(page)
	if m == nil {
		t.Fatalf("compatibility.md: no row %q", supportedRow)
	}
	oldest, _ := strconv.Atoi(string(m[1]))
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if r := prerequisites.FindSubmatch(readme); r == nil || string(r[1]) != string(m[1]) {
		t.Errorf("README.md's prerequisites name Kubernetes %q or later, compatibility.md 1.%d", r, oldest)
	}

	if failed := uncompiledRules(t, uint(oldest-1)); len(failed) > 0 {
		t.Errorf("Kubernetes 1.%d (CEL of 1.%d) would refuse the CRD: %d rules do not compile, first: %s",
			oldest, oldest-1, len(failed), failed[0])
	}
	if failed := uncompiledRules(t, uint(oldest-2)); len(failed) == 0 {
		t.Errorf("Kubernetes 1.%d (CEL of 1.%d) compiles every rule of the CRD: compatibility.md may name it", oldest-1, oldest-2)
	}
}

// uncompiledRules compiles every x-kubernetes-validations rule of the CRD as an API server whose
// minimum compatibility version is 1.minor compiles a new CRD's rules, and returns the errors.
func uncompiledRules(t *testing.T, minor uint) []string {
	t.Helper()
	b, err := os.ReadFile("../config/crd/bases/limiterd.dev_ratelimitpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatal(err)
	}
	var failed []string
	envs := environment.MustBaseEnvSet(version.MajorMinor(1, minor))
	for _, v := range crd.Spec.Versions {
		var internal apiextensionsinternal.JSONSchemaProps
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
			t.Fatal(err)
		}
		root, err := structuralschema.NewStructural(&internal)
		if err != nil {
			t.Fatal(err)
		}
		rules := 0
		var walk func(s *structuralschema.Structural, isRoot bool)
		walk = func(s *structuralschema.Structural, isRoot bool) {
			if len(s.XValidations) > 0 {
				rules += len(s.XValidations)
				results, err := schemacel.Compile(s, model.SchemaDeclType(s, isRoot), celconfig.PerCallLimit, envs, schemacel.NewExpressionsEnvLoader())
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range results {
					if r.Error != nil {
						failed = append(failed, r.Error.Error())
					}
				}
			}
			for name := range s.Properties {
				p := s.Properties[name]
				walk(&p, false)
			}
			if s.Items != nil {
				walk(s.Items, false)
			}
			if s.AdditionalProperties != nil && s.AdditionalProperties.Structural != nil {
				walk(s.AdditionalProperties.Structural, false)
			}
		}
		walk(root, true)
		if rules == 0 {
			t.Fatalf("version %s: no CEL rule found", v.Name)
		}
	}
	return failed
}
