package server

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// jwt returns "Bearer <token>" of a token of payload and signature sig (base64url); limiterd
// never checks the signature.
func jwt(payload, sig string) http.Header {
	enc := base64.RawURLEncoding.EncodeToString
	return http.Header{"Authorization": {"Bearer " + enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(payload)) + "." + sig}}
}

func withXFF(h http.Header, v string) http.Header {
	h["X-Forwarded-For"] = []string{v}
	return h
}

// TestForwardAuthJWTClaim: forward-auth requests keyed by the sub claim of their bearer token,
// through the real handler. Each subject has its own budget, whatever the signature; a request
// without a token falls to the next source; a malformed token or a duplicate claim is refused
// (400) and a huge one too (431), charging nothing.
func TestForwardAuthJWTClaim(t *testing.T) {
	g := &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
		{Type: v1alpha1.KeySourceJWTClaim, Claim: "sub"},
		{Type: v1alpha1.KeySourceClientAddress},
	}}
	h := NewDecisions(newEngine(t, testsupport.NewClock(), gatewayPolicy("api", g)), nil)
	const target = "/v1/forward-auth/default/api"
	status := func(header http.Header) int { return forward(t, h, http.MethodGet, target, header).status }

	// alice spends her budget of 2, under two signatures: the same subject, one budget.
	for i, sig := range []string{"c2lnLTE", "b3RoZXI", "eHl6"} {
		if got, want := status(jwt(`{"sub":"alice"}`, sig)), []int{200, 200, 429}[i]; got != want {
			t.Errorf("alice, signature %q: %d, want %d", sig, got, want)
		}
	}
	// bob, on the same address, has his own.
	if got := status(withXFF(jwt(`{"sub":"bob","iat":1}`, "c2lnLTE"), "198.51.100.7")); got != 200 {
		t.Errorf("bob: %d, want 200", got)
	}
	// Without a token (or with another scheme), the client address is the key: its own budget.
	for i, hdr := range []http.Header{xff("198.51.100.7"), withXFF(http.Header{"Authorization": {"Basic YTpi"}}, "198.51.100.7"), xff("198.51.100.7")} {
		if got, want := status(hdr), []int{200, 200, 429}[i]; got != want {
			t.Errorf("no token, request %d: %d, want %d", i, got, want)
		}
	}
	// The attacker's tokens are refused, before anything is charged.
	huge := jwt(`{"sub":"carol","pad":"`+strings.Repeat("x", v1alpha1.MaxGatewayHeaderBytes)+`"}`, "AA")
	for _, tc := range []struct {
		name   string
		header http.Header
		status int
		text   string
	}{
		{"duplicate sub", jwt(`{"sub":"carol","sub":"alice"}`, "AA"), http.StatusBadRequest, "Authorization: " + policy.ErrMalformedJWT.Error()},
		{"not a JWT", http.Header{"Authorization": {"Bearer opaque-token"}}, http.StatusBadRequest, "Authorization: " + policy.ErrMalformedJWT.Error()},
		{"payload no object", jwt(`["carol"]`, "AA"), http.StatusBadRequest, "Authorization: " + policy.ErrMalformedJWT.Error()},
		{"huge token", huge, http.StatusRequestHeaderFieldsTooLarge, "Authorization: header too large"},
	} {
		a := forward(t, h, http.MethodGet, target, withXFF(tc.header, "192.0.2.44"))
		if a.status != tc.status || a.errorText(t) != tc.text {
			t.Errorf("%s: %d %s, want %d %q", tc.name, a.status, a.body, tc.status, tc.text)
		}
	}
	// carol's budget, and her address's, are whole; a claim holding an array or an object is
	// no key, so those requests spend the address's budget.
	if a := forward(t, h, http.MethodGet, target, jwt(`{"sub":"carol"}`, "AA")); a.status != 200 || a.header.Get("RateLimit") != `"standard";r=1;t=60` {
		t.Errorf("carol after refusals: %d RateLimit %q, want her whole budget", a.status, a.header.Get("RateLimit"))
	}
	for i, payload := range []string{`{"sub":["carol"]}`, `{"sub":{"id":"carol"}}`, `{"sub":["dave"]}`} {
		a := forward(t, h, http.MethodGet, target, withXFF(jwt(payload, "AA"), "192.0.2.44"))
		if want := []int{200, 200, 429}[i]; a.status != want {
			t.Errorf("%s: %d, want %d: the address's budget", payload, a.status, want)
		}
	}
}
