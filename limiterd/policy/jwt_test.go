package policy_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// jwtHeader is the header segment of the test tokens: {"alg":"HS256","typ":"JWT"}.
var jwtHeader = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))

// token returns a JWS compact token of payload, with signature sig (base64url).
func token(payload, sig string) string {
	return jwtHeader + "." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." + sig
}

func bearer(payload string) http.Header {
	return http.Header{"Authorization": {"Bearer " + token(payload, "c2lnbmF0dXJl")}}
}

func TestJWTClaimKeys(t *testing.T) {
	sub := []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Claim: "sub"}, {Type: v1alpha1.KeySourceClientAddress}}
	claim := func(c string) []v1alpha1.KeySource {
		return []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Claim: c}, {Type: v1alpha1.KeySourceClientAddress}}
	}
	claimPath := func(names ...string) []v1alpha1.KeySource {
		return []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, ClaimPath: names}, {Type: v1alpha1.KeySourceClientAddress}}
	}
	idToken := []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Header: "x-id-TOKEN", Claim: "sub"}}
	malformed := func(v string) http.Header { return http.Header{"Authorization": {v}} }
	const next = "ip:10.1.2.3" // the key of the source after the JWTClaim one
	for _, tc := range []struct {
		name    string
		sources []v1alpha1.KeySource
		header  http.Header
		want    string // "" for none
		err     error
	}{
		{"sub", sub, bearer(`{"sub":"alice","iat":1}`), "jwt:authorization:sub:alice", nil},
		{"scheme in any case, spaces", sub, malformed("bEARER   " + token(`{"sub":"alice"}`, "")), "jwt:authorization:sub:alice", nil},
		{"white space around the payload", sub, bearer(" \t\r\n{ \"sub\" : \"alice\" }\n"), "jwt:authorization:sub:alice", nil},
		{"empty signature", sub, malformed("Bearer " + token(`{"sub":"alice"}`, "")), "jwt:authorization:sub:alice", nil},
		{"header absent: the next source", sub, http.Header{}, next, nil},
		{"header empty: the next source", sub, malformed(""), next, nil},
		{"another scheme: the next source", sub, malformed("Basic YWxpY2U6cHc="), next, nil},
		{"a scheme alone: the next source", sub, malformed("Bearerish"), next, nil},
		{"claim absent", sub, bearer(`{"aud":"api"}`), next, nil},
		{"claim empty", sub, bearer(`{"sub":""}`), next, nil},
		{"claim null", sub, bearer(`{"sub":null}`), next, nil},
		{"claim true", sub, bearer(`{"sub":true}`), next, nil},
		{"claim an object", sub, bearer(`{"sub":{"id":"alice"}}`), next, nil},
		{"claim an array", sub, bearer(`{"sub":["alice","bob"]}`), next, nil},
		{"claim a fraction", claim("uid"), bearer(`{"uid":4.0}`), next, nil},
		{"claim an exponent", claim("uid"), bearer(`{"uid":4e2}`), next, nil},
		{"claim an integer", claim("uid"), bearer(`{"uid":12345678901234567890123}`), "jwt:authorization:uid:12345678901234567890123", nil},
		{"claim a negative integer", claim("uid"), bearer(`{"uid":-7}`), "jwt:authorization:uid:-7", nil},
		{"escapes decoded", sub, bearer(`{"sub":"a\u00e9\ud83d\ude00\n\"\/"}`), "jwt:authorization:sub:aé😀\n\"/", nil},
		{"lone surrogate as U+FFFD", sub, bearer(`{"sub":"a\ud800b"}`), "jwt:authorization:sub:a\uFFFDb", nil},
		{"lone surrogate before an escape", sub, bearer(`{"sub":"\ud800\u0041\udc00\ud83d\ude00"}`), "jwt:authorization:sub:\uFFFDA\uFFFD😀", nil},
		{"escaped name", sub, bearer(`{"s\u0075b":"alice"}`), "jwt:authorization:sub:alice", nil},
		{"nested claim", claim("org.id"), bearer(`{"sub":"a","org":{"name":"x","id":"acme"}}`), "jwt:authorization:org.id:acme", nil},
		{"nested claim under a string", claim("org.id"), bearer(`{"org":"acme"}`), next, nil},
		{"nested claim absent", claim("org.id"), bearer(`{"org":{"name":"acme"}}`), next, nil},
		{"path's parent name elsewhere", claim("org.id"), bearer(`{"id":"x","team":{"org":{"id":"y"}}}`), next, nil},
		{"another header: the whole value", idToken, http.Header{"X-Id-Token": {token(`{"sub":"bob"}`, "AA")}}, "jwt:x-id-token:sub:bob", nil},
		{"another header with a scheme", idToken, http.Header{"X-Id-Token": {"Bearer " + token(`{"sub":"bob"}`, "AA")}}, "", policy.ErrMalformedJWT},
		{"other names may repeat", sub, bearer(`{"aud":"a","aud":"b","sub":"alice","x":{"sub":1,"sub":2}}`), "jwt:authorization:sub:alice", nil},

		// claimPath: exact names, ':' and '.' in them escaped in the key.
		{"claimPath URI name", claimPath("https://example.com/tenant"), bearer(`{"sub":"a","https://example.com/tenant":"acme"}`), "jwt:authorization:https%3A//example%2Ecom/tenant:acme", nil},
		{"claimPath URI name escaped in the token", claimPath("https://example.com/tenant"), bearer(`{"https:\/\/example.com\/tenant":"acme"}`), "jwt:authorization:https%3A//example%2Ecom/tenant:acme", nil},
		{"claimPath URN name", claimPath("urn:acme:org"), bearer(`{"urn:acme:org":42}`), "jwt:authorization:urn%3Aacme%3Aorg:42", nil},
		{"claimPath cognito name", claimPath("cognito:username"), bearer(`{"cognito:username":"alice","username":"bob"}`), "jwt:authorization:cognito%3Ausername:alice", nil},
		{"claimPath nested", claimPath("org", "id"), bearer(`{"sub":"a","org":{"name":"x","id":"acme"}}`), "jwt:authorization:org.id:acme", nil},
		{"claimPath nested URN", claimPath("realm_access", "urn:acme:org"), bearer(`{"realm_access":{"urn:acme:org":"acme"}}`), "jwt:authorization:realm_access.urn%3Aacme%3Aorg:acme", nil},
		{"claimPath 4 deep", claimPath("a", "b:c", "d", "e"), bearer(`{"a":{"b:c":{"d":{"e":"x"}}}}`), "jwt:authorization:a.b%3Ac.d.e:x", nil},
		{"claimPath dotted name is one name", claimPath("a.b"), bearer(`{"a":{"b":"nested"},"a.b":"top"}`), "jwt:authorization:a%2Eb:top", nil},
		{"claim dotted path is nested", claim("a.b"), bearer(`{"a":{"b":"nested"},"a.b":"top"}`), "jwt:authorization:a.b:nested", nil},
		{"claimPath dotted name absent", claimPath("a.b"), bearer(`{"a":{"b":"nested"}}`), next, nil},
		{"claimPath name's prefix", claimPath("urn:acme"), bearer(`{"urn":"acme:x","urn:acme:org":"y"}`), next, nil},
		{"claimPath duplicate URI claim", claimPath("https://example.com/tenant"), bearer(`{"https://example.com/tenant":"a","https:\/\/example.com/tenant":"b"}`), "", policy.ErrMalformedJWT},

		// The attacker's tokens: refused, never keyed.
		{"duplicate claim", sub, bearer(`{"sub":"alice","sub":"bob"}`), "", policy.ErrMalformedJWT},
		{"duplicate claim, escaped", sub, bearer(`{"sub":"alice","s\u0075b":"bob"}`), "", policy.ErrMalformedJWT},
		{"duplicate claim of another type", sub, bearer(`{"sub":{},"sub":"bob"}`), "", policy.ErrMalformedJWT},
		{"duplicate parent", claim("org.id"), bearer(`{"org":{"id":"a"},"org":{"id":"b"}}`), "", policy.ErrMalformedJWT},
		{"duplicate nested claim", claim("org.id"), bearer(`{"org":{"id":"a","id":"b"}}`), "", policy.ErrMalformedJWT},
		{"bearer without a token", sub, malformed("Bearer"), "", policy.ErrMalformedJWT},
		{"two segments", sub, malformed("Bearer " + jwtHeader + ".e30"), "", policy.ErrMalformedJWT},
		{"four segments", sub, malformed("Bearer " + token(`{"sub":"a"}`, "AA") + ".AA"), "", policy.ErrMalformedJWT},
		{"an encrypted token (five segments)", sub, malformed("Bearer " + jwtHeader + ".AA.AA.AA.AA"), "", policy.ErrMalformedJWT},
		{"empty header segment", sub, malformed("Bearer ." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"a"}`)) + ".AA"), "", policy.ErrMalformedJWT},
		{"empty payload", sub, malformed("Bearer " + jwtHeader + "..AA"), "", policy.ErrMalformedJWT},
		{"padding", sub, malformed("Bearer " + jwtHeader + "." + base64.URLEncoding.EncodeToString([]byte(`{"sub":"abc"}`)) + ".AA"), "", policy.ErrMalformedJWT},
		{"standard base64", sub, malformed("Bearer " + jwtHeader + "." + base64.RawStdEncoding.EncodeToString([]byte(`{"sub":"???>>>"}`)) + ".AA"), "", policy.ErrMalformedJWT},
		{"payload of 4k+1 characters", sub, malformed("Bearer " + jwtHeader + ".e30AA.AA"), "", policy.ErrMalformedJWT},
		{"signature of 4k+1 characters", sub, malformed("Bearer " + token(`{"sub":"a"}`, "AAAAA")), "", policy.ErrMalformedJWT},
		{"payload an array", sub, bearer(`[{"sub":"alice"}]`), "", policy.ErrMalformedJWT},
		{"payload a string", sub, bearer(`"sub"`), "", policy.ErrMalformedJWT},
		{"payload followed by more", sub, bearer(`{"sub":"alice"}{"sub":"bob"}`), "", policy.ErrMalformedJWT},
		{"payload cut short", sub, bearer(`{"sub":"alice"`), "", policy.ErrMalformedJWT},
		{"payload invalid UTF-8", sub, bearer("{\"sub\":\"al\xffice\"}"), "", policy.ErrMalformedJWT},
		{"payload invalid UTF-8 off the path", sub, bearer("{\"iss\":[\"\xff\"],\"sub\":\"alice\"}"), "", policy.ErrMalformedJWT},
		{"payload bad escape", sub, bearer(`{"sub":"a\x"}`), "", policy.ErrMalformedJWT},
		{"payload control character", sub, bearer("{\"sub\":\"a\tb\"}"), "", policy.ErrMalformedJWT},
		{"payload leading zero", claim("uid"), bearer(`{"uid":01}`), "", policy.ErrMalformedJWT},
		{"payload trailing comma", sub, bearer(`{"sub":"a",}`), "", policy.ErrMalformedJWT},
		{"payload bad literal", sub, bearer(`{"x":nul,"sub":"a"}`), "", policy.ErrMalformedJWT},
		{"malformed after the claim", sub, bearer(`{"sub":"alice","x":[1,]}`), "", policy.ErrMalformedJWT},
		{"huge token", sub, malformed("Bearer " + token(`{"sub":"`+strings.Repeat("a", 3100)+`"}`, "AA")), "", policy.ErrHeaderTooLarge},
		{"repeated header", sub, http.Header{"Authorization": {"Bearer " + token(`{"sub":"a"}`, ""), "Bearer " + token(`{"sub":"b"}`, "")}}, "", policy.ErrHeaderRepeated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: tc.sources}).Gateway
			key, ok, err := x.AppendKey(nil, &policy.ForwardedRequest{Header: tc.header, Peer: netip.MustParseAddr("10.1.2.3")})
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if ok != (tc.want != "") || string(key) != tc.want {
				t.Errorf("key %q (%v), want %q", key, ok, tc.want)
			}
			// An Envoy ext_authz check carrying the same header gets the same answer.
			headers := map[string]string{}
			for k, v := range tc.header {
				headers[strings.ToLower(k)] = strings.Join(v, ",")
			}
			ck, cok, cerr := x.AppendKey(nil, &policy.ForwardedRequest{Peer: netip.MustParseAddr("10.1.2.3"),
				Checked: &policy.CheckedRequest{Headers: headers}})
			if errors.Is(tc.err, policy.ErrHeaderRepeated) { // Envoy joins a repeated header with commas
				tc.err = policy.ErrMalformedJWT
			}
			if !errors.Is(cerr, tc.err) || string(ck) != tc.want || cok != ok {
				t.Errorf("ext_authz: key %q (%v) %v, want %q %v", ck, cok, cerr, tc.want, tc.err)
			}
		})
	}
}

// TestJWTSignatureNotRead: limiterd does not check signatures (the gateway does), so the same
// claims under any signature are the same client.
func TestJWTSignatureNotRead(t *testing.T) {
	x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Claim: "sub"}}}).Gateway
	for _, sig := range []string{"", "AA", "c2lnbmF0dXJl", strings.Repeat("_-", 100)} {
		key, ok, err := x.AppendKey(nil, &policy.ForwardedRequest{Header: http.Header{"Authorization": {"Bearer " + token(`{"sub":"alice"}`, sig)}}})
		if err != nil || !ok || string(key) != "jwt:authorization:sub:alice" {
			t.Errorf("signature %q: key %q %v %v", sig, key, ok, err)
		}
	}
}

// TestJWTClaimKeysDoNotCollide: the key names the claim's path unambiguously. Each pair is two
// different claims, and a token of a client for each, in one policy (the first source's claim
// absent from the second token, so that the second source keys it): written into the key as
// they are (names joined by '.', then ':' and the value), the two keys would be equal, and the
// two clients would share one budget. Each gets its own key.
func TestJWTClaimKeysDoNotCollide(t *testing.T) {
	type read struct {
		source  v1alpha1.KeySource
		payload string
	}
	path := func(names ...string) v1alpha1.KeySource {
		return v1alpha1.KeySource{Type: v1alpha1.KeySourceJWTClaim, ClaimPath: names}
	}
	dotted := func(claim string) v1alpha1.KeySource {
		return v1alpha1.KeySource{Type: v1alpha1.KeySourceJWTClaim, Claim: claim}
	}
	for _, pair := range [][2]read{
		{{path("urn"), `{"urn":"acme:x"}`}, {path("urn:acme"), `{"urn:acme":"x"}`}},
		{{path("urn:a"), `{"urn:a":"b:x"}`}, {path("urn:a:b"), `{"urn:a:b":"x"}`}},
		{{path("a"), `{"a":"b.c:x"}`}, {path("a:b", "c"), `{"a:b":{"c":"x"}}`}},
		{{path("a.b"), `{"a.b":"x"}`}, {dotted("a.b"), `{"a":{"b":"x"}}`}},
		{{path("a.b"), `{"a.b":"x"}`}, {path("a", "b"), `{"a":{"b":"x"}}`}},
		{{path("a", "b.c"), `{"a":{"b.c":"x"}}`}, {path("a.b", "c"), `{"a.b":{"c":"x"}}`}},
	} {
		x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{pair[0].source, pair[1].source}}).Gateway
		var keys [2]string
		for i, r := range pair {
			key, ok, err := x.AppendKey(nil, &policy.ForwardedRequest{Header: bearer(r.payload)})
			if err != nil || !ok {
				t.Fatalf("%s: key %q %v %v", r.payload, key, ok, err)
			}
			keys[i] = string(key)
		}
		if keys[0] == keys[1] {
			t.Errorf("%+v and %+v: both clients keyed %q", pair[0], pair[1], keys[0])
		}
	}
}

// TestJWTClaimAndClaimPathAreOneClaim: claim "org.id" and claimPath [org, id] name one claim,
// read the same way into the same key, so that a policy may move from one to the other without
// its clients' budgets or overrides changing.
func TestJWTClaimAndClaimPathAreOneClaim(t *testing.T) {
	for _, c := range []struct {
		claim string
		path  []string
	}{{"sub", []string{"sub"}}, {"org.id", []string{"org", "id"}}, {"a.b.c.d", []string{"a", "b", "c", "d"}}} {
		byClaim := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Claim: c.claim}}}).Gateway
		byPath := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, ClaimPath: c.path}}}).Gateway
		for _, payload := range []string{benchJWTPayload, `{"sub":7,"org":{"id":"acme"},"a":{"b":{"c":{"d":"x"}}}}`,
			`{"org":{"id":"a","id":"b"}}`, `{"sub":"a","sub":"b"}`, `{"a":{"b":1}}`} {
			r := &policy.ForwardedRequest{Header: bearer(payload)}
			k1, ok1, err1 := byClaim.AppendKey(nil, r)
			k2, ok2, err2 := byPath.AppendKey(nil, r)
			if string(k1) != string(k2) || ok1 != ok2 || !errors.Is(err2, errors.Unwrap(err1)) {
				t.Errorf("%s in %s: claim %q %v %v, claimPath %q %v %v", c.claim, payload, k1, ok1, err1, k2, ok2, err2)
			}
		}
	}
}

// TestJWTClaimPathCostIsBounded: what a claimPath makes limiterd do per request is bounded by
// the header's bound, whatever the token: a payload of the largest size the header admits,
// built to cost the most (members whose names differ from the path's 128-character names in the
// last character only, an array nested as deep as it fits beside the path, the claim last) is
// read without allocating, and a token over the bound is refused before it is decoded. The
// path's own bounds (4 names of 128 characters) are the API's (TestValidateClaimPath).
func TestJWTClaimPathCostIsBounded(t *testing.T) {
	names, payload, depth := worstClaimPath()
	if depth < 100 || len(bearer(payload)["Authorization"][0]) > v1alpha1.MaxGatewayHeaderBytes {
		t.Fatalf("payload of %d bytes nested %d deep: too small a worst case, or too large", len(payload), depth)
	}
	x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, ClaimPath: names}}}).Gateway
	r := &policy.ForwardedRequest{Header: bearer(payload)}
	buf := make([]byte, 0, 1024)
	key, ok, err := x.AppendKey(buf[:0], r)
	want := "jwt:authorization:" + strings.ReplaceAll(strings.Join(names, "."), ":", "%3A") + ":x"
	if err != nil || !ok || string(key) != want {
		t.Fatalf("key %q %v %v, want %q", key, ok, err, want)
	}
	if n := testing.AllocsPerRun(20, func() { _, _, _ = x.AppendKey(buf[:0], r) }); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
	// Two more bytes of payload (white space, which would be valid) and the header is over its
	// bound: refused, not read.
	over := &policy.ForwardedRequest{Header: bearer(payload + "  ")}
	if _, _, err := x.AppendKey(nil, over); !errors.Is(err, policy.ErrHeaderTooLarge) {
		t.Errorf("a payload over the bound: %v, want %v", err, policy.ErrHeaderTooLarge)
	}
}

// worstClaimPath returns the longest claimPath the API admits, and the payload of the largest
// token the header's bound admits that costs it the most to read: members whose names differ from
// the path's 128-character names in their last character only, an array nested as deep as the
// rest of the bound allows (depth), the claim last.
func worstClaimPath() (names []string, payload string, depth int) {
	names = make([]string, v1alpha1.MaxClaimDepth)
	for i := range names {
		names[i] = strings.Repeat(string(rune('a'+i)), v1alpha1.MaxClaimLength-1) + ":"
	}
	claim := `"` + names[0] + `":{"` + names[1] + `":{"` + names[2] + `":{"` + names[3] + `":"x"}}}`
	decoys := strings.Repeat(`"`+names[0][:len(names[0])-1]+`!":{"`+names[1]+`":0},`, 6)
	nested := func(depth int) string {
		return `{` + decoys + `"d":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `,` + claim + `}`
	}
	for len(bearer(nested(depth + 1))["Authorization"][0]) <= v1alpha1.MaxGatewayHeaderBytes {
		depth++
	}
	return names, nested(depth), depth
}

func TestJWTKeyExtractionAllocatesNothing(t *testing.T) {
	buf := make([]byte, 0, 256)
	for _, src := range []v1alpha1.KeySource{
		{Type: v1alpha1.KeySourceJWTClaim, Claim: "sub"},
		{Type: v1alpha1.KeySourceJWTClaim, ClaimPath: []string{"https://example.com/tenant"}},
	} {
		x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{src}}).Gateway
		for _, payload := range []string{benchJWTPayload, benchJWTPayloadURIClaim, `{"sub":"\u00e9l\u00e8ve","https:\/\/example.com\/tenant":"acme"}`} {
			r := &policy.ForwardedRequest{Header: bearer(payload)}
			if n := testing.AllocsPerRun(100, func() { _, _, _ = x.AppendKey(buf[:0], r) }); n != 0 {
				t.Errorf("%+v, %s: %v allocations, want 0", src, payload, n)
			}
		}
	}
}

// benchJWTPayload is the payload of a typical access token of an identity provider.
const benchJWTPayload = `{"iss":"https://id.example.com/realms/main","sub":"f3b1c2d4-5e6f-4a7b-8c9d-0e1f2a3b4c5d",` +
	`"aud":["api","account"],"exp":1767225600,"iat":1767222000,"jti":"0f9e8d7c-6b5a-4938-2716-a5b4c3d2e1f0",` +
	`"azp":"web","scope":"openid profile email","email_verified":true,"org":{"id":"acme","roles":["admin","dev"]}}`

// benchJWTPayloadURIClaim is benchJWTPayload with a claim named by a URI, as some identity
// providers namespace their custom claims.
var benchJWTPayloadURIClaim = benchJWTPayload[:len(benchJWTPayload)-1] + `,"https://example.com/tenant":"acme"}`

func BenchmarkJWTKeyExtraction(b *testing.B) {
	worstNames, worstPayload, _ := worstClaimPath()
	rs256 := strings.Repeat("Q", 342) // an RS256 signature is 342 characters
	for _, bc := range []struct {
		name, payload, sig string
		source             v1alpha1.KeySource
	}{
		{"Sub", benchJWTPayload, rs256, v1alpha1.KeySource{Claim: "sub"}},
		{"NestedOrgID", benchJWTPayload, rs256, v1alpha1.KeySource{Claim: "org.id"}},
		{"ClaimPathURI", benchJWTPayloadURIClaim, rs256, v1alpha1.KeySource{ClaimPath: []string{"https://example.com/tenant"}}},
		// The largest token the header admits, of the signature worstClaimPath sized it with.
		{"ClaimPathWorstCase", worstPayload, "c2lnbmF0dXJl", v1alpha1.KeySource{ClaimPath: worstNames}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bc.source.Type = v1alpha1.KeySourceJWTClaim
			x := gatewayPolicy(b, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{bc.source}}).Gateway
			h := http.Header{"Authorization": {"Bearer " + token(bc.payload, bc.sig)}, "User-Agent": {"curl/8"}}
			r := &policy.ForwardedRequest{Header: h, Method: http.MethodGet}
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			for b.Loop() {
				var ok bool
				buf, ok, _ = x.AppendKey(buf[:0], r)
				if !ok {
					b.Fatal("no key")
				}
			}
		})
	}
}

// fuzzClaims are the claims FuzzJWTClaim looks up: by claim (a dotted path), or by claimPath
// (exact names, with '.' and ':' in them).
var fuzzClaims = []v1alpha1.KeySource{
	{Claim: "sub"}, {Claim: "a"}, {Claim: "a.b"}, {Claim: "a.b.c"}, {Claim: "org.id"}, {Claim: "x-y_Z0"},
	{ClaimPath: []string{"a.b"}}, {ClaimPath: []string{"https://example.com/t"}}, {ClaimPath: []string{"urn:a", "b"}},
	{ClaimPath: []string{"a", "b:c", "d", "e"}}, {ClaimPath: []string{"a", "b"}},
}

// FuzzJWTClaim holds the JWTClaim source to an oracle built of encoding/base64 and
// encoding/json: the token is three segments that RawURLEncoding decodes (the first two
// non-empty), the payload is one JSON value that encoding/json reads, an object, in valid
// UTF-8, and no object on the claim's path names its next name twice; the key is then the
// value encoding/json decodes, when it is a non-empty string or an integer, after the claim's
// path written with its own escaping of '%', '.' and ':'.
func FuzzJWTClaim(f *testing.F) {
	for _, p := range []string{
		`{"sub":"alice"}`, `{"sub":1}`, `{"sub":-0}`, `{"sub":1.5}`, `{"sub":"a","sub":"b"}`, `{"a":{"b":{"c":"d"}}}`,
		`{"a":{"b":[1,{"c":2}],"b ":3}}`, `{"org":{"id":"x"},"x":{"org":1,"org":2}}`, `{"s\u0075b":"\ud800\udc00\ud800"}`,
		`{"sub":"x"} `, `{"sub":"x"}}`, "{\"sub\":\"\xff\"}", `[]`, `{}`, `{"a":tru}`, `{"x-y_Z0":"\/\b\f"}`,
		`{"sub":"\u0000"}`, `{"a":{"b":"c"},"a":1}`, `{"sub":[`,
	} {
		f.Add([]byte(p), "c2ln", uint8(0))
		f.Add([]byte(p), "", uint8(3))
	}
	for sel, p := range map[uint8]string{
		6: `{"a":{"b":"n"},"a.b":"t"}`, 7: `{"https:\/\/example.com\/t":"x","https://example.com/t":"y"}`,
		8: `{"urn":{"a":{"b":1}},"urn:a":{"b":-2}}`, 9: `{"a":{"b:c":{"d":{"e":"x"}}}}`, 10: `{"a":{"b":"x","b":"y"}}`,
	} {
		f.Add([]byte(p), "", sel)
	}
	f.Add([]byte(`{"sub":"a"}`), jwtHeader+".e30.AA", uint8(0x80))
	f.Add([]byte(nil), jwtHeader+"..", uint8(0x80))
	f.Add([]byte(nil), jwtHeader+".eyJzdWIiOiJhIn0=.", uint8(0x80))
	f.Add([]byte(nil), "eyJ\n.e30.AA", uint8(0x81))
	f.Fuzz(func(t *testing.T, payload []byte, sig string, sel uint8) {
		src := fuzzClaims[int(sel&0x7f)%len(fuzzClaims)]
		src.Type, src.Header = v1alpha1.KeySourceJWTClaim, "X-Token"
		path := src.ClaimPath
		if src.Claim != "" {
			path = strings.Split(src.Claim, ".")
		}
		tok := sig // the whole token
		if sel&0x80 == 0 {
			tok = jwtHeader + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + sig
		}
		x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{src}}).Gateway
		key, ok, err := x.AppendKey(nil, &policy.ForwardedRequest{Header: http.Header{"X-Token": {tok}}})

		want, wantOK, wantErr := oracleJWTClaim(tok, path)
		if !errors.Is(err, wantErr) || ok != wantOK || string(key) != want {
			t.Fatalf("token %q claim %q: key %q %v %v, want %q %v %v", tok, path, key, ok, err, want, wantOK, wantErr)
		}
	})
}

// claimNameEscaper writes a name of a claim's path as a key does.
var claimNameEscaper = strings.NewReplacer("%", "%25", ".", "%2E", ":", "%3A")

// oracleClaimKeyName is how a key writes the claim's path names: each escaped, joined by '.'.
func oracleClaimKeyName(names []string) string {
	escaped := make([]string, len(names))
	for i, n := range names {
		escaped[i] = claimNameEscaper.Replace(n)
	}
	return strings.Join(escaped, ".")
}

// oracleJWTClaim is what FuzzJWTClaim expects of a JWTClaim source on header X-Token reading
// the claim at names.
func oracleJWTClaim(tok string, names []string) (string, bool, error) {
	switch {
	case len(tok) > v1alpha1.MaxGatewayHeaderBytes:
		return "", false, policy.ErrHeaderTooLarge
	case tok == "":
		return "", false, nil
	}
	segs := strings.Split(tok, ".")
	if len(segs) != 3 || segs[0] == "" || segs[1] == "" || strings.ContainsAny(tok, "\r\n") {
		return "", false, policy.ErrMalformedJWT
	}
	var payload []byte
	for i, s := range segs {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			return "", false, policy.ErrMalformedJWT
		}
		if i == 1 {
			payload = b
		}
	}
	if !utf8.Valid(payload) {
		return "", false, policy.ErrMalformedJWT
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	v, err := readOrdered(dec)
	if err != nil {
		return "", false, policy.ErrMalformedJWT
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", false, policy.ErrMalformedJWT // more after the value
	}
	obj, isObj := v.(ordered)
	if !isObj {
		return "", false, policy.ErrMalformedJWT
	}
	var found any
	for i, name := range names {
		var matches []any
		for _, m := range obj {
			if m.name == name {
				matches = append(matches, m.value)
			}
		}
		switch {
		case len(matches) > 1:
			return "", false, policy.ErrMalformedJWT
		case len(matches) == 0:
			return "", false, nil
		}
		if i == len(names)-1 {
			found = matches[0]
			break
		}
		if obj, isObj = matches[0].(ordered); !isObj {
			return "", false, nil
		}
	}
	prefix := "jwt:x-token:" + oracleClaimKeyName(names) + ":"
	switch c := found.(type) {
	case string:
		if c != "" {
			return prefix + c, true, nil
		}
	case json.Number:
		if !strings.ContainsAny(string(c), ".eE") {
			return prefix + string(c), true, nil
		}
	}
	return "", false, nil
}

// ordered is a JSON object as its members in order, repeated names kept.
type ordered []member

type member struct {
	name  string
	value any
}

// readOrdered reads the next JSON value of dec, objects as ordered.
func readOrdered(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		var o ordered
		for dec.More() {
			nt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := readOrdered(dec)
			if err != nil {
				return nil, err
			}
			o = append(o, member{nt.(string), v})
		}
		_, err := dec.Token() // '}'
		return o, err
	case json.Delim('['):
		var a []any
		for dec.More() {
			v, err := readOrdered(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token() // ']'
		return a, err
	}
	return t, nil
}

// FuzzJWTClaimKeysNeverCollide: two claimPath sources, each reading a value from its own
// client's token, yield the same key only when they read the same path and the same value: no
// choice of claim names (by the policy) or of values (by whoever the gateway issued the token
// to) makes two clients share a key. And the key can be read back: the path's names, escaped
// and joined by '.', end at the first ':' after the header. Names are given joined by '|',
// which no name holds; a path the API refuses is skipped.
func FuzzJWTClaimKeysNeverCollide(f *testing.F) {
	for _, c := range [][4]string{
		{"urn", "urn:acme", "acme:x", "x"}, {"a", "a:b|c", "b.c:x", "x"}, {"a.b", "a|b", "x", "x"},
		{"a|b.c", "a.b|c", "x", "x"}, {"https://e.com/t", "https:|e.com/t", "x", "x"}, {"a", "a", "x", "x"},
		{"urn:a", "urn:a:b", "b:x", "x"}, {"a%", "a", "x", "x"}, {"a", "a", "x", "y"},
	} {
		f.Add(c[0], c[1], c[2], c[3])
	}
	f.Fuzz(func(t *testing.T, path1, path2, value1, value2 string) {
		var keys [2]string
		for i, c := range [2]struct{ path, value string }{{path1, value1}, {path2, value2}} {
			names := strings.Split(c.path, "|")
			p := &v1alpha1.RateLimitPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "gw"},
				Spec: v1alpha1.RateLimitPolicySpec{
					DefaultTier: "all",
					Tiers:       []v1alpha1.Tier{{Name: "all", Algorithm: v1alpha1.AlgorithmUnlimited}},
					Gateway:     &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, ClaimPath: names}}},
				},
			}
			if v1alpha1.Validate(p) != nil || c.value == "" || !utf8.ValidString(c.value) {
				t.Skip()
			}
			compiled, err := policy.Compile(p)
			if err != nil {
				t.Fatal(err)
			}
			var claims any = c.value
			for j := len(names) - 1; j >= 0; j-- {
				claims = map[string]any{names[j]: claims}
			}
			payload, err := json.Marshal(claims)
			if err != nil {
				t.Fatal(err)
			}
			key, ok, err := compiled.Gateway.AppendKey(nil, &policy.ForwardedRequest{Header: bearer(string(payload))})
			if err != nil || !ok {
				t.Fatalf("%q in %s: key %q %v %v", names, payload, key, ok, err)
			}
			keys[i] = string(key)
			// Read the key back: its path, to the first ':' after the header, unescaped.
			rest, found := strings.CutPrefix(keys[i], "jwt:authorization:")
			written, value, cut := strings.Cut(rest, ":")
			var back []string
			for _, n := range strings.Split(written, ".") {
				n, err := url.PathUnescape(n)
				if err != nil {
					t.Fatalf("key %q: %v", keys[i], err)
				}
				back = append(back, n)
			}
			if !found || !cut || value != c.value || !slices.Equal(back, names) {
				t.Fatalf("key %q reads back as path %q and value %q, want %q and %q", keys[i], back, value, names, c.value)
			}
		}
		same := path1 == path2 && value1 == value2
		if (keys[0] == keys[1]) != same {
			t.Fatalf("paths %q %q, values %q %q: keys %q and %q", path1, path2, value1, value2, keys[0], keys[1])
		}
	})
}
