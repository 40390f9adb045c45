package extauthz_test

import (
	"encoding/base64"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// TestCheckJWTClaim: over ext_authz a JWTClaim source reads the authorization header Envoy
// reports: a subject has its own budget, and a malformed token is INVALID_ARGUMENT 400 that
// charges nothing.
func TestCheckJWTClaim(t *testing.T) {
	g := &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Claim: "sub"}}}
	e := testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("api", g))
	c := dial(t, e)
	enc := base64.RawURLEncoding.EncodeToString
	bearer := func(payload string) map[string]string {
		return map[string]string{"authorization": "Bearer " + enc([]byte(`{"alg":"ES256"}`)) + "." + enc([]byte(payload)) + ".c2ln"}
	}
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		if r := do(t, c, check("api", "10.0.0.1", bearer(`{"sub":"alice"}`))); r.code != want {
			t.Errorf("alice, check %d: %v %d, want %v", i, r.code, r.status, want)
		}
	}
	if r := do(t, c, check("api", "10.0.0.1", bearer(`{"sub":"bob"}`))); r.code != codes.OK {
		t.Errorf("bob: %v %d, want OK: his own budget", r.code, r.status)
	}
	r := do(t, c, check("api", "10.0.0.1", bearer(`{"sub":"carol","sub":"bob"}`)))
	if r.code != codes.InvalidArgument || r.status != 400 || r.body != `{"error":"authorization: malformed JWT: want three base64url segments whose payload is a JSON object (in UTF-8) naming each name of the claim's path at most once"}`+"\n" {
		t.Errorf("duplicate sub: %v %d %q, want INVALID_ARGUMENT 400 malformed JWT", r.code, r.status, r.body)
	}
	for _, key := range []string{"jwt:authorization:sub:bob", "jwt:authorization:sub:carol"} {
		if res, err := e.Peek(t.Context(), "default/api", key); err != nil || res.Remaining != map[string]int64{"jwt:authorization:sub:bob": 1, "jwt:authorization:sub:carol": 2}[key] {
			t.Errorf("%s has %d left (%v): a refused check charged it", key, res.Remaining, err)
		}
	}
}
