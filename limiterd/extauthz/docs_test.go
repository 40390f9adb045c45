package extauthz_test

import (
	"os"
	"testing"

	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // the router's typed_config
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/limiterd/extauthz"
)

// TestShippedEnvoyConfig decodes docs/gateways/envoy.yaml as Envoy would (the typed_config of
// an HTTP connection manager), validates it with go-control-plane's generated rules, and checks
// that it asks limiterd as the package documents: gRPC, V3, failure_mode_allow false, and a
// route naming its policy in the context extensions limiterd reads.
func TestShippedEnvoyConfig(t *testing.T) {
	b, err := os.ReadFile("../../docs/gateways/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := protojson.Unmarshal(j, &hcm); err != nil {
		t.Fatalf("decode: %v", err)
	}
	if err := hcm.ValidateAll(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if !hcm.GetUseRemoteAddress().GetValue() {
		t.Errorf("use_remote_address is not set: x-forwarded-for's last entry would not be Envoy's peer")
	}
	var filter extauthzv3.ExtAuthz
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&filter); err != nil {
		t.Fatalf("the first filter: %v", err)
	}
	if filter.GetGrpcService().GetEnvoyGrpc().GetClusterName() == "" || filter.GetFailureModeAllow() ||
		filter.GetWithRequestBody() != nil {
		t.Errorf("ext_authz filter %v: want a gRPC service, failure_mode_allow false, no body", &filter)
	}
	var per extauthzv3.ExtAuthzPerRoute
	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
	if err := route.GetTypedPerFilterConfig()["envoy.filters.http.ext_authz"].UnmarshalTo(&per); err != nil {
		t.Fatalf("per-route config: %v", err)
	}
	ext := per.GetCheckSettings().GetContextExtensions()
	if ext[extauthz.ExtensionNamespace] != "shop" || ext[extauthz.ExtensionPolicy] != "api" {
		t.Errorf("context_extensions %v, want the policy shop/api", ext)
	}
}
