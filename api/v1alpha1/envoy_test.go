package v1alpha1

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCRDMatchesEnvoyLimits checks the CRD's bounds of spec.envoy.descriptorKey against
// MaxDescriptorKeyBytes.
func TestCRDMatchesEnvoyLimits(t *testing.T) {
	key := loadCRDSchema(t).prop("spec", "envoy", "descriptorKey")
	if got := key.num("maxLength"); got != MaxDescriptorKeyBytes {
		t.Errorf("CRD descriptorKey maxLength = %d, want %d", got, MaxDescriptorKeyBytes)
	}
	if want := fmt.Sprintf("size(bytes(self)) <= %d", MaxDescriptorKeyBytes); !slices.Contains(key.rules(), want) {
		t.Errorf("CRD descriptorKey rules %q, want %q", key.rules(), want)
	}
}

func TestValidateEnvoy(t *testing.T) {
	policy := func(key string) *RateLimitPolicy {
		return &RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "p"},
			Spec: RateLimitPolicySpec{
				Tiers:       []Tier{{Name: "all", Algorithm: AlgorithmUnlimited}},
				DefaultTier: "all",
				Envoy:       &Envoy{DescriptorKey: key},
			},
		}
	}
	for _, ok := range []string{"", "remote_address", strings.Repeat("k", MaxDescriptorKeyBytes), strings.Repeat("é", MaxDescriptorKeyBytes/2)} {
		if err := Validate(policy(ok)); err != nil {
			t.Errorf("descriptorKey of %d bytes: %v", len(ok), err)
		}
	}
	for _, bad := range []string{strings.Repeat("k", MaxDescriptorKeyBytes+1), "\xff"} {
		err := Validate(policy(bad))
		if err == nil || !namesField(err, "spec.envoy.descriptorKey") {
			t.Errorf("descriptorKey %q: %v, want an error for spec.envoy.descriptorKey", bad, err)
		}
	}
}
