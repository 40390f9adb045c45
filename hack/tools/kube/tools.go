//go:build tools

// Package tools pins the Kubernetes components built from the module proxy: kube-apiserver for the
// test control plane (hack/envtest-assets.sh), and the node components for the single-node test
// cluster (hack/node/binaries.sh).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
