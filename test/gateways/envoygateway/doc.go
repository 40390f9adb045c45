// Package envoygateway checks docs/gateways/envoy-gateway.yaml, the Envoy Gateway configuration
// that puts limiterd's ext_authz in front of an HTTPRoute, with Envoy Gateway's own API types.
//
// It is a module of its own: github.com/envoyproxy/gateway's api/v1alpha1 brings Envoy
// Gateway's whole dependency graph (Helm, container registries, a go directive newer than
// limiterd's), which limiterd's module should not carry. make test and make test-gateways run
// it; it imports limiterd's packages through a replace directive, so its checks run against the
// code of the same checkout.
package envoygateway
