package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
)

// TestDecisionsAllowedHosts: with WithAllowedHosts, a request is answered only if its Host
// (port ignored, in any case) is an IP address literal, localhost or one of the names;
// any other Host, such as a name of an attacker's that resolves to limiterd (DNS rebinding),
// answers 421 with a JSON error naming --allowed-hosts, whatever the method and path, and
// spends nothing. Without the option every Host is answered. Before, there was no check.
func TestDecisionsAllowedHosts(t *testing.T) {
	newHandler := func(opts ...DecisionsOption) http.Handler {
		e := newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 100, 1, time.Hour)))
		return NewDecisions(e, nil, opts...)
	}
	call := func(h http.Handler, method, target, host, body string) answer {
		t.Helper()
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		req.Host = host
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return answer{status: rec.Code, header: rec.Header(), body: rec.Body.String()}
	}
	const allow = "/v1/allow?policy=default/api&key=alice"
	remaining := func(h http.Handler) int64 {
		t.Helper()
		a := call(h, http.MethodGet, allow+"&cost=0", "127.0.0.1", "")
		if a.status != http.StatusOK {
			t.Fatalf("peek: %d %s", a.status, a.body)
		}
		return a.remaining()
	}

	h := newHandler(WithAllowedHosts([]string{"limiterd.shop.svc", "Gateway.Example."}))
	for _, host := range []string{
		"evil.example", "evil.example:8080", "EVIL.example", "limiterd", "limiterd.shop", "sub.limiterd.shop.svc",
		"limiterd.shop.svc.evil.example", "127.0.0.1.nip.io:8080", "localhost.evil.example", "gateway.example.evil",
		"", ":8080", "::1", "[127.0.0.1]", "[::1", "[::1]x", "limiterd.shop.svc:http", "limiterd.shop.svc..", "1.2.3",
		strings.Repeat("a", 300),
	} {
		for _, c := range []struct{ method, target, body string }{
			{http.MethodGet, allow, ""},
			{http.MethodPost, "/v1/allow", `{"policy":"default/api","key":"alice"}`},
			{http.MethodPost, "/v1/allow:batch", `{"items":[{"policy":"default/api","key":"alice"}]}`},
			{http.MethodPost, "/v1/refund", `{"reservation":"x"}`},
			{http.MethodPost, "/v1/release", `{"lease":"x"}`},
			{http.MethodGet, "/nope", ""},
		} {
			a := call(h, c.method, c.target, host, c.body)
			if a.status != http.StatusMisdirectedRequest || !a.isJSONError() || !strings.Contains(a.body, "--allowed-hosts") {
				t.Errorf("%s %s with Host %q: %d %s, want 421 with a JSON error naming --allowed-hosts", c.method, c.target, host, a.status, a.body)
			}
		}
	}
	if got := remaining(h); got != 100 {
		t.Fatalf("after the misdirected requests %d remain, want 100: they spent allowance", got)
	}
	admitted := []string{
		"127.0.0.1", "127.0.0.1:8080", "10.1.2.3:80", "[::1]", "[2001:db8::7]:8080", "[fe80::1%25eth0]:8080",
		"localhost", "LocalHost:8080", "localhost.",
		"limiterd.shop.svc", "Limiterd.Shop.SVC:8080", "limiterd.shop.svc.", "limiterd.shop.svc.:8080", "gateway.example", "GATEWAY.EXAMPLE:443",
	}
	for i, host := range admitted {
		if a := call(h, http.MethodGet, allow, host, ""); a.status != http.StatusOK || a.remaining() != int64(99-i) {
			t.Errorf("GET with Host %q: %d %s, want 200 with %d remaining", host, a.status, a.body, 99-i)
		}
	}
	if a := call(h, http.MethodPost, "/v1/allow", "limiterd.shop.svc:8080", `{"policy":"default/api","key":"alice"}`); a.status != http.StatusOK {
		t.Errorf("POST with a listed Host: %d %s, want 200", a.status, a.body)
	}

	// Without names, IP literals and localhost only.
	h = newHandler(WithAllowedHosts(nil))
	for host, want := range map[string]int{"limiterd.shop.svc": http.StatusMisdirectedRequest, "localhost:8080": http.StatusOK, "[::1]:8080": http.StatusOK, "192.0.2.1": http.StatusOK} {
		if a := call(h, http.MethodGet, allow, host, ""); a.status != want {
			t.Errorf("WithAllowedHosts(nil), Host %q: %d %s, want %d", host, a.status, a.body, want)
		}
	}
	// Without the option, any Host.
	h = newHandler()
	for _, host := range []string{"evil.example", "limiterd.shop.svc:8080", ""} {
		if a := call(h, http.MethodGet, allow, host, ""); a.status != http.StatusOK {
			t.Errorf("no WithAllowedHosts, Host %q: %d %s, want 200", host, a.status, a.body)
		}
	}
}

// TestAllowedHostAllocatesNothing: the Host check allocates nothing, for every form of Host it
// admits and for one it refuses.
func TestAllowedHostAllocatesNothing(t *testing.T) {
	h := NewDecisions(nil, nil, WithAllowedHosts([]string{"limiterd.shop.svc"}))
	for _, host := range []string{"limiterd.shop.svc:8080", "LIMITERD.shop.svc", "10.0.0.7:8080", "[2001:db8::7]:8080", "localhost", "evil.example"} {
		if n := testing.AllocsPerRun(100, func() { _ = h.allowedHost(host) }); n != 0 {
			t.Errorf("allowedHost(%q) allocates %v times", host, n)
		}
	}
}
