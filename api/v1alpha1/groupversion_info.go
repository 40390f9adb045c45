// Package v1alpha1 holds the RateLimitPolicy API (group limiterd.dev, version v1alpha1).
//
// The same types are the CRD served by the Kubernetes API server and the policy file format of
// limiterd when it runs without Kubernetes.
//
// +kubebuilder:object:generate=true
// +groupName=limiterd.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the RateLimitPolicy API.
	GroupVersion = schema.GroupVersion{Group: "limiterd.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API's types with a runtime.Scheme. It uses apimachinery only,
	// so that importing the API brings in no controller machinery.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers RateLimitPolicy and RateLimitPolicyList in GroupVersion.
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &RateLimitPolicy{}, &RateLimitPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
