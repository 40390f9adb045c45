//go:build tools

// Package tools pins kube-apiserver for the test control plane; hack/envtest-assets.sh builds it.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
