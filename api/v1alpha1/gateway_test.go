package v1alpha1

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	schemacel "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

// TestCRDMatchesGatewayLimits checks the CRD's bounds of spec.gateway against the constants
// Validate uses, and its header-name pattern against isToken.
func TestCRDMatchesGatewayLimits(t *testing.T) {
	g := loadCRDSchema(t).prop("spec", "gateway")
	sources := g.prop("keySources")
	if got := sources.num("maxItems"); got != MaxKeySources {
		t.Errorf("CRD keySources maxItems = %d, want %d", got, MaxKeySources)
	}
	src := sources.prop("[]")
	if got := src.prop("header").num("maxLength"); got != MaxHeaderNameLength {
		t.Errorf("CRD header maxLength = %d, want %d", got, MaxHeaderNameLength)
	}
	for _, f := range []struct {
		name string
		max  int64
	}{{"trustedHops", MaxTrustedHops}, {"pathSegments", MaxPathSegments}} {
		if got := src.prop(f.name).num("maximum"); got != f.max {
			t.Errorf("CRD %s maximum = %d, want %d", f.name, got, f.max)
		}
		if got := src.prop(f.name).num("minimum"); got != 0 {
			t.Errorf("CRD %s minimum = %d, want 0", f.name, got)
		}
	}
	if got := g.prop("missingKey")["default"]; got != string(DefaultMissingKey) {
		t.Errorf("CRD missingKey default %v, want %v", got, DefaultMissingKey)
	}
	if got := fmt.Sprint(g.prop("missingKey")["enum"]); got != fmt.Sprint(supportedMissingKeys) {
		t.Errorf("CRD missingKey enum %v, want %v", got, supportedMissingKeys)
	}
	if got := fmt.Sprint(src.prop("type")["enum"]); got != fmt.Sprint(supportedKeySources) {
		t.Errorf("CRD type enum %v, want %v", got, supportedKeySources)
	}
	if got := src.prop("claim").num("maxLength"); got != MaxClaimLength {
		t.Errorf("CRD claim maxLength = %d, want %d", got, MaxClaimLength)
	}
	claimPattern := regexp.MustCompile(src.prop("claim")["pattern"].(string))
	for _, s := range []string{
		"sub", "client_id", "x-tenant", "org.id", "a.b.c.d", "a.b.c.d.e", "", ".", "a.", ".a",
		"a..b", "https://example.com/t", "a b", "a:b", "é", "a.b.c.d.", "A0_-.Z9",
	} {
		if got, want := claimPattern.MatchString(s), isClaimPath(s); got != want {
			t.Errorf("claim %q: CRD pattern matches %v, isClaimPath %v", s, got, want)
		}
	}
	for c := range 256 {
		s := string([]byte{byte(c)})
		if got, want := claimPattern.MatchString(s), isClaimPath(s); got != want {
			t.Errorf("claim %q: CRD pattern matches %v, isClaimPath %v", s, got, want)
		}
	}
	claimPath := src.prop("claimPath")
	if got := claimPath.num("maxItems"); got != MaxClaimDepth {
		t.Errorf("CRD claimPath maxItems = %d, want %d", got, MaxClaimDepth)
	}
	if got := claimPath.num("minItems"); got != 1 {
		t.Errorf("CRD claimPath minItems = %d, want 1", got)
	}
	if got := claimPath.prop("[]").num("maxLength"); got != MaxClaimLength {
		t.Errorf("CRD claimPath item maxLength = %d, want %d", got, MaxClaimLength)
	}
	namePattern := regexp.MustCompile(claimPath.prop("[]")["pattern"].(string))
	for _, s := range []string{
		"sub", "https://example.com/tenant", "urn:acme:org", "cognito:username", "a.b", "-._~:/", "",
		"a b", "a%3Ab", "tenant?x", "a#b", "a,b", "é", "a\b", "a\nb", "a\n",
	} {
		if got, want := namePattern.MatchString(s), isClaimName(s); got != want {
			t.Errorf("claimPath name %q: CRD pattern matches %v, isClaimName %v", s, got, want)
		}
	}
	for c := range 256 {
		s := string([]byte{byte(c)})
		if got, want := namePattern.MatchString(s), isClaimName(s); got != want {
			t.Errorf("claimPath name %q: CRD pattern matches %v, isClaimName %v", s, got, want)
		}
	}
	pattern := regexp.MustCompile(src.prop("header")["pattern"].(string))
	for c := range 256 {
		s := string([]byte{byte(c)})
		if got, want := pattern.MatchString(s), isToken(s); got != want {
			t.Errorf("header %q: CRD pattern matches %v, isToken %v", s, got, want)
		}
	}
}

func TestValidateGatewayDefaultsAndBounds(t *testing.T) {
	hops := func(n int32) *int32 { return &n }
	policy := func(g *Gateway) *RateLimitPolicy {
		return &RateLimitPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "p"},
			Spec: RateLimitPolicySpec{
				Tiers:       []Tier{{Name: "all", Algorithm: AlgorithmUnlimited}},
				DefaultTier: "all",
				Gateway:     g,
			},
		}
	}
	p := policy(&Gateway{KeySources: []KeySource{{Type: KeySourceClientAddress}}})
	p.Default()
	if p.Spec.Gateway.MissingKey != MissingKeyReject {
		t.Errorf("missingKey defaulted to %q, want Reject", p.Spec.Gateway.MissingKey)
	}
	for _, ok := range []KeySource{
		{Type: KeySourceClientAddress, TrustedHops: hops(0)},
		{Type: KeySourceClientAddress, TrustedHops: hops(MaxTrustedHops)},
		{Type: KeySourcePath, PathSegments: MaxPathSegments},
		{Type: KeySourceHeader, Header: "x"},
		{Type: KeySourceJWTClaim, Claim: "sub"},
		{Type: KeySourceJWTClaim, Header: "x", Claim: "sub"},
		{Type: KeySourceJWTClaim, Claim: "a.b.c." + strings.Repeat("d", MaxClaimLength-6)},
	} {
		if ok.Header != "" {
			ok.Header = fmt.Sprintf("%0*d", MaxHeaderNameLength, 7)
		}
		if err := Validate(policy(&Gateway{KeySources: []KeySource{ok}})); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	tooMany := make([]KeySource, MaxKeySources+1)
	for i := range tooMany {
		tooMany[i].Type = KeySourceHost
	}
	if err := Validate(policy(&Gateway{KeySources: tooMany})); err == nil || !namesField(err, "spec.gateway.keySources") {
		t.Errorf("%d key sources: %v", len(tooMany), err)
	}
	long := KeySource{Type: KeySourceJWTClaim, Claim: "a.b.c." + strings.Repeat("d", MaxClaimLength-5)}
	if err := Validate(policy(&Gateway{KeySources: []KeySource{long}})); err == nil || !namesField(err, "spec.gateway.keySources[0].claim") {
		t.Errorf("claim of %d characters: %v", len(long.Claim), err)
	}
}

// claimSourceCases are key sources, as a user writes them, that name a claim by claim or
// claimPath, rightly or not: want is the field an error must name, "" for none.
var claimSourceCases = []struct{ source, want string }{
	{`{"type":"JWTClaim","claimPath":["sub"]}`, ""},
	{`{"type":"JWTClaim","claimPath":["https://example.com/tenant"]}`, ""},
	{`{"type":"JWTClaim","claimPath":["urn:acme:org"]}`, ""},
	{`{"type":"JWTClaim","header":"X-Id-Token","claimPath":["cognito:username"]}`, ""},
	{`{"type":"JWTClaim","claimPath":["org","id"]}`, ""},
	{`{"type":"JWTClaim","claimPath":["realm_access","urn:acme:org","a","b"]}`, ""},
	{`{"type":"JWTClaim","claimPath":["a.b"]}`, ""},
	{`{"type":"JWTClaim","claimPath":["-._~:/"]}`, ""},
	{`{"type":"JWTClaim","claimPath":["` + strings.Repeat(":", MaxClaimLength) + `"]}`, ""},
	{`{"type":"JWTClaim","claim":"org.id"}`, ""},
	{`{"type":"JWTClaim","claim":"sub"}`, ""},

	{`{"type":"JWTClaim","claimPath":[]}`, "claimPath"},
	{`{"type":"JWTClaim","claimPath":["a","b","c","d","e"]}`, "claimPath"},
	{`{"type":"JWTClaim","claimPath":[""]}`, "claimPath[0]"},
	{`{"type":"JWTClaim","claimPath":["org",""]}`, "claimPath[1]"},
	{`{"type":"JWTClaim","claimPath":["` + strings.Repeat("t", MaxClaimLength+1) + `"]}`, "claimPath[0]"},
	{`{"type":"JWTClaim","claimPath":["a b"]}`, "claimPath[0]"},
	{`{"type":"JWTClaim","claimPath":["a%3Ab"]}`, "claimPath[0]"},
	{`{"type":"JWTClaim","claimPath":["tenant?x"]}`, "claimPath[0]"},
	{`{"type":"JWTClaim","claimPath":["\u00e9"]}`, "claimPath[0]"},
	{`{"type":"JWTClaim","claimPath":["a\u0000"]}`, "claimPath[0]"},
	{`{"type":"JWTClaim","claimPath":["sub","a,b"]}`, "claimPath[1]"},
	{`{"type":"JWTClaim","claim":"sub","claimPath":["sub"]}`, "claimPath"},
	{`{"type":"JWTClaim","claim":"org.id","claimPath":["org","id"]}`, "claimPath"},
	{`{"type":"JWTClaim"}`, "claim"},
	{`{"type":"JWTClaim","header":"X-Id-Token"}`, "claim"},
	{`{"type":"JWTClaim","claim":"https://example.com/tenant"}`, "claim"},
	{`{"type":"Header","header":"X-Api-Key","claimPath":["sub"]}`, "claimPath"},
	{`{"type":"ClientAddress","claimPath":["sub"]}`, "claimPath"},
	{`{"type":"Host","claim":"sub"}`, "claim"},
}

// TestValidateClaimPath: Validate admits a claim named by claim or by claimPath (URI and URN
// names, nested paths, up to the bounds), exactly one of the two, and refuses the rest naming the
// field.
func TestValidateClaimPath(t *testing.T) {
	for _, tc := range claimSourceCases {
		t.Run(tc.source, func(t *testing.T) {
			var k KeySource
			if err := json.Unmarshal([]byte(tc.source), &k); err != nil {
				t.Fatal(err)
			}
			p := validPolicy()
			p.Spec.Gateway = &Gateway{KeySources: []KeySource{k}}
			err := Validate(p)
			if tc.want == "" {
				if err != nil {
					t.Errorf("Validate: %v, want it admitted", err)
				}
				return
			}
			if want := "spec.gateway.keySources[0]." + tc.want; err == nil || !namesField(err, want) {
				t.Errorf("Validate: %v, want an error naming %s", err, want)
			}
		})
	}
}

// TestCRDClaimRulesMatchValidate runs the same key sources through the API server's own
// validators of the CRD's keySources item (its OpenAPI schema, and its CEL rules, as
// kube-apiserver runs them): the server must refuse exactly what Validate refuses, naming the
// same field, so that a claimPath the API server admits is one limiterd can read.
func TestCRDClaimRulesMatchValidate(t *testing.T) {
	node := loadCRDSchema(t).prop("spec", "gateway", "keySources", "[]")
	schemaValidator, _, err := apiservervalidation.NewSchemaValidator(internalSchema(t, node))
	if err != nil {
		t.Fatal(err)
	}
	celValidator := schemacel.NewValidator(structuralSchema(t, node), false, celconfig.PerCallLimit)
	if celValidator == nil {
		t.Fatal("the CRD's keySources item has no CEL rule")
	}
	at := field.NewPath("spec", "gateway", "keySources").Index(0)
	for _, tc := range claimSourceCases {
		t.Run(tc.source, func(t *testing.T) {
			var obj map[string]any
			if err := json.Unmarshal([]byte(tc.source), &obj); err != nil {
				t.Fatal(err)
			}
			errs := apiservervalidation.ValidateCustomResource(at, obj, schemaValidator)
			celErrs, _ := celValidator.Validate(t.Context(), at, nil, obj, nil, celconfig.RuntimeCELCostBudget)
			errs = append(errs, celErrs...)
			if tc.want == "" {
				if len(errs) > 0 {
					t.Errorf("the CRD refuses it: %v", errs)
				}
				return
			}
			want := at.String() + "." + tc.want
			named := false
			for _, e := range errs {
				named = named || e.Field == want
			}
			if !named {
				t.Errorf("the CRD: %v, want an error naming %s", errs, want)
			}
		})
	}
}
