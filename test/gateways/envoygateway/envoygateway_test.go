package envoygateway_test

import (
	"bufio"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwapiv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/envoytest"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/extauthz"
)

// The chart's release the configuration points at: release "limiterd" in namespace limiterd,
// whose fullname, the decisions Service's name, is "limiterd".
const (
	chartService   = "limiterd"
	chartNamespace = "limiterd"
)

// config is docs/gateways/envoy-gateway.yaml, decoded.
type config struct {
	route  *gwapiv1.HTTPRoute
	policy *egv1a1.SecurityPolicy
	grant  *gwapiv1beta1.ReferenceGrant
}

// readConfig decodes each object of docs/gateways/envoy-gateway.yaml into the Go type of its
// apiVersion and kind, refusing a field the type does not have.
func readConfig(t *testing.T) config {
	t.Helper()
	f, err := os.Open("../../../docs/gateways/envoy-gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var c config
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "gateway.networking.k8s.io/v1 HTTPRoute":
			c.route = &gwapiv1.HTTPRoute{}
			obj = c.route
		case "gateway.envoyproxy.io/v1alpha1 SecurityPolicy":
			c.policy = &egv1a1.SecurityPolicy{}
			obj = c.policy
		case "gateway.networking.k8s.io/v1beta1 ReferenceGrant":
			c.grant = &gwapiv1beta1.ReferenceGrant{}
			obj = c.grant
		default:
			t.Fatalf("unexpected %s %s", meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: %v", meta.Kind, err)
		}
	}
	if c.route == nil || c.policy == nil || c.grant == nil {
		t.Fatal("want an HTTPRoute, a SecurityPolicy and a ReferenceGrant")
	}
	return c
}

// TestShippedEnvoyGatewayConfig decodes docs/gateways/envoy-gateway.yaml strictly with Envoy
// Gateway's and Gateway API's types, and checks that it asks limiterd as package extauthz
// documents: a gRPC ext_authz on the chart's Service and gRPC port, fail closed, timing out,
// without the request body, attached to the HTTPRoute of the file, with a ReferenceGrant that
// admits the cross-namespace reference; and that its context extensions are what limiterd's
// Check decides the policy by.
func TestShippedEnvoyGatewayConfig(t *testing.T) {
	c := readConfig(t)
	p := c.policy

	// Attached to the route: the policy's own namespace, the route's group, kind and name.
	if len(p.Spec.TargetRefs) != 1 || p.Spec.TargetRef != nil || len(p.Spec.TargetSelectors) != 0 {
		t.Fatalf("targets %+v, want the one targetRefs entry", p.Spec.PolicyTargetReferences)
	}
	target := p.Spec.TargetRefs[0]
	if target.Group != gwapiv1.GroupName || target.Kind != "HTTPRoute" || string(target.Name) != c.route.Name ||
		p.Namespace != c.route.Namespace {
		t.Errorf("SecurityPolicy %s/%s targets %s %s, want the HTTPRoute %s/%s", p.Namespace, p.Name,
			target.Kind, target.Name, c.route.Namespace, c.route.Name)
	}

	// The ext_authz: gRPC, limiterd's Service, fail closed.
	ea := p.Spec.ExtAuth
	if ea == nil || ea.GRPC == nil || ea.HTTP != nil {
		t.Fatalf("extAuth %+v, want grpc", ea)
	}
	if ea.GRPC.BackendRef != nil || len(ea.GRPC.BackendRefs) != 1 {
		t.Fatalf("extAuth.grpc %+v, want one backendRefs entry", ea.GRPC)
	}
	ref := ea.GRPC.BackendRefs[0].BackendObjectReference
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Service") ||
		ref.Name != chartService || ref.Namespace == nil || *ref.Namespace != chartNamespace {
		t.Errorf("backendRef %+v, want the Service %s/%s", ref, chartNamespace, chartService)
	}
	if port := gwapiv1.PortNumber(envoytest.ChartGRPCPort(t, "../../../charts/limiterd/values.yaml")); ref.Port == nil || *ref.Port != port {
		t.Errorf("backendRef port %v, want the chart's grpcPort %d", ptr.Deref(ref.Port, 0), port)
	}
	if ea.FailOpen == nil || *ea.FailOpen {
		t.Errorf("failOpen %v, want false stated: true admits every request unlimited while limiterd cannot answer", ptr.Deref(ea.FailOpen, false))
	}
	if ea.Timeout == nil {
		t.Error("no timeout: Envoy Gateway's default is 10 s")
	} else if d, err := time.ParseDuration(string(*ea.Timeout)); err != nil || d <= 0 || d > time.Second {
		t.Errorf("timeout %q (%v), want at most 1s", *ea.Timeout, err)
	}
	if ea.BodyToExtAuth != nil || len(ea.HeadersToExtAuth) != 0 || ea.StatusOnError != nil {
		t.Errorf("extAuth %+v: want no body, every header (the key sources read any), the default status on error", ea)
	}

	// The ReferenceGrant admits this reference: from the policy's kind and namespace, to the
	// Service, in the Service's namespace.
	g := c.grant
	if g.Namespace != chartNamespace || len(g.Spec.From) != 1 || len(g.Spec.To) != 1 {
		t.Fatalf("ReferenceGrant %s/%s %+v, want one from and one to in %s", g.Namespace, g.Name, g.Spec, chartNamespace)
	}
	from, to := g.Spec.From[0], g.Spec.To[0]
	if from.Group != egv1a1.GroupName || from.Kind != egv1a1.KindSecurityPolicy || string(from.Namespace) != p.Namespace ||
		to.Group != "" || to.Kind != "Service" || to.Name == nil || string(*to.Name) != chartService {
		t.Errorf("ReferenceGrant from %+v to %+v, want SecurityPolicy of %s to the Service %s", from, to, p.Namespace, chartService)
	}

	// The context extensions: limiterd decides a check carrying them by the policy they name.
	ext := map[string]string{}
	for _, e := range ea.ContextExtensions {
		if e.Type != egv1a1.ContextExtensionValueTypeValue || e.Value == nil || e.ValueRef != nil {
			t.Fatalf("context extension %+v: want type Value with a value", e)
		}
		ext[e.Name] = *e.Value
	}
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
	for _, want := range []codes.Code{codes.OK, codes.ResourceExhausted} { // the limit is 1 a minute
		resp, err := svc.Check(t.Context(), &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: "GET", Host: "shop.example.com", Path: "/api/items",
				Headers: map[string]string{"x-forwarded-for": "198.51.100.7"},
			}},
			ContextExtensions: ext,
		}})
		if err != nil {
			t.Fatal(err)
		}
		if got := codes.Code(resp.GetStatus().GetCode()); got != want {
			t.Errorf("check with context extensions %v: %v %s, want %v", ext, got, resp.GetDeniedResponse().GetBody(), want)
		}
	}
}
