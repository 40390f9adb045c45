package policy_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

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

func TestJWTKeyExtractionAllocatesNothing(t *testing.T) {
	x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Claim: "sub"}}}).Gateway
	buf := make([]byte, 0, 256)
	for _, payload := range []string{benchJWTPayload, `{"sub":"\u00e9l\u00e8ve"}`} {
		r := &policy.ForwardedRequest{Header: bearer(payload)}
		if n := testing.AllocsPerRun(100, func() { _, _, _ = x.AppendKey(buf[:0], r) }); n != 0 {
			t.Errorf("%s: %v allocations, want 0", payload, n)
		}
	}
}

// benchJWTPayload is the payload of a typical access token of an identity provider.
const benchJWTPayload = `{"iss":"https://id.example.com/realms/main","sub":"f3b1c2d4-5e6f-4a7b-8c9d-0e1f2a3b4c5d",` +
	`"aud":["api","account"],"exp":1767225600,"iat":1767222000,"jti":"0f9e8d7c-6b5a-4938-2716-a5b4c3d2e1f0",` +
	`"azp":"web","scope":"openid profile email","email_verified":true,"org":{"id":"acme","roles":["admin","dev"]}}`

func BenchmarkJWTKeyExtraction(b *testing.B) {
	for _, bc := range []struct{ name, claim string }{{"Sub", "sub"}, {"NestedOrgID", "org.id"}} {
		b.Run(bc.name, func(b *testing.B) {
			x := gatewayPolicy(b, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Claim: bc.claim}}}).Gateway
			// An RS256 signature is 342 characters.
			h := http.Header{"Authorization": {"Bearer " + token(benchJWTPayload, strings.Repeat("Q", 342))}, "User-Agent": {"curl/8"}}
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

// fuzzClaims are the claims FuzzJWTClaim looks up.
var fuzzClaims = []string{"sub", "a", "a.b", "a.b.c", "org.id", "x-y_Z0"}

// FuzzJWTClaim holds the JWTClaim source to an oracle built of encoding/base64 and
// encoding/json: the token is three segments that RawURLEncoding decodes (the first two
// non-empty), the payload is one JSON value that encoding/json reads, an object, in valid
// UTF-8, and no object on the claim's path names its next name twice; the key is then the
// value encoding/json decodes, when it is a non-empty string or an integer.
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
	f.Add([]byte(`{"sub":"a"}`), jwtHeader+".e30.AA", uint8(0x80))
	f.Add([]byte(nil), jwtHeader+"..", uint8(0x80))
	f.Add([]byte(nil), jwtHeader+".eyJzdWIiOiJhIn0=.", uint8(0x80))
	f.Add([]byte(nil), "eyJ\n.e30.AA", uint8(0x81))
	f.Fuzz(func(t *testing.T, payload []byte, sig string, sel uint8) {
		claim := fuzzClaims[int(sel&0x7f)%len(fuzzClaims)]
		tok := sig // the whole token
		if sel&0x80 == 0 {
			tok = jwtHeader + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + sig
		}
		x := gatewayPolicy(t, &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceJWTClaim, Header: "X-Token", Claim: claim}}}).Gateway
		key, ok, err := x.AppendKey(nil, &policy.ForwardedRequest{Header: http.Header{"X-Token": {tok}}})

		want, wantOK, wantErr := oracleJWTClaim(tok, claim)
		if !errors.Is(err, wantErr) || ok != wantOK || string(key) != want {
			t.Fatalf("token %q claim %s: key %q %v %v, want %q %v %v", tok, claim, key, ok, err, want, wantOK, wantErr)
		}
	})
}

// oracleJWTClaim is what FuzzJWTClaim expects of a JWTClaim source on header X-Token.
func oracleJWTClaim(tok, claim string) (string, bool, error) {
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
	names := strings.Split(claim, ".")
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
	prefix := "jwt:x-token:" + claim + ":"
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
