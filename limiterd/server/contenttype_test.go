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

// TestDecisionsRefuseBrowserPosts: every POST of the decisions API refuses the content types a
// web page can make a browser send cross-site without a preflight (415, consuming nothing), and
// the requests a browser marks as cross-site (403); application/json, with parameters, and no
// Content-Type are served. Before, a text/plain POST (which any web page can send) was decided.
func TestDecisionsRefuseBrowserPosts(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Hour)))
	srv := httptest.NewServer(NewDecisions(e, nil))
	t.Cleanup(srv.Close)
	post := func(path, body string, header http.Header) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, strings.NewReader(body))
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
		return resp.StatusCode, resp.Header, string(b)
	}
	isJSONError := func(h http.Header, body string) bool {
		var e struct {
			Error string `json:"error"`
		}
		return h.Get("Content-Type") == "application/json" && json.Unmarshal([]byte(body), &e) == nil && e.Error != ""
	}
	bodies := map[string]string{
		"/v1/allow":       `{"key":"alice","cost":1}`,
		"/v1/allow:batch": `{"items":[{"key":"alice","cost":1}]}`,
		"/v1/refund":      `{"key":"alice","amount":1}`,
	}
	for _, ct := range []string{
		"text/plain", "text/plain; charset=utf-8", "TEXT/PLAIN", "application/x-www-form-urlencoded",
		"multipart/form-data; boundary=x", "application/xml", "text/plain;application/json", "application/jsonx", "",
	} {
		for path, body := range bodies {
			status, h, answer := post(path, body, http.Header{"Content-Type": {ct}})
			if status != http.StatusUnsupportedMediaType || !isJSONError(h, answer) {
				t.Errorf("POST %s with Content-Type %q: %d %s, want 415 with a JSON error", path, ct, status, answer)
			}
		}
	}
	if status, _, answer := post("/v1/allow", bodies["/v1/allow"], http.Header{"Content-Type": {"application/json", "text/plain"}}); status != http.StatusUnsupportedMediaType {
		t.Errorf("two Content-Types: %d %s, want 415", status, answer)
	}
	for name, h := range map[string]http.Header{
		"Sec-Fetch-Site cross-site": {"Content-Type": {"application/json"}, "Sec-Fetch-Site": {"cross-site"}},
		"Sec-Fetch-Site same-site":  {"Sec-Fetch-Site": {"same-site"}},
		"another Origin":            {"Content-Type": {"application/json"}, "Origin": {"http://attacker.example"}},
	} {
		for path, body := range bodies {
			if status, hdr, answer := post(path, body, h); status != http.StatusForbidden || !isJSONError(hdr, answer) {
				t.Errorf("POST %s, %s: %d %s, want 403 with a JSON error", path, name, status, answer)
			}
		}
	}
	// Nothing above consumed anything: three units are left for these three decisions.
	for i, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON ;charset=UTF-8"} {
		status, _, answer := post("/v1/allow", bodies["/v1/allow"], http.Header{"Content-Type": {ct}})
		if status != http.StatusOK || !strings.Contains(answer, `"remaining":`+string(rune('2'-i))) {
			t.Errorf("POST /v1/allow with Content-Type %q: %d %s, want 200 with %d remaining", ct, status, answer, 2-i)
		}
	}
	if status, _, answer := post("/v1/allow", bodies["/v1/allow"], http.Header{"Sec-Fetch-Site": {"same-origin"}}); status != http.StatusTooManyRequests {
		t.Errorf("POST /v1/allow without Content-Type: %d %s, want 429 (decided: the allowance is spent)", status, answer)
	}
	// A path that does not exist is one, whatever the type.
	if status, _, answer := post("/nope", "", http.Header{"Content-Type": {"text/plain"}}); status != http.StatusNotFound {
		t.Errorf("POST /nope: %d %s, want 404", status, answer)
	}
}
