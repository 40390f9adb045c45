package server

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // the router's typed_config
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/envoytest"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// envoyHTTP is what Envoy's ext_authz filter does with an http_service (Envoy's
// ext_authz_http_impl.cc): the check request carries the client's method, Host, path_prefix +
// path and query, Content-Length 0, and only the headers allowed_headers lists besides
// authorization; 200 admits, a 5xx is a failure (403 under failure_mode_allow false), any other
// status is a denial sent to the client with its body and the headers allowed_client_headers
// lists (and content-length, which Envoy always passes).
type envoyHTTP struct {
	hcm    *hcmv3.HttpConnectionManager
	filter *extauthzv3.ExtAuthz
}

// clientRequest is a request as it reaches Envoy: header names in lower case, as Envoy keeps them.
type clientRequest struct {
	method, target, host string
	header               [][2]string
	peer                 string // the address Envoy sees
}

// clientAnswer is what reaches the client when the check denies, or what the upstream's answer
// gains when it admits.
type clientAnswer struct {
	admitted bool
	status   int
	header   http.Header
	body     string
}

func listMatches(l *matcherv3.ListStringMatcher, name string) bool {
	for _, m := range l.GetPatterns() {
		n, ic := name, m.GetIgnoreCase()
		match := func(p string, f func(string, string) bool) bool {
			if ic {
				return f(strings.ToLower(n), strings.ToLower(p))
			}
			return f(n, p)
		}
		switch m.GetMatchPattern().(type) {
		case *matcherv3.StringMatcher_Exact:
			if match(m.GetExact(), func(a, b string) bool { return a == b }) {
				return true
			}
		case *matcherv3.StringMatcher_Prefix:
			if match(m.GetPrefix(), strings.HasPrefix) {
				return true
			}
		case *matcherv3.StringMatcher_Suffix:
			if match(m.GetSuffix(), strings.HasSuffix) {
				return true
			}
		case *matcherv3.StringMatcher_Contains:
			if match(m.GetContains(), strings.Contains) {
				return true
			}
		default:
			panic("envoyHTTP: matcher not emulated: " + m.String())
		}
	}
	return false
}

func (e *envoyHTTP) do(t *testing.T, h http.Handler, c clientRequest) clientAnswer {
	t.Helper()
	hdr := c.header
	if e.hcm.GetUseRemoteAddress().GetValue() { // the connection manager appends the peer
		xff, found := c.peer, false
		for i, kv := range hdr {
			if kv[0] == "x-forwarded-for" {
				hdr = append([][2]string(nil), hdr...)
				hdr[i][1] += ", " + c.peer
				found = true
			}
		}
		if !found {
			hdr = append(hdr, [2]string{"x-forwarded-for", xff})
		}
	}
	svc := e.filter.GetHttpService()
	var raw strings.Builder
	raw.WriteString(c.method + " " + svc.GetPathPrefix() + c.target + " HTTP/1.1\r\nhost: " + c.host + "\r\ncontent-length: 0\r\n")
	for _, kv := range hdr {
		if kv[0] == "authorization" || listMatches(e.filter.GetAllowedHeaders(), kv[0]) {
			raw.WriteString(kv[0] + ": " + kv[1] + "\r\n")
		}
	}
	for _, hv := range svc.GetAuthorizationRequest().GetHeadersToAdd() {
		raw.WriteString(hv.GetKey() + ": " + hv.GetValue() + "\r\n")
	}
	raw.WriteString("\r\n")
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw.String())))
	if err != nil {
		t.Fatalf("check request %q: %v", raw.String(), err)
	}
	req.RemoteAddr = "10.0.0.2:50000" // Envoy
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rec.Result()
	body, _ := io.ReadAll(res.Body)
	resp := svc.GetAuthorizationResponse()
	out := clientAnswer{header: http.Header{}}
	switch {
	case res.StatusCode == http.StatusOK:
		out.admitted, out.status = true, http.StatusOK
		for k, v := range res.Header {
			if listMatches(resp.GetAllowedClientHeadersOnSuccess(), strings.ToLower(k)) {
				out.header[k] = v
			}
		}
		return out
	case res.StatusCode >= 500:
		if e.filter.GetFailureModeAllow() {
			out.admitted, out.status = true, http.StatusOK
			return out
		}
		out.status = http.StatusForbidden
		return out
	}
	out.status, out.body = res.StatusCode, string(body)
	for k, v := range res.Header {
		lk := strings.ToLower(k)
		if lk == "content-length" || lk == "www-authenticate" || lk == "location" || listMatches(resp.GetAllowedClientHeaders(), lk) {
			out.header[k] = v
		}
	}
	return out
}

func loadEnvoyHTTP(t *testing.T) *envoyHTTP {
	t.Helper()
	hcm := envoytest.LoadHCM(t, "../../docs/gateways/envoy-http.yaml")
	var filter extauthzv3.ExtAuthz
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&filter); err != nil {
		t.Fatalf("the first filter: %v", err)
	}
	return &envoyHTTP{hcm: hcm, filter: &filter}
}

// TestShippedEnvoyHTTPConfig decodes docs/gateways/envoy-http.yaml as Envoy would, validates it
// with go-control-plane's generated rules, checks the settings docs/gateways.md promises, then
// replays against limiterd's handler the requests Envoy sends under it: the budget, what the
// client gets on a rejection, and that nothing the client puts in its path, query or headers
// picks another policy or key.
func TestShippedEnvoyHTTPConfig(t *testing.T) {
	e := loadEnvoyHTTP(t)
	svc := e.filter.GetHttpService()
	if !e.hcm.GetUseRemoteAddress().GetValue() {
		t.Errorf("use_remote_address is not set: x-forwarded-for's last entry would not be Envoy's peer")
	}
	if svc.GetServerUri().GetCluster() == "" || svc.GetServerUri().GetTimeout() == nil || e.filter.GetFailureModeAllow() ||
		e.filter.GetWithRequestBody() != nil {
		t.Errorf("ext_authz filter %v: want an HTTP service with a timeout, failure_mode_allow false, no body", e.filter)
	}
	if p := svc.GetPathPrefix(); p != forwardAuthPrefix+"shop/api" || svc.GetPathOverride() != "" {
		t.Errorf("path_prefix %q (path_override %q): want %sshop/api, no trailing '/'", p, svc.GetPathOverride(), forwardAuthPrefix)
	}
	for _, name := range []string{"retry-after", "ratelimit", "ratelimit-policy", "content-type"} {
		if !listMatches(svc.GetAuthorizationResponse().GetAllowedClientHeaders(), name) {
			t.Errorf("allowed_client_headers lacks %s", name)
		}
	}
	for _, name := range []string{"x-forwarded-for", "x-api-key"} {
		if !listMatches(e.filter.GetAllowedHeaders(), name) {
			t.Errorf("allowed_headers lacks %s", name)
		}
	}

	api := gatewayPolicy("api", keyedBy(
		v1alpha1.KeySource{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"},
		v1alpha1.KeySource{Type: v1alpha1.KeySourceClientAddress}))
	api.Namespace = "shop"
	other := gatewayPolicy("other", byAddress(1))
	other.Namespace = "shop"
	h := NewDecisions(newEngine(t, testsupport.NewClock(), api, other), nil)

	// One client (its peer 198.51.100.7 as Envoy sees it), varying all it controls: its own
	// x-forwarded-for, X-Forwarded-* fields Envoy does not pass, a query naming deny, dot
	// segments and an escaped '/' in its path. Its budget is 2.
	spoof := [][2]string{{"x-forwarded-for", "203.0.113.9"}, {"x-forwarded-uri", "/free"}, {"x-forwarded-host", "other"}}
	for i, c := range []clientRequest{
		{method: "GET", target: "/api/items?page=2", host: "shop.example"},
		{method: "POST", target: "/api/cart?deny=403", host: "shop.example", header: spoof},
		{method: "GET", target: "/api/../../other/x?deny=403", host: "shop.example", header: spoof},
		{method: "DELETE", target: "/api/%2F..%2F..%2Fother", host: "other.example"},
	} {
		c.peer = "198.51.100.7"
		a := e.do(t, h, c)
		if i < 2 {
			if !a.admitted || a.header.Get("RateLimit") != []string{`"standard";r=1;t=60`, `"standard";r=0;t=120`}[i] ||
				a.header.Get("RateLimit-Policy") != `"standard";q=2;w=120` {
				t.Errorf("request %d %s: admitted %v, client headers %v", i, c.target, a.admitted, a.header)
			}
			continue
		}
		if a.admitted || a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "60" ||
			a.header.Get("RateLimit") != `"standard";r=0;t=120` || a.header.Get("RateLimit-Policy") != `"standard";q=2;w=120` ||
			a.header.Get("Content-Type") != "application/json" || !strings.Contains(a.body, `"allowed":false`) {
			t.Errorf("request %d %s: want 429 with Retry-After and RateLimit fields, got %d %v %s", i, c.target, a.status, a.header, a.body)
		}
	}
	// Another client, and a client by its key, have budgets of their own; other's is whole.
	if a := e.do(t, h, clientRequest{method: "GET", target: "/api/items", host: "shop.example", peer: "198.51.100.8"}); !a.admitted {
		t.Errorf("another client: %d %s", a.status, a.body)
	}
	keyed := clientRequest{method: "GET", target: "/api/items", host: "shop.example", peer: "198.51.100.7", header: [][2]string{{"x-api-key", "k1"}}}
	if a := e.do(t, h, keyed); !a.admitted || a.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("keyed client: %d %v", a.status, a.header)
	}
	if a := forward(t, h, http.MethodGet, "/v1/forward-auth/shop/other", xff("198.51.100.7")); a.status != 200 || a.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("shop/other: %d RateLimit %q, want its budget untouched", a.status, a.header.Get("RateLimit"))
	}

	// limiterd not ready (503): Envoy fails closed, 403.
	notReady := NewDecisions(newEngine(t, testsupport.NewClock()), nil)
	if a := e.do(t, notReady, clientRequest{method: "GET", target: "/api/items", host: "shop.example", peer: "198.51.100.7"}); a.admitted || a.status != http.StatusForbidden {
		t.Errorf("not ready: admitted %v %d, want 403", a.admitted, a.status)
	}
}
