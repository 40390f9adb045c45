package v1alpha1

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
