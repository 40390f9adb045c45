// Package v1alpha1 holds the RateLimitPolicy API (group limiterd.dev, version v1alpha1).
//
// The same types are the CRD served by the Kubernetes API server and the policy file format of
// limiterd when it runs without Kubernetes.
//
// +kubebuilder:object:generate=true
// +groupName=limiterd.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the RateLimitPolicy API.
	GroupVersion = schema.GroupVersion{Group: "limiterd.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the API's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the API's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
