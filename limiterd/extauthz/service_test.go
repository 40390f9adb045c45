package extauthz_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/envoyrls"
	"github.com/limiterd/limiterd/limiterd/extauthz"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/server"
)

// gatewayPolicy returns a policy default/<name> of one token bucket (capacity 2, 1 a minute),
// keyed by g.
func gatewayPolicy(name string, g *v1alpha1.Gateway) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.RateLimitPolicySpec{
			Tiers:       []v1alpha1.Tier{testsupport.TokenBucketTier("standard", 2, 1, time.Minute)},
			DefaultTier: "standard",
			Gateway:     g,
		},
	}
}

func byAddress(hops int32) *v1alpha1.Gateway {
	return &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: &hops}}}
}

func bySource(t v1alpha1.KeySourceType) *v1alpha1.Gateway {
	return &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: t}}}
}

func byHeader(name string, missing v1alpha1.MissingKey) *v1alpha1.Gateway {
	return &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: name}}, MissingKey: missing}
}

// dial serves the service of e on a TCP loopback port with a real grpc-go server, built with
// envoyrls.ServerOptions as limiterd builds it, and returns a client of it.
func dial(t testing.TB, e *engine.Engine) authv3.AuthorizationClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(envoyrls.ServerOptions()...)
	authv3.RegisterAuthorizationServer(srv, extauthz.New(e, nil))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return authv3.NewAuthorizationClient(conn)
}

// check is a CheckRequest of the policy default/<name> from the source address src, with
// the request's headers (lower-case names).
func check(name, src string, headers map[string]string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: src, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "GET", Host: "shop.example", Path: "/api/v1/users/7?expand=1", Headers: headers,
		}},
		ContextExtensions: map[string]string{extauthz.ExtensionNamespace: "default", extauthz.ExtensionPolicy: name},
	}}
}

// result is a CheckResponse read as Envoy reads it.
type result struct {
	code   codes.Code
	status int // HTTP status of a denial; 0 for OK
	header http.Header
	body   string
}

func do(t testing.TB, c authv3.AuthorizationClient, req *authv3.CheckRequest) result {
	t.Helper()
	resp, err := c.Check(t.Context(), req)
	if err != nil {
		t.Fatalf("Check: %v, want an answer (a failed call lets failure_mode_allow decide)", err)
	}
	r := result{code: codes.Code(resp.GetStatus().GetCode()), header: http.Header{}}
	var fields []*corev3.HeaderValueOption
	switch h := resp.GetHttpResponse().(type) {
	case *authv3.CheckResponse_OkResponse:
		if r.code != codes.OK {
			t.Fatalf("status %v with an OkHttpResponse", r.code)
		}
		fields = h.OkResponse.GetResponseHeadersToAdd()
		if len(h.OkResponse.GetHeaders()) != 0 || len(h.OkResponse.GetHeadersToRemove()) != 0 {
			t.Errorf("an admission changes the upstream request: %v", h.OkResponse)
		}
	case *authv3.CheckResponse_DeniedResponse:
		if r.code == codes.OK {
			t.Fatalf("status OK with a DeniedHttpResponse")
		}
		r.status = int(h.DeniedResponse.GetStatus().GetCode())
		fields = h.DeniedResponse.GetHeaders()
		r.body = h.DeniedResponse.GetBody()
	default:
		t.Fatalf("answer %v: neither ok_response nor denied_response", resp)
	}
	for _, f := range fields {
		r.header.Add(f.GetHeader().GetKey(), f.GetHeader().GetValue())
	}
	return r
}

func TestCheckAdmitsThenRejects(t *testing.T) {
	c := dial(t, testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("api", byAddress(1))))
	for i, want := range []struct {
		code       codes.Code
		status     int
		rateLimit  string
		retryAfter string
	}{
		{codes.OK, 0, `"standard";r=1;t=60`, ""},
		{codes.OK, 0, `"standard";r=0;t=120`, ""},
		{codes.ResourceExhausted, 429, `"standard";r=0;t=120`, "60"},
	} {
		r := do(t, c, check("api", "10.0.0.1", map[string]string{"x-forwarded-for": "198.51.100.7"}))
		if r.code != want.code || r.status != want.status {
			t.Fatalf("check %d: %v %d %s, want %v %d", i, r.code, r.status, r.body, want.code, want.status)
		}
		if got := r.header.Get("RateLimit"); got != want.rateLimit {
			t.Errorf("check %d: RateLimit %q, want %q", i, got, want.rateLimit)
		}
		if got := r.header.Get("RateLimit-Policy"); got != `"standard";q=2;w=120` {
			t.Errorf("check %d: RateLimit-Policy %q", i, got)
		}
		if got := r.header.Get("Retry-After"); got != want.retryAfter {
			t.Errorf("check %d: Retry-After %q, want %q", i, got, want.retryAfter)
		}
		if want.status == 429 {
			if !strings.HasPrefix(r.body, `{"allowed":false,"limit":2,"remaining":0,`) || !strings.Contains(r.body, `"retryAfterSeconds":60`) ||
				r.header.Get("Content-Type") != "application/json" {
				t.Errorf("rejection body %q, Content-Type %q: want the decision's JSON", r.body, r.header.Get("Content-Type"))
			}
		}
	}
	// Another client has its own budget.
	if r := do(t, c, check("api", "10.0.0.1", map[string]string{"x-forwarded-for": "198.51.100.8"})); r.code != codes.OK {
		t.Errorf("another client: %v %s", r.code, r.body)
	}
}

// TestCheckSharesForwardAuthKeys: a check and a forward-auth request about the same client of
// the same policy are decided for the same key, so they spend one budget.
func TestCheckSharesForwardAuthKeys(t *testing.T) {
	for _, tc := range []struct {
		name   string
		g      *v1alpha1.Gateway
		header http.Header       // of the forward-auth request
		check  map[string]string // headers of the check, whose host is shop.example and path /api/v1/users/7?expand=1
	}{
		{"ClientAddress", byAddress(1), http.Header{"X-Forwarded-For": {"203.0.113.1, 198.51.100.7"}},
			map[string]string{"x-forwarded-for": "203.0.113.2, 198.51.100.7"}},
		{"Header", byHeader("X-Api-Key", ""), http.Header{"X-Api-Key": {"k1"}}, map[string]string{"x-api-key": "k1"}},
		{"Host", bySource(v1alpha1.KeySourceHost), http.Header{"X-Forwarded-Host": {"Shop.Example"}}, nil},
		{"Path", &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourcePath, PathSegments: 2}}},
			http.Header{"X-Forwarded-Uri": {"/api/v1/orders"}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("api", tc.g))
			h := server.NewDecisions(e, nil)
			req := httptest.NewRequest(http.MethodGet, "/v1/forward-auth/default/api", nil)
			req.RemoteAddr = "10.0.0.1:40000"
			for k, v := range tc.header {
				req.Header[k] = v
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != 200 {
				t.Fatalf("forward-auth: %d %s", rec.Code, rec.Body)
			}
			c := dial(t, e)
			if r := do(t, c, check("api", "10.0.0.1", tc.check)); r.code != codes.OK || r.header.Get("RateLimit") != `"standard";r=0;t=120` {
				t.Fatalf("check after forward-auth: %v RateLimit %q, want the last unit of the same budget", r.code, r.header.Get("RateLimit"))
			}
			if r := do(t, c, check("api", "10.0.0.1", tc.check)); r.status != 429 {
				t.Fatalf("second check: %v %d, want 429", r.code, r.status)
			}
		})
	}
}

// TestCheckForgedForwardedFor: a client that sends its own X-Forwarded-For naming another
// client gets neither that client's budget nor a fresh one.
func TestCheckForgedForwardedFor(t *testing.T) {
	c := dial(t, testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("one", byAddress(1)), gatewayPolicy("zero", byAddress(0))))
	// The attacker, 203.0.113.5, claims to be the victim 198.51.100.7, then others; Envoy
	// appends the peer it sees.
	for i, forged := range []string{"198.51.100.7", "192.0.2.1", "192.0.2.2, 192.0.2.3", strings.Repeat("192.0.2.9,", 300) + "198.51.100.7"} {
		r := do(t, c, check("one", "10.0.0.1", map[string]string{"x-forwarded-for": forged + ", 203.0.113.5"}))
		if want := []int{0, 0, 429, 429}[i]; r.status != want {
			t.Errorf("forged %.40q: %v %d, want %d: the attacker's own budget", forged, r.code, r.status, want)
		}
	}
	if r := do(t, c, check("one", "10.0.0.1", map[string]string{"x-forwarded-for": "198.51.100.7"})); r.code != codes.OK || r.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("victim: %v RateLimit %q, want its whole budget", r.code, r.header.Get("RateLimit"))
	}
	// trustedHops 0: the source address Envoy reports; X-Forwarded-For is not read at all.
	for i := range 3 {
		r := do(t, c, check("zero", "203.0.113.5", map[string]string{"x-forwarded-for": "198.51.100." + strconv.Itoa(i)}))
		if want := []int{0, 0, 429}[i]; r.status != want {
			t.Errorf("trustedHops 0, check %d: %v %d, want %d", i, r.code, r.status, want)
		}
	}
	// An entry beyond the trusted ones that is no address yields no key: missingKey Reject.
	r := do(t, c, check("one", "10.0.0.1", map[string]string{"x-forwarded-for": "198.51.100.7, garbage"}))
	if r.code != codes.PermissionDenied || r.status != 429 || r.header.Get("Retry-After") != "" {
		t.Errorf("untrusted garbage entry: %v %d Retry-After %q, want PERMISSION_DENIED 429 without Retry-After", r.code, r.status, r.header.Get("Retry-After"))
	}
}

// TestCheckReadsTheRequestsOwnAttributes: Host, Method and Path come from what Envoy reports,
// never from X-Forwarded-* headers, which the client sends as it likes.
func TestCheckReadsTheRequestsOwnAttributes(t *testing.T) {
	e := testsupport.NewEngine(t, testsupport.NewClock().Now,
		gatewayPolicy("host", bySource(v1alpha1.KeySourceHost)), gatewayPolicy("method", bySource(v1alpha1.KeySourceMethod)),
		gatewayPolicy("path", &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourcePath, PathSegments: 2}}}))
	c := dial(t, e)
	for i := range 3 {
		for _, name := range []string{"host", "method", "path"} {
			req := check(name, "10.0.0.1", map[string]string{
				"x-forwarded-host": "fresh" + strconv.Itoa(i), "x-forwarded-method": "M" + strconv.Itoa(i),
				"x-forwarded-uri": "/fresh/" + strconv.Itoa(i), "x-original-uri": "/other/" + strconv.Itoa(i),
			})
			req.Attributes.Request.Http.Host = "SHOP.example"
			if r := do(t, c, req); r.status != []int{0, 0, 429}[i] {
				t.Errorf("%s, check %d: %v %d: forged X-Forwarded-* fields gave a fresh budget", name, i, r.code, r.status)
			}
		}
	}
	for id, key := range map[string]string{"default/host": "host:shop.example", "default/method": "method:GET", "default/path": "path:/api/v1"} {
		res, err := e.Peek(t.Context(), v1alpha1.PolicyID(id), key)
		if err != nil || res.Remaining != 0 {
			t.Errorf("%s %s: %d left, %v; want 0: the checks spent this key", id, key, res.Remaining, err)
		}
	}
}

// TestCheckRefusesWhatItCannotDecide: every check that is not decided is denied with its
// code, status and an error body, and charges nothing.
func TestCheckRefusesWhatItCannotDecide(t *testing.T) {
	e := testsupport.NewEngine(t, testsupport.NewClock().Now,
		gatewayPolicy("api", byHeader("X-Api-Key", "")), gatewayPolicy("plain", nil))
	c := dial(t, e)
	withExt := func(ext map[string]string) *authv3.CheckRequest {
		r := check("api", "10.0.0.1", map[string]string{"x-api-key": "k"})
		r.Attributes.ContextExtensions = ext
		return r
	}
	for _, tc := range []struct {
		name   string
		req    *authv3.CheckRequest
		code   codes.Code
		status int
		body   string
	}{
		{"no context extensions", withExt(nil), codes.InvalidArgument, 404, "context_extensions"},
		{"no namespace", withExt(map[string]string{"policy": "api"}), codes.InvalidArgument, 404, "context_extensions"},
		{"no policy", withExt(map[string]string{"namespace": "default"}), codes.InvalidArgument, 404, "context_extensions"},
		{"empty policy", withExt(map[string]string{"namespace": "default", "policy": ""}), codes.InvalidArgument, 404, "context_extensions"},
		{"unknown namespace", withExt(map[string]string{"namespace": "other", "policy": "api"}), codes.NotFound, 404, `unknown policy \"other/api\"`},
		{"unknown policy", withExt(map[string]string{"namespace": "default", "policy": "nope"}), codes.NotFound, 404, `unknown policy \"default/nope\"`},
		{"slash in the name", withExt(map[string]string{"namespace": "default", "policy": "api/x"}), codes.NotFound, 404, "unknown policy"},
		{"no spec.gateway", withExt(map[string]string{"namespace": "default", "policy": "plain"}), codes.FailedPrecondition, 409, "no spec.gateway"},
		{"key header too large", check("api", "10.0.0.1", map[string]string{"x-api-key": strings.Repeat("k", v1alpha1.MaxGatewayHeaderBytes+1)}),
			codes.InvalidArgument, 431, "x-api-key: header too large"},
		{"no request at all", &authv3.CheckRequest{}, codes.InvalidArgument, 404, "context_extensions"},
	} {
		r := do(t, c, tc.req)
		if r.code != tc.code || r.status != tc.status || !strings.Contains(r.body, tc.body) || !strings.HasPrefix(r.body, `{"error":`) {
			t.Errorf("%s: %v %d %q, want %v %d with %q", tc.name, r.code, r.status, r.body, tc.code, tc.status, tc.body)
		}
	}
	if res, err := e.Peek(t.Context(), "default/api", "header:x-api-key:k"); err != nil || res.Remaining != 2 {
		t.Errorf("header:x-api-key:k has %d left (%v), want 2: a refused check charged it", res.Remaining, err)
	}
	// Before any policy is loaded.
	c = dial(t, testsupport.NewEngine(t, testsupport.NewClock().Now))
	if r := do(t, c, check("api", "10.0.0.1", nil)); r.code != codes.Unavailable || r.status != 503 {
		t.Errorf("not ready: %v %d %s, want UNAVAILABLE 503", r.code, r.status, r.body)
	}
}

func TestCheckMissingKey(t *testing.T) {
	e := testsupport.NewEngine(t, testsupport.NewClock().Now,
		gatewayPolicy("reject", byHeader("X-Api-Key", v1alpha1.MissingKeyReject)),
		gatewayPolicy("allow", byHeader("X-Api-Key", v1alpha1.MissingKeyAllow)),
		gatewayPolicy("shared", byHeader("X-Api-Key", v1alpha1.MissingKeyShared)))
	c := dial(t, e)
	for i := range 3 {
		if r := do(t, c, check("reject", "10.0.0.1", nil)); r.code != codes.PermissionDenied || r.status != 429 || r.header.Get("Retry-After") != "" {
			t.Errorf("Reject, check %d: %v %d Retry-After %q, want PERMISSION_DENIED 429 without Retry-After", i, r.code, r.status, r.header.Get("Retry-After"))
		}
		if r := do(t, c, check("allow", "10.0.0.1", map[string]string{"x-api-key": ""})); r.code != codes.OK || len(r.header) != 0 {
			t.Errorf("Allow, check %d: %v %v, want OK with no fields", i, r.code, r.header)
		}
		// Shared: every keyless check spends the one key "anonymous".
		if r := do(t, c, check("shared", "10.0.0.1"+strconv.Itoa(i), nil)); r.status != []int{0, 0, 429}[i] {
			t.Errorf("Shared, check %d: %v %d", i, r.code, r.status)
		}
	}
	if res, _ := e.Peek(t.Context(), "default/allow", v1alpha1.SharedGatewayKey); res.Remaining != 2 {
		t.Errorf("Allow charged %q: %d left", v1alpha1.SharedGatewayKey, res.Remaining)
	}
}

// TestCheckBudgetsArePerPolicy: one client's checks of one policy leave its budget under
// another policy whole, though both key it alike.
func TestCheckBudgetsArePerPolicy(t *testing.T) {
	c := dial(t, testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("a", byAddress(1)), gatewayPolicy("b", byAddress(1))))
	hdr := map[string]string{"x-forwarded-for": "198.51.100.7"}
	for i := range 3 {
		if r := do(t, c, check("a", "10.0.0.1", hdr)); r.status != []int{0, 0, 429}[i] {
			t.Fatalf("policy a, check %d: %v %d", i, r.code, r.status)
		}
	}
	if r := do(t, c, check("b", "10.0.0.1", hdr)); r.code != codes.OK || r.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("policy b after a is spent: %v RateLimit %q, want a whole budget", r.code, r.header.Get("RateLimit"))
	}
	// The same name in another namespace is another policy.
	other := gatewayPolicy("a", byAddress(1))
	other.Namespace = "other"
	c = dial(t, testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("a", byAddress(1)), other))
	for range 2 {
		do(t, c, check("a", "10.0.0.1", hdr))
	}
	req := check("a", "10.0.0.1", hdr)
	req.Attributes.ContextExtensions["namespace"] = "other"
	if r := do(t, c, req); r.code != codes.OK || r.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("other/a after default/a is spent: %v RateLimit %q", r.code, r.header.Get("RateLimit"))
	}
}

// TestCheckBoundedWork: many (up to envoyrls.MaxCheckHeaders) or large headers that no key
// source reads cost the check nothing but their bytes, a repeated header (which Envoy joins) is one value, and a message
// over envoyrls.MaxRequestBytes is refused by the server before the service sees it.
func TestCheckBoundedWork(t *testing.T) {
	e := testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("api", byHeader("X-Api-Key", "")))
	c := dial(t, e)
	many := map[string]string{"x-api-key": "k1"}
	for i := range envoyrls.MaxCheckHeaders - 2 {
		many["x-h"+strconv.Itoa(i)] = "v"
	}
	many["x-big"] = strings.Repeat("b", 30<<10)
	if r := do(t, c, check("api", "10.0.0.1", many)); r.code != codes.OK || r.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Fatalf("%d headers and a 30 KiB one: %v %d %s", len(many), r.code, r.status, r.body)
	}
	// Envoy joins a repeated header with commas: one value, which is another client.
	if r := do(t, c, check("api", "10.0.0.1", map[string]string{"x-api-key": "k1,k1"})); r.code != codes.OK || r.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Fatalf("joined header: %v %s", r.code, r.header.Get("RateLimit"))
	}
	huge := check("api", "10.0.0.1", map[string]string{"x-api-key": "k2", "x-pad": strings.Repeat("p", envoyrls.MaxRequestBytes)})
	if _, err := c.Check(t.Context(), huge); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a check over %d bytes: %v, want ResourceExhausted", envoyrls.MaxRequestBytes, err)
	}
	if res, _ := e.Peek(t.Context(), "default/api", "header:x-api-key:k2"); res.Remaining != 2 {
		t.Errorf("the refused check charged its key: %d left", res.Remaining)
	}
}

// TestCheckReadsRawHeaders: under encode_raw_headers, Envoy sends header_map, one entry per
// field with its bytes; a name given several times is joined as Envoy joins it in the headers
// map, so both encodings give the same key, and bytes that are not UTF-8 are a client's own.
func TestCheckReadsRawHeaders(t *testing.T) {
	e := testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("api", byHeader("X-Api-Key", "")), gatewayPolicy("addr", byAddress(1)))
	c := dial(t, e)
	raw := func(name string, fields ...string) *authv3.CheckRequest {
		r := check(name, "10.0.0.1", nil)
		hm := &corev3.HeaderMap{}
		for i := 0; i < len(fields); i += 2 {
			hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: fields[i], RawValue: []byte(fields[i+1])})
		}
		r.Attributes.Request.Http.HeaderMap = hm
		return r
	}
	if r := do(t, c, raw("api", "x-api-key", "a", "accept", "*/*", "x-api-key", "b")); r.code != codes.OK || r.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Fatalf("raw a, b: %v %q", r.code, r.header.Get("RateLimit"))
	}
	if r := do(t, c, check("api", "10.0.0.1", map[string]string{"x-api-key": "a,b"})); r.code != codes.OK || r.header.Get("RateLimit") != `"standard";r=0;t=120` {
		t.Fatalf("the same client from the headers map: %v %q, want its last unit", r.code, r.header.Get("RateLimit"))
	}
	if r := do(t, c, raw("api", "x-api-key", "\xff\xfe")); r.code != codes.OK {
		t.Fatalf("a raw value that is not UTF-8: %v %d %s, want a client like any other", r.code, r.status, r.body)
	}
	if res, err := e.Peek(t.Context(), "default/api", "header:x-api-key:\xff\xfe"); err != nil || res.Remaining != 1 {
		t.Errorf("header:x-api-key:<ff fe>: %d left (%v), want 1", res.Remaining, err)
	}
	// The forged entries of a client's own X-Forwarded-For fields are still left of Envoy's.
	for i := range 3 {
		r := do(t, c, raw("addr", "x-forwarded-for", "198.51.100."+strconv.Itoa(i), "x-forwarded-for", "203.0.113.5"))
		if r.status != []int{0, 0, 429}[i] {
			t.Errorf("raw X-Forwarded-For, check %d: %v %d", i, r.code, r.status)
		}
	}
	many := make([]string, 0, 2*(envoyrls.MaxCheckHeaders+1))
	for i := range envoyrls.MaxCheckHeaders + 1 {
		many = append(many, "x-"+strconv.Itoa(i), "v")
	}
	resp, err := extauthz.New(e, nil).Check(t.Context(), raw("api", many...))
	if err != nil || resp.GetStatus().GetCode() != int32(codes.InvalidArgument) || resp.GetDeniedResponse().GetStatus().GetCode() != 431 {
		t.Errorf("%d raw fields through another codec: %v %v, want INVALID_ARGUMENT 431", envoyrls.MaxCheckHeaders+1, resp, err)
	}
}

// failingStore fails every operation, like an unreachable Redis.
type failingStore struct{}

var errDown = errors.New("store down")

func (failingStore) Decide(context.Context, string, *limiter.Stack, time.Time, int64, []limiter.Decision) (limiter.Decision, error) {
	return limiter.Decision{}, errDown
}

func (failingStore) Refund(context.Context, limiter.Request, time.Time, limiter.Once) (limiter.Decision, error) {
	return limiter.Decision{}, errDown
}

func (failingStore) DecideBatch(_ context.Context, reqs []limiter.Request, _ time.Time, out []limiter.Answer) {
	for i := range reqs {
		out[i] = limiter.Answer{Err: errDown}
	}
}

func (failingStore) Reset(context.Context, string, time.Time) error { return errDown }

// TestCheckStoreFailureFollowsTheFailureMode: while the store fails, Closed denies (429 with
// Retry-After, as forward-auth answers) and Open admits: never a failed call, which Envoy's
// failure_mode_allow would decide instead of the policy.
func TestCheckStoreFailureFollowsTheFailureMode(t *testing.T) {
	for mode, want := range map[v1alpha1.FailureMode]int{v1alpha1.FailureModeClosed: 429, v1alpha1.FailureModeOpen: 0} {
		p := gatewayPolicy("api", byAddress(1))
		p.Spec.FailureMode = mode
		compiled, err := policy.Compile(p)
		if err != nil {
			t.Fatal(err)
		}
		set, err := policy.NewSet(compiled)
		if err != nil {
			t.Fatal(err)
		}
		e := engine.New(engine.Options{NewStore: func(v1alpha1.PolicyID) limiter.Store { return failingStore{} }})
		e.Swap(set)
		c := dial(t, e)
		r := do(t, c, check("api", "10.0.0.1", map[string]string{"x-forwarded-for": "198.51.100.7"}))
		if r.status != want || (want == 429 && (r.code != codes.ResourceExhausted || r.header.Get("Retry-After") == "")) {
			t.Errorf("%s: %v %d Retry-After %q, want %d", mode, r.code, r.status, r.header.Get("Retry-After"), want)
		}
	}
}
