package extauthz_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"slices"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // the router's typed_config
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingv1 "istio.io/api/networking/v1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1 "istio.io/api/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/envoytest"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/extauthz"
)

// TestShippedEnvoyConfig decodes docs/gateways/envoy.yaml as Envoy would (the typed_config of
// an HTTP connection manager), validates it with go-control-plane's generated rules, and checks
// that it asks limiterd as the package documents: gRPC, V3, failure_mode_allow false, and a
// route naming its policy in the context extensions limiterd reads.
func TestShippedEnvoyConfig(t *testing.T) {
	hcm := envoytest.LoadHCM(t, "../../docs/gateways/envoy.yaml")
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

// istioFilterName is the name of the ext_authz filter Istio adds for an AuthorizationPolicy of
// action CUSTOM (istio.io/istio pkg/wellknown HTTPExternalAuthorization): a route's
// typed_per_filter_config reaches that filter only under this name.
const istioFilterName = "envoy.filters.http.ext_authz"

// object is a Kubernetes object of docs/gateways as kubectl reads it: its spec is decoded by
// the type its kind names.
type object struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       json.RawMessage   `json:"spec"`
}

// decodeStrict decodes YAML into v, refusing a field v does not have.
func decodeStrict(t *testing.T, what string, b []byte, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// decodeSpec decodes an object's spec into m as Istio's API server does (protojson), refusing
// unknown fields.
func decodeSpec(t *testing.T, o *object, m proto.Message) {
	t.Helper()
	if err := protojson.Unmarshal(o.Spec, m); err != nil {
		t.Fatalf("%s %s spec: %v", o.Kind, o.Metadata.Name, err)
	}
}

// The shipped Istio configuration's parts, decoded.
type istioConfig struct {
	provider *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExternalAuthorizationGrpcProvider
	name     string // the provider's name
	vs       *networkingv1.VirtualService
	authz    *securityv1.AuthorizationPolicy
	filter   *networkingv1alpha3.EnvoyFilter
}

// readIstioConfig decodes docs/gateways/istio-mesh.yaml (istiod's Helm values) and
// docs/gateways/istio.yaml (the objects kubectl applies) strictly into istio.io/api's types.
func readIstioConfig(t *testing.T) istioConfig {
	t.Helper()
	var c istioConfig
	b, err := os.ReadFile("../../docs/gateways/istio-mesh.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		MeshConfig json.RawMessage `json:"meshConfig"`
	}
	decodeStrict(t, "istio-mesh.yaml", b, &values)
	var mesh meshv1alpha1.MeshConfig
	if err := protojson.Unmarshal(values.MeshConfig, &mesh); err != nil {
		t.Fatalf("istio-mesh.yaml meshConfig: %v", err)
	}
	if n := len(mesh.GetExtensionProviders()); n != 1 {
		t.Fatalf("istio-mesh.yaml: %d extension providers, want limiterd's alone", n)
	}
	p := mesh.GetExtensionProviders()[0]
	c.name, c.provider = p.GetName(), p.GetEnvoyExtAuthzGrpc()
	if c.provider == nil {
		t.Fatalf("extension provider %q is not envoyExtAuthzGrpc: %v", c.name, p)
	}

	f, err := os.Open("../../docs/gateways/istio.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var o object
		decodeStrict(t, "istio.yaml", doc, &o)
		switch o.APIVersion + " " + o.Kind {
		case "networking.istio.io/v1 VirtualService":
			c.vs = &networkingv1.VirtualService{}
			decodeSpec(t, &o, c.vs)
		case "security.istio.io/v1 AuthorizationPolicy":
			c.authz = &securityv1.AuthorizationPolicy{}
			decodeSpec(t, &o, c.authz)
		case "networking.istio.io/v1alpha3 EnvoyFilter":
			c.filter = &networkingv1alpha3.EnvoyFilter{}
			decodeSpec(t, &o, c.filter)
		default:
			t.Fatalf("istio.yaml: unexpected %s %s", o.APIVersion, o.Kind)
		}
	}
	if c.vs == nil || c.authz == nil || c.filter == nil {
		t.Fatal("istio.yaml: want a VirtualService, an AuthorizationPolicy and an EnvoyFilter")
	}
	return c
}

// TestShippedIstioConfig decodes docs/gateways/istio-mesh.yaml and docs/gateways/istio.yaml
// with istio.io/api's types, refusing unknown fields, and checks that they ask limiterd as the
// package documents: the AuthorizationPolicy names the mesh's provider, which is the chart's
// gRPC Service and port, fails closed and times out; it selects exactly the route whose
// context extensions the EnvoyFilter sets, on the gateway the filter patches; and those
// extensions are what limiterd's Check decides a policy by, where a check without them (what
// Istio sends on any other route) is denied.
func TestShippedIstioConfig(t *testing.T) {
	c := readIstioConfig(t)

	// The provider: limiterd's gRPC Service as the chart names it (release "limiterd" in
	// namespace limiterd: fullname "limiterd"), fail closed, a timeout well below Istio's 600 s.
	if got, want := c.provider.GetService(), "limiterd.limiterd.svc.cluster.local"; got != want {
		t.Errorf("provider service %q, want the chart's Service %q", got, want)
	}
	if got, want := c.provider.GetPort(), envoytest.ChartGRPCPort(t, "../../charts/limiterd/values.yaml"); got != want {
		t.Errorf("provider port %d, want the chart's grpcPort %d", got, want)
	}
	if c.provider.GetFailOpen() {
		t.Error("failOpen: true admits every request unlimited while limiterd cannot answer")
	}
	if d := c.provider.GetTimeout().AsDuration(); d <= 0 || d > time.Second {
		t.Errorf("provider timeout %v, want one set, at most 1s", d)
	}
	if c.provider.GetIncludeRequestBodyInCheck() != nil || c.provider.GetStatusOnError() != "" {
		t.Errorf("provider %v: want no request body and the default status on error", c.provider)
	}

	// The AuthorizationPolicy: CUSTOM, by the provider's name, on the gateway the EnvoyFilter
	// patches.
	if c.authz.GetAction() != securityv1.AuthorizationPolicy_CUSTOM || c.authz.GetProvider().GetName() != c.name {
		t.Errorf("AuthorizationPolicy %v %q, want CUSTOM by the provider %q", c.authz.GetAction(), c.authz.GetProvider().GetName(), c.name)
	}
	if got, want := c.authz.GetSelector().GetMatchLabels(), c.filter.GetWorkloadSelector().GetLabels(); len(want) == 0 || !maps.Equal(got, want) {
		t.Errorf("AuthorizationPolicy selects %v, the EnvoyFilter patches %v: want the same gateway", got, want)
	}

	// The EnvoyFilter: the per-route configuration of Istio's ext_authz filter on a route of the
	// VirtualService.
	if n := len(c.filter.GetConfigPatches()); n != 1 {
		t.Fatalf("EnvoyFilter: %d patches, want 1", n)
	}
	patch := c.filter.GetConfigPatches()[0]
	if patch.GetApplyTo() != networkingv1alpha3.EnvoyFilter_HTTP_ROUTE || patch.GetMatch().GetContext() != networkingv1alpha3.EnvoyFilter_GATEWAY ||
		patch.GetPatch().GetOperation() != networkingv1alpha3.EnvoyFilter_Patch_MERGE {
		t.Errorf("EnvoyFilter patch %v: want a MERGE into an HTTP_ROUTE of a GATEWAY", patch)
	}
	routeName := patch.GetMatch().GetRouteConfiguration().GetVhost().GetRoute().GetName()
	var route *networkingv1.HTTPRoute
	for _, r := range c.vs.GetHttp() {
		if r.GetName() == routeName {
			route = r
		}
	}
	if routeName == "" || route == nil {
		t.Fatalf("the EnvoyFilter patches the route %q, which the VirtualService does not name", routeName)
	}
	prefix := route.GetMatch()[0].GetUri().GetPrefix()
	ops := c.authz.GetRules()[0].GetTo()[0].GetOperation()
	if len(route.GetMatch()) != 1 || prefix == "" || !slices.Equal(ops.GetPaths(), []string{prefix + "*"}) ||
		len(c.vs.GetHosts()) != 1 || !slices.Contains(ops.GetHosts(), c.vs.GetHosts()[0]) {
		t.Errorf("the AuthorizationPolicy selects %v %v, the route %q matches %v %v: want the same requests",
			ops.GetHosts(), ops.GetPaths(), routeName, c.vs.GetHosts(), route.GetMatch())
	}

	// The patch's value, as Envoy reads the route it merges into.
	j, err := protojson.Marshal(patch.GetPatch().GetValue())
	if err != nil {
		t.Fatal(err)
	}
	var envoyRoute routev3.Route
	if err := protojson.Unmarshal(j, &envoyRoute); err != nil {
		t.Fatalf("the EnvoyFilter's value as an Envoy route: %v", err)
	}
	cfg, ok := envoyRoute.GetTypedPerFilterConfig()[istioFilterName]
	if !ok {
		t.Fatalf("the EnvoyFilter's typed_per_filter_config %v has no %s, Istio's ext_authz filter", envoyRoute.GetTypedPerFilterConfig(), istioFilterName)
	}
	var per extauthzv3.ExtAuthzPerRoute
	if err := cfg.UnmarshalTo(&per); err != nil {
		t.Fatalf("typed_per_filter_config %s: %v", istioFilterName, err)
	}
	if err := per.ValidateAll(); err != nil {
		t.Fatalf("validate: %v", err)
	}

	// limiterd decides a check carrying them by the policy they name; one without them (any
	// other route the AuthorizationPolicy selected) is denied, never admitted.
	ext := per.GetCheckSettings().GetContextExtensions()
	hops := int32(1)
	api := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop"},
		Spec: v1alpha1.RateLimitPolicySpec{
			Tiers:       []v1alpha1.Tier{testsupport.TokenBucketTier("standard", 1, 1, time.Minute)},
			DefaultTier: "standard",
			Gateway:     &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: &hops}}},
		},
	}
	svc := extauthz.New(testsupport.NewEngine(t, testsupport.NewClock().Now, api), nil)
	for _, tc := range []struct {
		ext  map[string]string
		want codes.Code
	}{
		{ext, codes.OK},                // the first request of the client: admitted
		{ext, codes.ResourceExhausted}, // its second within the minute: the policy's limit of 1
		{nil, codes.InvalidArgument},   // no extensions
	} {
		req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: "GET", Host: c.vs.GetHosts()[0], Path: prefix + "items",
				Headers: map[string]string{"x-forwarded-for": "198.51.100.7"},
			}},
			ContextExtensions: tc.ext,
		}}
		resp, err := svc.Check(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if got := codes.Code(resp.GetStatus().GetCode()); got != tc.want {
			t.Errorf("check with context extensions %v: %v %v, want %v", tc.ext, got, resp.GetDeniedResponse().GetBody(), tc.want)
		}
	}
}
