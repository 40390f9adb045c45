package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
)

// send sends method target (a path and query) with body and header to srv and returns the
// answer.
func send(t *testing.T, srv *httptest.Server, method, target, body string, header http.Header) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// isJSONError reports whether a is an error answer: application/json, {"error": "<text>"}.
func (a answer) isJSONError() bool {
	var e struct {
		Error string `json:"error"`
	}
	return a.header.Get("Content-Type") == "application/json" && json.Unmarshal([]byte(a.body), &e) == nil && e.Error != ""
}

// remaining returns the "remaining" of a decision's answer, or -1 when a is none.
func (a answer) remaining() int64 {
	var d struct {
		Remaining *int64 `json:"remaining"`
	}
	if json.Unmarshal([]byte(a.body), &d) != nil || d.Remaining == nil {
		return -1
	}
	return *d.Remaining
}

// browserBodies are a POST body for each path of the decisions API.
var browserBodies = map[string]string{
	"/v1/allow":       `{"key":"alice","cost":1}`,
	"/v1/allow:batch": `{"items":[{"key":"alice","cost":1}]}`,
	"/v1/refund":      `{"key":"alice","amount":1}`,
	"/v1/release":     `{"lease":"x"}`,
}

// TestDecisionsRefuseBrowserPosts: every POST of the decisions API refuses the content types a
// web page can make a browser send cross-site without a preflight (415, consuming nothing), and
// the requests a browser marks as cross-site (403); application/json, with parameters, and no
// Content-Type are served. Before, a text/plain POST (which any web page can send) was decided.
func TestDecisionsRefuseBrowserPosts(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Hour)))
	srv := httptest.NewServer(NewDecisions(e, nil))
	t.Cleanup(srv.Close)
	for _, ct := range []string{
		"text/plain", "text/plain; charset=utf-8", "TEXT/PLAIN", "application/x-www-form-urlencoded",
		"multipart/form-data; boundary=x", "application/xml", "text/plain;application/json", "application/jsonx", "",
	} {
		for path, body := range browserBodies {
			if a := send(t, srv, http.MethodPost, path, body, http.Header{"Content-Type": {ct}}); a.status != http.StatusUnsupportedMediaType || !a.isJSONError() {
				t.Errorf("POST %s with Content-Type %q: %d %s, want 415 with a JSON error", path, ct, a.status, a.body)
			}
		}
	}
	if a := send(t, srv, http.MethodPost, "/v1/allow", browserBodies["/v1/allow"], http.Header{"Content-Type": {"application/json", "text/plain"}}); a.status != http.StatusUnsupportedMediaType {
		t.Errorf("two Content-Types: %d %s, want 415", a.status, a.body)
	}
	for name, h := range map[string]http.Header{
		"Sec-Fetch-Site cross-site": {"Content-Type": {"application/json"}, "Sec-Fetch-Site": {"cross-site"}},
		"Sec-Fetch-Site same-site":  {"Sec-Fetch-Site": {"same-site"}},
		"another Origin":            {"Content-Type": {"application/json"}, "Origin": {"http://attacker.example"}},
	} {
		for path, body := range browserBodies {
			if a := send(t, srv, http.MethodPost, path, body, h); a.status != http.StatusForbidden || !a.isJSONError() {
				t.Errorf("POST %s, %s: %d %s, want 403 with a JSON error", path, name, a.status, a.body)
			}
		}
	}
	// Nothing above consumed anything: three units are left for these three decisions.
	for i, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON ;charset=UTF-8"} {
		a := send(t, srv, http.MethodPost, "/v1/allow", browserBodies["/v1/allow"], http.Header{"Content-Type": {ct}})
		if a.status != http.StatusOK || a.remaining() != int64(2-i) {
			t.Errorf("POST /v1/allow with Content-Type %q: %d %s, want 200 with %d remaining", ct, a.status, a.body, 2-i)
		}
	}
	if a := send(t, srv, http.MethodPost, "/v1/allow", browserBodies["/v1/allow"], http.Header{"Sec-Fetch-Site": {"same-origin"}}); a.status != http.StatusTooManyRequests {
		t.Errorf("POST /v1/allow without Content-Type: %d %s, want 429 (decided: the allowance is spent)", a.status, a.body)
	}
	// A path that does not exist is one, whatever the type.
	if a := send(t, srv, http.MethodPost, "/nope", "", http.Header{"Content-Type": {"text/plain"}}); a.status != http.StatusNotFound {
		t.Errorf("POST /nope: %d %s, want 404", a.status, a.body)
	}
}

// TestDecisionsRefuseCrossSite: a request a browser marks as sent on behalf of another site
// (Sec-Fetch-Site other than same-origin or none; without it, an Origin that is null, not an
// origin, or of another host) is refused with 403, spending nothing, whatever its method and
// path; same-origin requests and requests without either header (every client but browsers)
// are decided. Before, CrossOriginProtection let GET through, so that any web page could spend
// a client's allowance from a browser on the network with <img src=".../v1/allow?key=victim">.
func TestDecisionsRefuseCrossSite(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 5, 1, time.Hour)))
	srv := httptest.NewServer(NewDecisions(e, nil))
	t.Cleanup(srv.Close)
	self := srv.URL // the origin of a page served by limiterd's own address
	const allow = "/v1/allow?policy=default/api&key=alice"
	peek := func() int64 {
		t.Helper()
		a := send(t, srv, http.MethodGet, allow+"&cost=0", "", nil)
		if a.status != http.StatusOK && a.status != http.StatusTooManyRequests {
			t.Fatalf("peek: %d %s", a.status, a.body)
		}
		return a.remaining()
	}
	crossSite := map[string]http.Header{
		"Sec-Fetch-Site cross-site":                 {"Sec-Fetch-Site": {"cross-site"}},
		"Sec-Fetch-Site same-site":                  {"Sec-Fetch-Site": {"same-site"}},
		"Sec-Fetch-Site cross-site, Origin its own": {"Sec-Fetch-Site": {"cross-site"}, "Origin": {self}},
		"Sec-Fetch-Site twice":                      {"Sec-Fetch-Site": {"same-origin", "cross-site"}},
		"another Origin":                            {"Origin": {"http://attacker.example"}},
		"another Origin's port":                     {"Origin": {self + "1"}},
		"Origin null":                               {"Origin": {"null"}},
		"Origin not an origin":                      {"Origin": {strings.TrimPrefix(self, "http://")}},
		"Origin with a path":                        {"Origin": {self + "/x"}},
		"Origin twice":                              {"Origin": {self, "http://attacker.example"}},
	}
	for name, h := range crossSite {
		for _, c := range []struct{ method, target, body string }{
			{http.MethodGet, allow, ""},
			{http.MethodGet, allow + "&cost=0", ""},
			{http.MethodPost, "/v1/allow", browserBodies["/v1/allow"]},
			{http.MethodPost, "/v1/allow:batch", browserBodies["/v1/allow:batch"]},
			{http.MethodPost, "/v1/refund", browserBodies["/v1/refund"]},
			{http.MethodPost, "/v1/release", browserBodies["/v1/release"]},
			{http.MethodGet, "/v1/allow:batch", ""},
			{http.MethodGet, "/v1/refund", ""},
			{http.MethodDelete, allow, ""},
		} {
			if a := send(t, srv, c.method, c.target, c.body, h.Clone()); a.status != http.StatusForbidden || !a.isJSONError() {
				t.Errorf("%s %s, %s: %d %s, want 403 with a JSON error", c.method, c.target, name, a.status, a.body)
			}
		}
	}
	if got := peek(); got != 5 {
		t.Fatalf("after the cross-site requests %d remain, want 5: they spent allowance", got)
	}
	// Same-origin requests, and requests of clients that are not browsers, are decided.
	for i, h := range []http.Header{
		nil,
		{"Sec-Fetch-Site": {"same-origin"}},
		{"Sec-Fetch-Site": {"none"}}, // typed into the address bar
		{"Origin": {self}},
		{"Sec-Fetch-Site": {"same-origin"}, "Origin": {self}},
	} {
		if a := send(t, srv, http.MethodGet, allow, "", h); a.status != http.StatusOK || a.remaining() != int64(4-i) {
			t.Errorf("GET %s with %v: %d %s, want 200 with %d remaining", allow, h, a.status, a.body, 4-i)
		}
	}
}

// TestCrossSiteAllocatesNothing: the cross-site check of a request it admits allocates nothing.
func TestCrossSiteAllocatesNothing(t *testing.T) {
	for _, header := range []http.Header{{}, {"Sec-Fetch-Site": {"same-origin"}}, {"Origin": {"http://limiterd.shop.svc:8080"}}} {
		r := httptest.NewRequest(http.MethodGet, "http://limiterd.shop.svc:8080/v1/allow?key=k", nil)
		r.Header = header
		if n := testing.AllocsPerRun(100, func() {
			if msg := crossSite(r); msg != "" {
				t.Fatalf("%v refused: %s", header, msg)
			}
		}); n != 0 {
			t.Errorf("crossSite with %v allocates %v times", header, n)
		}
	}
}
