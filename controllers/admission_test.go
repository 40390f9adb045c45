package controllers

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
)

// TestAdmissionMatchesValidate runs the policy files of api/v1alpha1/testdata against both the
// API server (the CRD's schema and CEL rules, by a dry-run create) and the Go validator
// (DecodePolicies): both must accept every valid file and reject every invalid one, naming the
// field its "# field:" (or "# apiserver-field:") line gives; except that the API server admits
// an invalid file marked "# apiserver-accepts:" (a rule the CRD cannot express, such as a time
// zone's lookup), which only the Go validator refuses.
func TestAdmissionMatchesValidate(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	for _, dir := range []string{"valid", "invalid"} {
		for _, f := range loadPolicyFiles(t, dir) {
			t.Run(dir+"/"+f.Name, func(t *testing.T) {
				_, goErr := limiterdv1alpha1.DecodePolicies(f.Data)

				j, err := yaml.YAMLToJSON(f.Data)
				if err != nil {
					t.Fatal(err)
				}
				obj := &unstructured.Unstructured{}
				if err := obj.UnmarshalJSON(j); err != nil {
					t.Fatal(err)
				}
				obj.SetNamespace(ns)
				apiErr := env.Client.Create(t.Context(), obj, client.DryRunAll)

				if dir == "valid" {
					if goErr != nil {
						t.Errorf("Go validator rejected a valid policy: %v", goErr)
					}
					if apiErr != nil {
						t.Errorf("API server rejected a valid policy: %v", apiErr)
					}
					return
				}
				if goErr == nil || !strings.Contains(goErr.Error(), f.Field) {
					t.Errorf("Go validator: got error %v, want one naming %s", goErr, f.Field)
				}
				if f.APIServerAccepts != "" {
					if apiErr != nil {
						t.Errorf("API server rejected a policy marked as admitted (%s): %v; remove the apiserver-accepts line", f.APIServerAccepts, apiErr)
					}
					return
				}
				if !apierrors.IsInvalid(apiErr) || !strings.Contains(apiErr.Error(), f.APIServerField) {
					t.Errorf("API server: got error %v, want Invalid naming %s", apiErr, f.APIServerField)
				}
			})
		}
	}
}
