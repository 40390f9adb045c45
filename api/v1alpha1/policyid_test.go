package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestNewPolicyID(t *testing.T) {
	for _, tc := range []struct {
		namespace, name string
		want            PolicyID
	}{
		{"team", "api", "team/api"},
		{"", "api", "default/api"},
	} {
		id := NewPolicyID(tc.namespace, tc.name)
		if id != tc.want {
			t.Errorf("NewPolicyID(%q, %q) = %q, want %q", tc.namespace, tc.name, id, tc.want)
		}
		if id.String() != string(tc.want) || id.Name() != tc.name || id.Namespace() != tc.want.Namespace() {
			t.Errorf("%q: String %q, Namespace %q, Name %q", id, id.String(), id.Namespace(), id.Name())
		}
	}
	p := &RateLimitPolicy{}
	p.Name = "api"
	if got := p.ID(); got != "default/api" {
		t.Errorf("ID of a policy without namespace = %q, want default/api", got)
	}
}

func TestRequestedPolicyID(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want PolicyID
	}{
		{"", ""},
		{"api", "default/api"},
		{"edge/api", "edge/api"},
		{"default/api", "default/api"},
		{"/api", "/api"},       // looked up as given: names no policy
		{"a/b/c", "a/b/c"},     // likewise
		{"API", "default/API"}, // likewise: no valid policy is named API
	} {
		if got := RequestedPolicyID(tc.s); got != tc.want {
			t.Errorf("RequestedPolicyID(%q) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

func TestParsePolicyID(t *testing.T) {
	for _, s := range []string{"default/api", "team-a/api.v2", "a/" + strings.Repeat("b", 253), strings.Repeat("a", 63) + "/b"} {
		id, err := ParsePolicyID(s)
		if err != nil || id.String() != s {
			t.Errorf("ParsePolicyID(%q) = %q, %v; want it back", s, id, err)
		}
	}
	for _, s := range []string{"", "api", "/api", "default/", "/", "a/b/c", "Default/api", "default/API",
		"de fault/api", strings.Repeat("a", 64) + "/b", "a/" + strings.Repeat("b", 254), "a.b/c"} {
		if id, err := ParsePolicyID(s); err == nil {
			t.Errorf("ParsePolicyID(%q) = %q, want an error", s, id)
		}
	}
}

// FuzzParsePolicyID checks that what ParsePolicyID accepts is exactly a valid policy's ID: the
// namespace and name Validate accepts, rebuilt by NewPolicyID into the same string.
func FuzzParsePolicyID(f *testing.F) {
	for _, s := range []string{"default/api", "team-a/api.v2", "api", "/api", "a/b/c", "A/b", "a/-b", "a/b."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParsePolicyID(s)
		p := &RateLimitPolicy{}
		p.Namespace, p.Name, _ = strings.Cut(s, "/")
		valid := strings.Count(s, "/") == 1 && p.Namespace != "" && len(validateMetadata(p, field.NewPath("metadata"))) == 0
		if err != nil {
			if valid {
				t.Fatalf("ParsePolicyID(%q) = %v, but namespace %q and name %q are valid", s, err, p.Namespace, p.Name)
			}
			return
		}
		if !valid {
			t.Fatalf("ParsePolicyID(%q) accepted an ID whose policy is invalid", s)
		}
		if id.String() != s || NewPolicyID(id.Namespace(), id.Name()) != id || p.ID() != id {
			t.Fatalf("ParsePolicyID(%q) = %q (namespace %q, name %q) does not round-trip", s, id, id.Namespace(), id.Name())
		}
	})
}
