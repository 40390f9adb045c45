package controllers

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/")

// checkRefused fails t unless renderConfigMap returned no data and a False Ready condition with reason
// and a message containing field, for generation gen.
func checkRefused(t *testing.T, data map[string]string, ready metav1.Condition, gen int64, reason, field string) {
	t.Helper()
	if data != nil {
		t.Errorf("renderConfigMap returned data for a policy it must not write")
	}
	if ready.Type != ConditionReady || ready.Status != metav1.ConditionFalse || ready.Reason != reason ||
		ready.ObservedGeneration != gen || !strings.Contains(ready.Message, field) {
		t.Errorf("renderConfigMap: condition %+v, want Ready=False reason %s at generation %d naming %q", ready, reason, gen, field)
	}
}

func TestRenderConfigMapRendersValidPolicies(t *testing.T) {
	for _, f := range loadPolicyFiles(t, "valid") {
		t.Run(f.Name, func(t *testing.T) {
			policies, err := limiterdv1alpha1.DecodePolicies(f.Data)
			if err != nil {
				t.Fatal(err)
			}
			for i := range policies {
				p := &policies[i]
				p.Generation = 7
				before := p.DeepCopy()
				data, ready := renderConfigMap(p, limiterdv1alpha1.MaxConfigMapDataBytes)
				if !equality.Semantic.DeepEqual(p, before) {
					t.Errorf("renderConfigMap modified the policy")
				}
				if ready.Status != metav1.ConditionTrue || ready.Reason != ReasonRendered || ready.ObservedGeneration != 7 {
					t.Fatalf("renderConfigMap: condition %+v, want Ready=True reason %s at generation 7", ready, ReasonRendered)
				}
				parsed, err := limiterdv1alpha1.ParseConfigMapData(limiterdv1alpha1.ConfigMapName(p.ID()), data)
				if err != nil {
					t.Fatal(err)
				}
				if parsed.Generation != 7 || !equality.Semantic.DeepEqual(parsed.Spec, p.Spec) {
					t.Errorf("renderConfigMap rendered generation %d spec %+v, want generation 7 spec %+v", parsed.Generation, parsed.Spec, p.Spec)
				}
			}
		})
	}
}

// An invalid policy reaches the operator only past an older CRD; renderConfigMap must refuse it, naming the
// field as the Go validator does.
func TestRenderConfigMapRefusesInvalidPolicies(t *testing.T) {
	for _, f := range loadPolicyFiles(t, "invalid") {
		t.Run(f.Name, func(t *testing.T) {
			p := &limiterdv1alpha1.RateLimitPolicy{}
			if err := yaml.Unmarshal(f.Data, p); err != nil { // leniently, as an older CRD admits it
				t.Fatal(err)
			}
			p.Namespace, p.Generation = "default", 3
			data, ready := renderConfigMap(p, limiterdv1alpha1.MaxConfigMapDataBytes)
			checkRefused(t, data, ready, 3, ReasonInvalid, f.Field)
		})
	}
}

func TestRenderConfigMapRefusesTooLargePolicies(t *testing.T) {
	t.Run("beyond MaxConfigMapDataBytes", func(t *testing.T) {
		p := newPolicy("default", "big")
		p.Spec, p.Generation = bigSpec(), 2
		if err := limiterdv1alpha1.Validate(p); err != nil {
			t.Fatalf("bigSpec is invalid: %v", err)
		}
		data, ready := renderConfigMap(p, limiterdv1alpha1.MaxConfigMapDataBytes)
		checkRefused(t, data, ready, 2, ReasonTooLarge, "bytes, more than")
	})
	t.Run("beyond the given bound", func(t *testing.T) {
		p := newPolicy("default", "small")
		p.Generation = 1
		data, ready := renderConfigMap(p, 100)
		checkRefused(t, data, ready, 1, ReasonTooLarge, "more than 100")
	})
}

// An older CRD may not default: renderConfigMap renders the defaulted policy.
func TestRenderConfigMapDefaults(t *testing.T) {
	p := newPolicy("default", "undefaulted")
	p.Generation = 1
	data, ready := renderConfigMap(p, limiterdv1alpha1.MaxConfigMapDataBytes)
	if ready.Status != metav1.ConditionTrue {
		t.Fatalf("renderConfigMap: condition %+v, want Ready=True", ready)
	}
	if p.Spec.FailureMode != "" || p.Spec.Tiers[0].TokenBucket.RefillPeriod != nil {
		t.Errorf("renderConfigMap modified the policy")
	}
	parsed, err := limiterdv1alpha1.ParseConfigMapData(limiterdv1alpha1.ConfigMapName(limiterdv1alpha1.NewPolicyID("default", "undefaulted")), data)
	if err != nil {
		t.Fatal(err)
	}
	if parsed.Spec.FailureMode != limiterdv1alpha1.DefaultFailureMode ||
		parsed.Spec.Tiers[0].TokenBucket.RefillPeriod.Duration != limiterdv1alpha1.DefaultRefillPeriod {
		t.Errorf("rendered spec %+v is not defaulted", parsed.Spec)
	}
}

// TestConfigMapGolden pins the whole ConfigMap the operator writes for config/samples (run with
// -update to rewrite testdata/configmap-sample.golden.yaml).
func TestConfigMapGolden(t *testing.T) {
	sample, err := os.ReadFile(filepath.Join("..", "config", "samples", "ratelimitpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	policies, err := limiterdv1alpha1.DecodePolicies(sample)
	if err != nil || len(policies) != 1 {
		t.Fatalf("decode sample: %d policies, %v; want 1", len(policies), err)
	}
	p := &policies[0]
	p.UID, p.Generation = "6c1b7a9e-0000-4000-8000-000000000001", 1
	data, ready := renderConfigMap(p, limiterdv1alpha1.MaxConfigMapDataBytes)
	if ready.Status != metav1.ConditionTrue {
		t.Fatalf("renderConfigMap: condition %+v, want Ready=True", ready)
	}
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: limiterdv1alpha1.DefaultReplicaStatusNamespace, Name: limiterdv1alpha1.ConfigMapName(p.ID())},
	}
	setDesired(p, cm, data)
	got, err := yaml.Marshal(cm)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "configmap-sample.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestConfigMapGolden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("ConfigMap differs from %s (run with -update if intended):\n--- got\n%s\n--- want\n%s", golden, got, want)
	}
}
