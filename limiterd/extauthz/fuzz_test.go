package extauthz_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/extauthz"
)

// FuzzCheck sends the service whatever a client of Envoy, or Envoy's configuration, can put
// in a check (any bytes: the service may be called through another codec than grpc-go's) and
// holds it to its contract: never a failed call, OK exactly with an OkHttpResponse, and any
// other code with a DeniedHttpResponse of one of the statuses the package documents.
func FuzzCheck(f *testing.F) {
	f.Add("default", "api", "x-api-key", "k1", "198.51.100.7, 10.0.0.1", "Shop.Example", "GET", "/a/b?c", "10.0.0.1", false)
	f.Add("default", "addr", "x-forwarded-for", "garbage", "garbage", "", "", "", "fe80::1%eth0", true)
	f.Add("", "api", "", "", "", "", "", "", "", false)
	f.Add("default", "plain", "", "", "", "", "", "", "not an address", false)
	hops := int32(1)
	api := gatewayPolicy("api", &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
		{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"},
		{Type: v1alpha1.KeySourceHost},
		{Type: v1alpha1.KeySourcePath, PathSegments: 1},
	}, MissingKey: v1alpha1.MissingKeyShared})
	addr := gatewayPolicy("addr", &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
		{Type: v1alpha1.KeySourceClientAddress, TrustedHops: &hops}, {Type: v1alpha1.KeySourceMethod},
	}})
	s := extauthz.New(testsupport.NewEngine(f, testsupport.NewClock().Now, api, addr, gatewayPolicy("plain", nil)), nil)
	statuses := map[int32]bool{400: true, 404: true, 409: true, 429: true, 431: true, 503: true}
	f.Fuzz(func(t *testing.T, ns, name, hname, hvalue, xff, host, method, path, src string, raw bool) {
		http := &authv3.AttributeContext_HttpRequest{
			Headers: map[string]string{hname: hvalue, "x-forwarded-for": xff},
			Host:    host, Method: method, Path: path,
		}
		if raw {
			http.Headers = nil
			http.HeaderMap = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: hname, RawValue: []byte(hvalue)}}}
		}
		req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: src},
			}}},
			Request:           &authv3.AttributeContext_Request{Http: http},
			ContextExtensions: map[string]string{extauthz.ExtensionNamespace: ns, extauthz.ExtensionPolicy: name},
		}}
		resp, err := s.Check(t.Context(), req)
		if err != nil {
			t.Fatalf("Check: %v, want an answer", err)
		}
		switch h := resp.GetHttpResponse().(type) {
		case *authv3.CheckResponse_OkResponse:
			if resp.GetStatus().GetCode() != int32(codes.OK) {
				t.Fatalf("OkHttpResponse with %v", resp.GetStatus())
			}
		case *authv3.CheckResponse_DeniedResponse:
			if c := resp.GetStatus().GetCode(); c == int32(codes.OK) || !statuses[int32(h.DeniedResponse.GetStatus().GetCode())] {
				t.Fatalf("denial %v with HTTP status %v", resp.GetStatus(), h.DeniedResponse.GetStatus())
			}
		default:
			t.Fatalf("answer %v", resp)
		}
	})
}
