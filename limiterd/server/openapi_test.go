package server

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/limiterd/limiterd/api/openapi"
	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// specChecker checks requests to the handlers and their answers against api/openapi's spec with
// kin-openapi, and records which operation answered which status.
type specChecker struct {
	doc    *openapi3.T
	router routers.Router
	// answered holds "METHOD /path status" of every answer checked.
	answered map[string]bool
}

func newSpecChecker(t *testing.T) *specChecker {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openapi.Spec)
	if err != nil {
		t.Fatalf("load api/openapi/openapi.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("api/openapi/openapi.yaml is no valid OpenAPI document: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() || doc.IsOpenAPI32OrLater() {
		t.Fatalf("api/openapi/openapi.yaml is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatalf("router: %v", err)
	}
	return &specChecker{doc: doc, router: router, answered: map[string]bool{}}
}

// specCase is a request to a handler and the status it must answer.
type specCase struct {
	name   string
	h      http.Handler
	method string
	target string
	body   string
	header http.Header // added to the request; Content-Type application/json when a body is sent
	status int
	// invalid: the request breaks the spec (kin-openapi must refuse it as the handler does).
	// Requests that the spec admits but the handler refuses (a policy omitted while several
	// are loaded, a reservation that is not one) are not invalid.
	invalid bool
}

func (c *specCase) request() *http.Request {
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	r := httptest.NewRequest(c.method, c.target, body)
	r.RemoteAddr = "10.0.0.1:40000"
	if c.body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range c.header {
		r.Header[k] = v
	}
	return r
}

// check serves c, checks its status, and checks the request and the answer against the spec.
// A path or a method the spec does not list must answer 404 or 405 with an Error.
func (s *specChecker) check(t *testing.T, c specCase) answer {
	t.Helper()
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, c.request())
	res := rec.Result()
	a := answer{status: res.StatusCode, header: res.Header, body: rec.Body.String()}
	if a.status != c.status {
		t.Errorf("%s: %s %.100s answered %d %.300s, want %d", c.name, c.method, c.target, a.status, a.body, c.status)
	}
	req := c.request()
	route, params, err := s.router.FindRoute(req)
	if err != nil {
		if a.status != http.StatusNotFound && a.status != http.StatusMethodNotAllowed {
			t.Errorf("%s: %s %s is not in the spec (%v), yet answered %d", c.name, c.method, c.target, err, a.status)
		}
		s.checkError(t, c.name, a)
		return a
	}
	opts := &openapi3filter.Options{
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
		IncludeResponseStatus: true,
		SkipSettingDefaults:   true,
		MultiError:            true,
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	err = openapi3filter.ValidateRequest(t.Context(), in)
	switch {
	case c.invalid && err == nil:
		t.Errorf("%s: the spec admits the request the case calls invalid", c.name)
	case !c.invalid && err != nil:
		t.Errorf("%s: request breaks the spec: %v", c.name, err)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: a.status, Header: a.header, Options: opts}
	out.SetBodyBytes([]byte(a.body))
	if err := openapi3filter.ValidateResponse(t.Context(), out); err != nil {
		t.Errorf("%s: %s %.100s: answer %d %v %.300s breaks the spec: %v", c.name, c.method, c.target, a.status, a.header, a.body, err)
	}
	s.answered[fmt.Sprintf("%s %s %d", route.Method, route.Path, a.status)] = true
	return a
}

// checkError checks that a is an Error of the spec.
func (s *specChecker) checkError(t *testing.T, name string, a answer) {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(a.body), &v); err != nil {
		t.Errorf("%s: answer %q is not JSON: %v", name, a.body, err)
		return
	}
	schema := s.doc.Components.Schemas["Error"].Value
	if err := schema.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
		t.Errorf("%s: answer %s is no Error of the spec: %v", name, a.body, err)
	}
}

// unexercised says why an operation's status is not answered in TestHandlersMatchOpenAPI, or
// "" when it must be.
func unexercised(method, path, status string) string {
	switch {
	case status == "500":
		return "an unexpected engine failure, which no test engine makes"
	case path == "/v1/forward-auth/{namespace}/{name}" && method != http.MethodGet:
		return "one operation for every method (a YAML alias of GET's); GET's statuses are each answered"
	}
	return ""
}

// TestHandlersMatchOpenAPI drives the decisions and admin handlers through every path of
// api/openapi/openapi.yaml and every status the spec lists (but those unexercised names), and
// checks each request and answer against the spec with kin-openapi's openapi3filter. The
// answers' schemas admit no field they do not list, so a field a handler adds, renames or
// retypes without the spec fails here, as does a status the spec does not list.
func TestHandlersMatchOpenAPI(t *testing.T) {
	s := newSpecChecker(t)

	// The decisions API, with a policy of each kind of answer.
	clock := testsupport.NewClock()
	dry := testsupport.TokenBucketTier("standard", 1, 1, time.Hour)
	dry.DryRun = true
	byHeader := func(m v1alpha1.MissingKey) *v1alpha1.Gateway {
		return &v1alpha1.Gateway{MissingKey: m, KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}}}
	}
	e := newEngine(t, clock,
		withRefunds(newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Hour))),
		withRefunds(newPolicy("stack", testsupport.StackedTier("standard",
			testsupport.TokenBucketLimit("burst", 2, 1, time.Hour), testsupport.TokenBucketLimit("daily", 5, 1, time.Hour)))),
		newPolicy("free", testsupport.UnlimitedTier("internal")),
		newPolicy("dry", dry),
		gatewayPolicy("gw", byAddress(1)),
		gatewayPolicy("gwallow", byHeader(v1alpha1.MissingKeyAllow)),
		gatewayPolicy("gwreject", byHeader("")),
	)
	d := NewDecisions(e, nil, WithLegacyHeaders())
	notReady := NewDecisions(newEngine(t, testsupport.NewClock()), nil)
	hosts := NewDecisions(e, nil, WithAllowedHosts(nil))
	busy := NewDecisions(e, nil, WithBodyBudget(1))
	crossSite := http.Header{"Sec-Fetch-Site": {"cross-site"}}
	text := http.Header{"Content-Type": {"text/plain"}}
	tooLong := `{"key":"` + strings.Repeat("k", MaxBodyBytes) + `"}`
	var tooMany strings.Builder
	tooMany.WriteString(`{"items":[`)
	for i := range MaxBatchItems + 1 {
		if i > 0 {
			tooMany.WriteByte(',')
		}
		tooMany.WriteString(`{"key":"k"}`)
	}
	tooMany.WriteString(`]}`)

	for _, c := range []specCase{
		{name: "allow", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"default/api","key":"alice","cost":1}`, status: 200},
		{name: "allow by query", h: d, method: "GET", target: "/v1/allow?policy=api&key=alice", status: 200},
		{name: "allow rejected", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"api","key":"alice"}`, status: 429},
		{name: "allow rejected by query", h: d, method: "GET", target: "/v1/allow?policy=api&key=alice&cost=1", status: 429},
		{name: "a peek", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"api","key":"alice","cost":0}`, status: 429},
		{name: "a cost above the limit", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"api","key":"bob","cost":3}`, status: 429},
		{name: "a stack", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"stack","key":"alice","cost":2}`, status: 200},
		{name: "a stack rejected", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"stack","key":"alice"}`, status: 429},
		{name: "no limit", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"free","key":"alice","cost":null}`, status: 200},
		{name: "dry run", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"dry","key":"alice"}`, status: 200},
		{name: "dry run would reject", h: d, method: "GET", target: "/v1/allow?policy=dry&key=alice", status: 200},
		{name: "no policy named", h: d, method: "POST", target: "/v1/allow", body: `{"key":"alice"}`, status: 400},
		{name: "unknown field", h: d, method: "POST", target: "/v1/allow", body: `{"key":"alice","amount":1}`, status: 400, invalid: true},
		{name: "cost too high", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"api","key":"alice","cost":1000000001}`, status: 400, invalid: true},
		{name: "no key", h: d, method: "GET", target: "/v1/allow?policy=api", status: 400, invalid: true},
		{name: "unknown policy", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"nope","key":"alice"}`, status: 404},
		{name: "unknown policy by query", h: d, method: "GET", target: "/v1/allow?policy=nope&key=alice", status: 404},
		{name: "cross-site", h: d, method: "POST", target: "/v1/allow", body: `{"policy":"api","key":"alice"}`, header: crossSite, status: 403},
		{name: "cross-site GET", h: d, method: "GET", target: "/v1/allow?policy=api&key=alice", header: crossSite, status: 403},
		{name: "body too large", h: d, method: "POST", target: "/v1/allow", body: tooLong, status: 413},
		{name: "form content type", h: d, method: "POST", target: "/v1/allow", body: `{"key":"alice"}`, header: text, status: 415, invalid: true},
		{name: "misdirected", h: hosts, method: "POST", target: "/v1/allow", body: `{"policy":"api","key":"alice"}`, status: 421},
		{name: "misdirected GET", h: hosts, method: "GET", target: "/v1/allow?policy=api&key=alice", status: 421},
		{name: "not ready", h: notReady, method: "POST", target: "/v1/allow", body: `{"key":"alice"}`, status: 503},
		{name: "not ready GET", h: notReady, method: "GET", target: "/v1/allow?key=alice", status: 503},
		{name: "bodies over budget", h: busy, method: "POST", target: "/v1/allow", body: `{"key":"alice"}`, status: 503},
		{name: "another method", h: d, method: "PUT", target: "/v1/allow", body: `{"key":"alice"}`, status: 405},
		{name: "no such path", h: d, method: "GET", target: "/v1/nope", status: 404},

		{name: "batch", h: d, method: "POST", target: "/v1/allow:batch", status: 200,
			body: `{"items":[{"policy":"api","key":"carol","cost":1},{"policy":"stack","key":"carol"},{"policy":"free","key":"carol"},` +
				`{"policy":"dry","key":"carol","cost":0},{"policy":"api","key":"carol","cost":5},{"policy":"nope","key":"carol"},{"key":"carol"}]}`},
		{name: "batch of bad items", h: d, method: "POST", target: "/v1/allow:batch", body: `{"items":[{"policy":"api"},{"key":"k","cost":-1}]}`, status: 200, invalid: true},
		{name: "batch not an object of items", h: d, method: "POST", target: "/v1/allow:batch", body: `{"item":[]}`, status: 400, invalid: true},
		{name: "batch too large", h: d, method: "POST", target: "/v1/allow:batch", body: tooMany.String(), status: 413, invalid: true},
		{name: "batch cross-site", h: d, method: "POST", target: "/v1/allow:batch", body: `{"items":[]}`, header: crossSite, status: 403},
		{name: "batch form", h: d, method: "POST", target: "/v1/allow:batch", body: `{"items":[]}`, header: text, status: 415, invalid: true},
		{name: "batch misdirected", h: hosts, method: "POST", target: "/v1/allow:batch", body: `{"items":[]}`, status: 421},
		{name: "batch not ready", h: notReady, method: "POST", target: "/v1/allow:batch", body: `{"items":[]}`, status: 503},
		{name: "batch by GET", h: d, method: "GET", target: "/v1/allow:batch", status: 405},

		{name: "forward auth", h: d, method: "GET", target: "/v1/forward-auth/default/gw", header: xff("203.0.113.1"), status: 200},
		{name: "forward auth POST", h: d, method: "POST", target: "/v1/forward-auth/default/gw", header: xff("203.0.113.1"), status: 200},
		{name: "forward auth rejected", h: d, method: "GET", target: "/v1/forward-auth/default/gw?deny=429", header: xff("203.0.113.1"), status: 429},
		{name: "forward auth rejected for nginx", h: d, method: "GET", target: "/v1/forward-auth/default/gw?deny=403", header: xff("203.0.113.1"), status: 403},
		{name: "forward auth no key, allowed", h: d, method: "GET", target: "/v1/forward-auth/default/gwallow", status: 200},
		{name: "forward auth no key, rejected", h: d, method: "GET", target: "/v1/forward-auth/default/gwreject", status: 429},
		{name: "forward auth no key, rejected for nginx", h: d, method: "GET", target: "/v1/forward-auth/default/gwreject?deny=403", status: 403},
		{name: "forward auth bad deny", h: d, method: "GET", target: "/v1/forward-auth/default/gw?deny=500", status: 400, invalid: true},
		{name: "forward auth header twice", h: d, method: "GET", target: "/v1/forward-auth/default/gwreject",
			header: http.Header{"X-Api-Key": {"a", "b"}}, status: 400},
		{name: "forward auth unknown policy", h: d, method: "GET", target: "/v1/forward-auth/default/nope", status: 404},
		{name: "forward auth no gateway", h: d, method: "GET", target: "/v1/forward-auth/default/api", status: 409},
		{name: "forward auth header too long", h: d, method: "GET", target: "/v1/forward-auth/default/gwreject",
			header: http.Header{"X-Api-Key": {strings.Repeat("k", v1alpha1.MaxGatewayHeaderBytes+1)}}, status: 431},
		{name: "forward auth misdirected", h: hosts, method: "GET", target: "/v1/forward-auth/default/gw", status: 421},
		{name: "forward auth not ready", h: notReady, method: "GET", target: "/v1/forward-auth/default/gw", status: 503},
		{name: "forward auth of no policy", h: d, method: "GET", target: "/v1/forward-auth/default", status: 404, invalid: true},
	} {
		s.check(t, c)
	}

	// Refunds: reservations of decisions on the policies that enable them.
	reserve := func(h http.Handler, policy, key string, cost int) string {
		t.Helper()
		a := s.check(t, specCase{name: "reserve", h: h, method: "POST", target: "/v1/allow",
			body: fmt.Sprintf(`{"policy":%q,"key":%q,"cost":%d}`, policy, key, cost), status: 200})
		r := reservationOf(t, a.body)
		if r == "" {
			t.Fatalf("no reservation in %s", a.body)
		}
		return r
	}
	dave := reserve(d, "api", "dave", 2)
	erin := reserve(d, "stack", "erin", 2)
	raw, err := base64.RawURLEncoding.DecodeString(erin)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 1
	forged := base64.RawURLEncoding.EncodeToString(raw)
	refundOf := func(r string) string { return `{"reservation":"` + r + `"}` }
	for _, c := range []specCase{
		{name: "refund", h: d, method: "POST", target: "/v1/refund", body: `{"reservation":"` + dave + `","cost":1}`, status: 200},
		{name: "refund of a stack", h: d, method: "POST", target: "/v1/refund", body: refundOf(erin), status: 200},
		{name: "refund again", h: d, method: "POST", target: "/v1/refund", body: refundOf(erin), status: 409},
		{name: "refund forged", h: d, method: "POST", target: "/v1/refund", body: refundOf(forged), status: 403},
		{name: "refund of no reservation", h: d, method: "POST", target: "/v1/refund", body: refundOf("!"), status: 400},
		{name: "refund of cost 0", h: d, method: "POST", target: "/v1/refund", body: `{"reservation":"` + dave + `","cost":0}`, status: 400, invalid: true},
		{name: "refund by key", h: d, method: "POST", target: "/v1/refund", body: `{"policy":"api","key":"dave"}`, status: 400, invalid: true},
		{name: "refund too large", h: d, method: "POST", target: "/v1/refund", body: `{"reservation":"` + strings.Repeat("A", MaxBodyBytes) + `"}`, status: 413, invalid: true},
		{name: "refund cross-site", h: d, method: "POST", target: "/v1/refund", body: refundOf(dave), header: crossSite, status: 403},
		{name: "refund form", h: d, method: "POST", target: "/v1/refund", body: refundOf(dave), header: text, status: 415, invalid: true},
		{name: "refund misdirected", h: hosts, method: "POST", target: "/v1/refund", body: refundOf(dave), status: 421},
		{name: "refund of another service's key", h: notReady, method: "POST", target: "/v1/refund", body: refundOf(dave), status: 403},
		{name: "refund bodies over budget", h: busy, method: "POST", target: "/v1/refund", body: refundOf(dave), status: 503},
		{name: "refund by GET", h: d, method: "GET", target: "/v1/refund", status: 405},
	} {
		s.check(t, c)
	}
	// An expired reservation, then one of a policy no longer loaded, on an engine of their own.
	lateClock := testsupport.NewClock()
	api := withRefunds(newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Hour)))
	other := newPolicy("other", testsupport.TokenBucketTier("standard", 2, 1, time.Hour))
	late := newEngine(t, lateClock, api, other)
	lateAPI := NewDecisions(late, nil)
	expired := reserve(lateAPI, "api", "frank", 1)
	lateClock.Advance(3 * time.Hour)
	s.check(t, specCase{name: "refund expired", h: lateAPI, method: "POST", target: "/v1/refund", body: refundOf(expired), status: 410})
	unloaded := reserve(lateAPI, "api", "grace", 1)
	late.Swap(testsupport.PolicySet(t, other))
	s.check(t, specCase{name: "refund of a policy unloaded", h: lateAPI, method: "POST", target: "/v1/refund", body: refundOf(unloaded), status: 404})

	// Releases: leases of decisions on a tier with a concurrency limit, on an engine of their own.
	leaseClock := testsupport.NewClock()
	leases := leaseEngine(t, leaseClock, 100, 2, "inflight")
	lh := NewDecisions(leases, nil)
	take := func(key string) string {
		t.Helper()
		a := s.check(t, specCase{name: "lease", h: lh, method: "POST", target: "/v1/allow", body: `{"key":"` + key + `"}`, status: 200})
		l := leaseOf(t, a).Lease
		if l == "" {
			t.Fatalf("no lease in %s", a.body)
		}
		return l
	}
	hal, ivy := take("hal"), take("ivy")
	raw, err = base64.RawURLEncoding.DecodeString(ivy)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 1
	leaseForged := base64.RawURLEncoding.EncodeToString(raw)
	for _, c := range []specCase{
		{name: "release", h: lh, method: "POST", target: "/v1/release", body: releaseOf(hal, false), status: 200},
		{name: "release again", h: lh, method: "POST", target: "/v1/release", body: releaseOf(hal, false), status: 409},
		{name: "extension", h: lh, method: "POST", target: "/v1/release", body: releaseOf(ivy, true), status: 200},
		{name: "release forged", h: lh, method: "POST", target: "/v1/release", body: releaseOf(leaseForged, false), status: 403},
		{name: "release of no lease", h: lh, method: "POST", target: "/v1/release", body: releaseOf("!", false), status: 400},
		{name: "release with a timeout", h: lh, method: "POST", target: "/v1/release", body: `{"lease":"` + ivy + `","ttl":60}`, status: 400, invalid: true},
		{name: "release too large", h: lh, method: "POST", target: "/v1/release", body: `{"lease":"` + strings.Repeat("A", MaxBodyBytes) + `"}`, status: 413, invalid: true},
		{name: "release cross-site", h: lh, method: "POST", target: "/v1/release", body: releaseOf(ivy, false), header: crossSite, status: 403},
		{name: "release form", h: lh, method: "POST", target: "/v1/release", body: releaseOf(ivy, false), header: text, status: 415, invalid: true},
		{name: "release misdirected", h: NewDecisions(leases, nil, WithAllowedHosts(nil)), method: "POST", target: "/v1/release", body: releaseOf(ivy, false), status: 421},
		{name: "release of another service's key", h: notReady, method: "POST", target: "/v1/release", body: releaseOf(ivy, false), status: 403},
		{name: "release bodies over budget", h: NewDecisions(leases, nil, WithBodyBudget(1)), method: "POST", target: "/v1/release", body: releaseOf(ivy, false), status: 503},
		{name: "release by GET", h: lh, method: "GET", target: "/v1/release", status: 405},
	} {
		s.check(t, c)
	}
	expiring := take("jay")
	leaseClock.Advance(leaseTimeoutForTests)
	s.check(t, specCase{name: "release expired", h: lh, method: "POST", target: "/v1/release", body: releaseOf(expiring, false), status: 410})
	unloaded = take("kim")
	leases.Swap(testsupport.PolicySet(t, other))
	s.check(t, specCase{name: "release of a policy unloaded", h: lh, method: "POST", target: "/v1/release", body: releaseOf(unloaded, false), status: 404})

	// The admin API: open, by token with rights (alice) or none (bob), failing reviews,
	// loopback only, and before any policy.
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte("limiterd_x 1\n"))
	})
	quiet := slog.New(slog.DiscardHandler) // the failing reviews and the resets log
	open := NewAdmin(e, AdminOptions{Auth: adminauth.Open(), Metrics: metrics, Replica: "limiterd-0", Logger: quiet})
	authz := &rules{allow: map[string]bool{
		"alice get /metrics": true,
		"alice list default/limiterd.dev:ratelimitpolicies":        true,
		"alice get default/limiterd.dev:ratelimitpolicies/clients": true,
	}}
	byToken := NewAdmin(e, AdminOptions{Auth: adminauth.New(tokens, authz.authorizer(), "test"), Metrics: metrics})
	failing := NewAdmin(e, AdminOptions{Auth: adminauth.New(tokens, (&rules{failing: true}).authorizer(), "test"), Metrics: metrics, Logger: quiet})
	loopback := NewAdmin(e, AdminOptions{Auth: adminauth.OpenLoopback(), Metrics: metrics})
	adminNotReady := NewAdmin(newEngine(t, testsupport.NewClock()), AdminOptions{Auth: adminauth.Open()})
	noMetrics := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})
	noTop := engine.New(engine.Options{NoTopClients: true})
	noTop.Swap(testsupport.PolicySet(t, newPolicy("api", testsupport.TokenBucketTier("standard", 2, 1, time.Hour))))
	topOff := NewAdmin(noTop, AdminOptions{Auth: adminauth.Open()})
	alice := http.Header{"Authorization": {"Bearer token-alice"}}
	bob := http.Header{"Authorization": {"Bearer token-bob"}}
	for _, c := range []specCase{
		{name: "healthz", h: byToken, method: "GET", target: "/healthz", status: 200},
		{name: "readyz", h: byToken, method: "GET", target: "/readyz", status: 200},
		{name: "readyz verbose", h: open, method: "GET", target: "/readyz?verbose", status: 200},
		{name: "readyz not ready", h: adminNotReady, method: "GET", target: "/readyz?verbose", status: 503},
		{name: "readyz by POST", h: open, method: "POST", target: "/readyz", status: 405},
		{name: "openapi", h: byToken, method: "GET", target: "/openapi.yaml", status: 200},
		{name: "metrics", h: byToken, method: "GET", target: "/metrics", header: alice, status: 200},
		{name: "metrics without a token", h: byToken, method: "GET", target: "/metrics", status: 401},
		{name: "metrics not allowed", h: byToken, method: "GET", target: "/metrics", header: bob, status: 403},
		{name: "metrics off", h: noMetrics, method: "GET", target: "/metrics", status: 404},
		{name: "metrics review failing", h: failing, method: "GET", target: "/metrics", header: alice, status: 503},
		{name: "policies", h: byToken, method: "GET", target: "/v1/policies", header: alice, status: 200},
		{name: "policies none visible", h: byToken, method: "GET", target: "/v1/policies", header: bob, status: 200},
		{name: "policies without a token", h: byToken, method: "GET", target: "/v1/policies", status: 401},
		{name: "policies not to loopback", h: loopback, method: "GET", target: "/v1/policies", status: 403},
		{name: "policies review failing", h: failing, method: "GET", target: "/v1/policies", header: alice, status: 503},
		{name: "policies not ready", h: adminNotReady, method: "GET", target: "/v1/policies", status: 503},
		{name: "client", h: byToken, method: "GET", target: "/v1/clients?policy=default/api&key=alice", header: alice, status: 200},
		{name: "client of a stack", h: open, method: "GET", target: "/v1/clients?policy=default/stack&key=alice", status: 200},
		{name: "client without a limit", h: open, method: "GET", target: "/v1/clients?policy=default/free&key=alice", status: 200},
		{name: "client no key", h: open, method: "GET", target: "/v1/clients?policy=default/api", status: 400, invalid: true},
		{name: "client no policy named", h: open, method: "GET", target: "/v1/clients?key=alice", status: 400},
		{name: "client without a token", h: byToken, method: "GET", target: "/v1/clients?policy=default/api&key=alice", status: 401},
		{name: "client not allowed", h: byToken, method: "GET", target: "/v1/clients?policy=default/api&key=alice", header: bob, status: 403},
		{name: "client unknown policy", h: open, method: "GET", target: "/v1/clients?policy=default/nope&key=alice", status: 404},
		{name: "client review failing", h: failing, method: "GET", target: "/v1/clients?policy=default/api&key=alice", header: alice, status: 503},
		{name: "client not ready", h: adminNotReady, method: "GET", target: "/v1/clients?key=alice", status: 503},
		{name: "client reset", h: open, method: "DELETE", target: "/v1/clients?policy=default/api&key=bob", status: 204},
		{name: "client reset no key", h: open, method: "DELETE", target: "/v1/clients?policy=default/api", status: 400, invalid: true},
		{name: "client reset without a token", h: byToken, method: "DELETE", target: "/v1/clients?policy=default/api&key=bob", status: 401},
		{name: "client reset not allowed", h: byToken, method: "DELETE", target: "/v1/clients?policy=default/api&key=bob", header: alice, status: 403},
		{name: "client reset unknown policy", h: open, method: "DELETE", target: "/v1/clients?policy=default/nope&key=bob", status: 404},
		{name: "client reset review failing", h: failing, method: "DELETE", target: "/v1/clients?policy=default/api&key=bob", header: alice, status: 503},
		{name: "client reset not ready", h: adminNotReady, method: "DELETE", target: "/v1/clients?key=bob", status: 503},
		{name: "clients by POST", h: open, method: "POST", target: "/v1/clients?key=bob", status: 405},
		{name: "top", h: open, method: "GET", target: "/v1/top?policy=default/api&by=admitted&n=5", status: 200},
		{name: "top rejected", h: byToken, method: "GET", target: "/v1/top?policy=default/api", header: alice, status: 200},
		{name: "top bad n", h: open, method: "GET", target: "/v1/top?policy=default/api&n=0", status: 400, invalid: true},
		{name: "top without a token", h: byToken, method: "GET", target: "/v1/top?policy=default/api", status: 401},
		{name: "top not allowed", h: byToken, method: "GET", target: "/v1/top?policy=default/api", header: bob, status: 403},
		{name: "top off", h: topOff, method: "GET", target: "/v1/top", status: 404},
		{name: "top review failing", h: failing, method: "GET", target: "/v1/top?policy=default/api", header: alice, status: 503},
		{name: "top not ready", h: adminNotReady, method: "GET", target: "/v1/top", status: 503},
		{name: "admin no such path", h: open, method: "GET", target: "/v1/nope", status: 404},
	} {
		s.check(t, c)
	}

	// Every status of every operation was answered, but those unexercised names.
	for path, item := range s.doc.Paths.Map() {
		for method, op := range item.Operations() {
			for status := range op.Responses.Map() {
				key := fmt.Sprintf("%s %s %s", method, path, status)
				if !s.answered[key] && unexercised(method, path, status) == "" {
					t.Errorf("no case answers %s", key)
				}
			}
		}
	}
}
