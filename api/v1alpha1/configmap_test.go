package v1alpha1

import (
	"flag"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/golden")

// normalised returns what RenderConfigMapData keeps of p: name, namespace, generation and the
// defaulted spec.
func normalised(p *RateLimitPolicy) *RateLimitPolicy {
	n := &RateLimitPolicy{Spec: *p.Spec.DeepCopy()}
	n.Name, n.Namespace, n.Generation = p.Name, p.Namespace, p.Generation
	if n.Namespace == "" {
		n.Namespace = DefaultNamespace
	}
	n.Default()
	return n
}

// withServerFields returns a copy of p with the fields the API server and the operator set,
// which a rendering must leave out.
func withServerFields(p *RateLimitPolicy) *RateLimitPolicy {
	p = p.DeepCopy()
	p.TypeMeta = metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: Kind}
	p.UID = "6f1c1c5e-0000-4000-8000-000000000000"
	p.ResourceVersion = "12345"
	p.CreationTimestamp = metav1.Unix(1700000000, 0)
	p.Labels = map[string]string{"app": "api"}
	p.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{}"}
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	p.Finalizers = []string{"limiterd.dev/configmap"}
	p.Status = RateLimitPolicyStatus{ObservedGeneration: 2, ConfigMapName: "rlp-x", TierCount: 1,
		Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Rendered",
			LastTransitionTime: metav1.Unix(1700000000, 0)}}}
	return p
}

type renderCase struct {
	name string
	p    *RateLimitPolicy
}

func renderCases(t *testing.T) []renderCase {
	var cases []renderCase
	add := func(name string, data []byte) {
		ps, err := DecodePolicies(data)
		if err != nil || len(ps) != 1 {
			t.Fatalf("%s: %d policies, %v", name, len(ps), err)
		}
		ps[0].Generation = 3
		cases = append(cases, renderCase{name, &ps[0]})
	}
	for _, tc := range loadTestCases(t, "valid") {
		add(tc.Name, tc.Data)
	}
	sample, err := os.ReadFile("../../config/samples/ratelimitpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	add("sample", sample)
	cases = append(cases, renderCase{"server-fields", withServerFields(cases[len(cases)-1].p)})
	return cases
}

func TestRenderConfigMapDataGolden(t *testing.T) {
	for _, tc := range renderCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.p.DeepCopy()
			data, err := RenderConfigMapData(tc.p)
			if err != nil {
				t.Fatalf("RenderConfigMapData: %v", err)
			}
			if !equality.Semantic.DeepEqual(before, tc.p) {
				t.Errorf("RenderConfigMapData modified the policy")
			}
			if len(data) != 2 || data[ConfigMapGenerationKey] != "3" {
				t.Errorf("data keys %d, generation %q; want 2 keys, generation 3", len(data), data[ConfigMapGenerationKey])
			}
			golden := filepath.Join("testdata", "golden", tc.name+".yaml")
			if *update {
				if err := os.WriteFile(golden, []byte(data[ConfigMapDataKey]), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./api/v1alpha1 -run Golden -update to create it)", err)
			}
			if got := data[ConfigMapDataKey]; got != string(want) {
				t.Errorf("rendered %s differs from %s (-update rewrites it):\n%s", ConfigMapDataKey, golden, got)
			}
			again, err := RenderConfigMapData(tc.p.DeepCopy())
			if err != nil || !equality.Semantic.DeepEqual(again, data) {
				t.Errorf("a second rendering differs: %v", err)
			}
		})
	}
}

func TestRenderLeavesOutServerFields(t *testing.T) {
	p := withServerFields(validPolicy())
	data, err := RenderConfigMapData(p)
	if err != nil {
		t.Fatal(err)
	}
	doc := data[ConfigMapDataKey]
	for _, s := range []string{"status", "uid", "resourceVersion", "managedFields", "creationTimestamp",
		"labels", "annotations", "finalizers", "Ready", "12345"} {
		if strings.Contains(doc, s) {
			t.Errorf("rendered policy contains %q:\n%s", s, doc)
		}
	}
}

func TestConfigMapRoundTrip(t *testing.T) {
	for _, tc := range renderCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			data, err := RenderConfigMapData(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseConfigMapData(ConfigMapName(tc.p.ID()), data)
			if err != nil {
				t.Fatalf("ParseConfigMapData: %v", err)
			}
			want := normalised(tc.p)
			want.TypeMeta = metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: Kind}
			if !equality.Semantic.DeepEqual(want, got) {
				t.Errorf("round trip changed the policy:\nwant %+v\ngot  %+v", want, got)
			}
			again, err := RenderConfigMapData(got)
			if err != nil || !equality.Semantic.DeepEqual(again, data) {
				t.Errorf("rendering the parsed policy differs: %v", err)
			}
		})
	}
}

func TestRenderConfigMapDataErrors(t *testing.T) {
	invalid := validPolicy()
	invalid.Spec.DefaultTier = "gold"
	if _, err := RenderConfigMapData(invalid); err == nil || !strings.Contains(err.Error(), "spec.defaultTier") {
		t.Errorf("RenderConfigMapData(invalid) = %v, want an error naming spec.defaultTier", err)
	}
	if _, err := RenderConfigMapData(nil); err == nil {
		t.Error("RenderConfigMapData(nil) succeeded")
	}

	// The largest valid policy does not fit a ConfigMap: 1024 keys of 1024 bytes.
	big := validPolicy()
	big.Spec.Overrides = nil
	for i := range 4 {
		o := Override{Tier: "pro"}
		for j := range MaxClientsPerOverride {
			key := strings.Repeat("k", MaxClientKeyBytes-8) + strings.Repeat("0", 4) + string(rune('a'+i)) + string(rune('a'+j/26%26)) + string(rune('a'+j%26)) + "z"
			if i < 2 {
				o.Clients = append(o.Clients, key)
			} else {
				o.ClientPrefixes = append(o.ClientPrefixes, key)
			}
		}
		big.Spec.Overrides = append(big.Spec.Overrides, o)
	}
	if err := Validate(big); err != nil {
		t.Fatalf("the big policy should be valid: %v", err)
	}
	if _, err := RenderConfigMapData(big); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("RenderConfigMapData(too big) = %v, want a size error", err)
	}
	// Half of it fits.
	big.Spec.Overrides = big.Spec.Overrides[1:3]
	if _, err := RenderConfigMapData(big); err != nil {
		t.Errorf("RenderConfigMapData(half) = %v", err)
	}
}

func TestParseConfigMapDataErrors(t *testing.T) {
	good, err := RenderConfigMapData(validPolicy())
	if err != nil {
		t.Fatal(err)
	}
	with := func(k, v string) map[string]string {
		d := map[string]string{ConfigMapDataKey: good[ConfigMapDataKey], ConfigMapGenerationKey: good[ConfigMapGenerationKey]}
		d[k] = v
		return d
	}
	without := func(k string) map[string]string {
		d := with(k, "")
		delete(d, k)
		return d
	}
	doc := good[ConfigMapDataKey]
	name := ConfigMapName(NewPolicyID("ns", "p"))
	tests := []struct {
		name      string
		configMap string
		data      map[string]string
		want      string
	}{
		{"no ConfigMap name", "", good, "ConfigMap name is empty"},
		{"ConfigMap of the policy's legacy name", LegacyConfigMapName("p"), good, "policy ns/p belongs in ConfigMap rlp-ns.p, not rlp-p"},
		{"ConfigMap of a policy of another namespace", ConfigMapName(NewPolicyID("other", "p")), good, "belongs in ConfigMap rlp-ns.p, not rlp-other.p"},
		{"ConfigMap of another policy", ConfigMapName(NewPolicyID("ns", "q")), good, "belongs in ConfigMap rlp-ns.p, not rlp-ns.q"},
		{"unknown key", name, with("extra", "x"), `unknown keys "extra"`},
		{"no policy", name, without(ConfigMapDataKey), `"policy.yaml" is missing`},
		{"no generation", name, without(ConfigMapGenerationKey), `"generation" is missing`},
		{"generation not a number", name, with(ConfigMapGenerationKey, "x"), "is not a generation"},
		{"generation negative", name, with(ConfigMapGenerationKey, "-1"), "is not a generation"},
		{"generation not canonical", name, with(ConfigMapGenerationKey, "00"), "is not a generation"},
		{"generation mismatch", name, with(ConfigMapGenerationKey, "4"), "has generation 0"},
		{"two policies", name, with(ConfigMapDataKey, doc+"---\n"+strings.Replace(doc, "name: p", "name: q", 1)), "holds 2 policies"},
		{"no policies", name, with(ConfigMapDataKey, "# nothing\n"), "holds 0 policies"},
		{"invalid policy", name, with(ConfigMapDataKey, strings.Replace(doc, "defaultTier: free", "defaultTier: gold", 1)), "spec.defaultTier"},
		{"unknown field", name, with(ConfigMapDataKey, doc+"status: {}\nextra: 1\n"), `unknown field "extra"`},
		{"too large", name, with(ConfigMapDataKey, doc+"#"+strings.Repeat("x", MaxConfigMapDataBytes)), "bytes, more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseConfigMapData(tt.configMap, tt.data)
			if err == nil {
				t.Fatalf("ParseConfigMapData accepted it: %+v", p)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
	if _, err := ParseConfigMapData(name, good); err != nil {
		t.Errorf("ParseConfigMapData(good) = %v", err)
	}
}

// TestConfigMapName checks that the ConfigMap names of policy IDs are valid names, tell every
// two IDs apart across namespaces and names of every length, and keep the namespace and name
// readable when they fit.
func TestConfigMapName(t *testing.T) {
	if got := ConfigMapName(NewPolicyID("shop", "public-api")); got != "rlp-shop.public-api" {
		t.Errorf("ConfigMapName(shop/public-api) = %q, want rlp-shop.public-api", got)
	}
	// A namespace has no '.': the first '.' ends it, so these do not collide.
	for _, pair := range [][2]PolicyID{
		{NewPolicyID("a", "b.c"), NewPolicyID("a-b", "c")},
		{NewPolicyID("a", "b.c"), NewPolicyID("ab", "c")},
		{NewPolicyID("team", "x"), NewPolicyID("team-x", "x")},
	} {
		if ConfigMapName(pair[0]) == ConfigMapName(pair[1]) {
			t.Errorf("ConfigMapName(%s) = ConfigMapName(%s) = %q", pair[0], pair[1], ConfigMapName(pair[0]))
		}
	}
	longNS := strings.Repeat("n", 63)
	seen := map[string]PolicyID{}
	positions := []int{170, 171, 172, 231, 232, 233, 45, 46, 47}
	for _, ns := range []string{"a", "team-a", longNS} {
		for n := 1; n <= 253; n++ {
			// Under -short (make test-unit): every seventh length, those within 2 of a position
			// changed below, and the longest.
			if testing.Short() && n%7 != 0 && n < 250 &&
				!slices.ContainsFunc(positions, func(at int) bool { return n >= at-2 && n <= at+2 }) {
				continue
			}
			for _, c := range []byte{'a', '.', '-'} {
				for _, at := range append([]int{n - 1, n - 2}, positions...) {
					b := []byte(strings.Repeat("a", n))
					if at > 0 && at < n-1 && (c == 'a' || b[at-1] != '.' && b[at+1] != '.') {
						b[at] = c
					}
					id := NewPolicyID(ns, string(b))
					if _, err := ParsePolicyID(id.String()); err != nil {
						continue
					}
					cm := ConfigMapName(id)
					if errs := validation.IsDNS1123Subdomain(cm); len(errs) > 0 {
						t.Fatalf("ConfigMapName(%s) = %q: %v", id, cm, errs)
					}
					if full := "rlp-" + id.Namespace() + "." + id.Name(); len(full) <= 253 && cm != full {
						t.Fatalf("ConfigMapName(%s) = %q, want %s", id, cm, full)
					}
					if !strings.HasPrefix(cm, "rlp-"+ns+".") {
						t.Fatalf("ConfigMapName(%s) = %q does not start with its namespace", id, cm)
					}
					if other, ok := seen[cm]; ok && other != id {
						t.Fatalf("ConfigMapName(%s) = ConfigMapName(%s) = %q", id, other, cm)
					}
					seen[cm] = id
				}
			}
		}
	}
}

// TestLegacyConfigMapName checks the names earlier versions gave ConfigMaps in the policies'
// namespaces, which the operator deletes by them, and the policy label values.
func TestLegacyConfigMapName(t *testing.T) {
	if got := LegacyConfigMapName("public-api"); got != "rlp-public-api" {
		t.Errorf("LegacyConfigMapName(public-api) = %q, want rlp-public-api", got)
	}
	if got := PolicyLabelValue("public-api"); got != "public-api" {
		t.Errorf("PolicyLabelValue(public-api) = %q, want public-api", got)
	}
	// Names of every length, with '.' and '-' at every place around where they are cut.
	seenName := map[string]string{}
	seenLabel := map[string]string{}
	for n := 1; n <= 253; n++ {
		for _, c := range []byte{'a', '.', '-'} {
			for _, at := range []int{n - 1, n - 2, 231, 232, 233, 45, 46, 47} {
				b := []byte(strings.Repeat("a", n))
				if at > 0 && at < n-1 && (c == 'a' || b[at-1] != '.' && b[at+1] != '.') {
					b[at] = c
				}
				name := string(b)
				if len(validation.IsDNS1123Subdomain(name)) > 0 {
					continue
				}
				cm := LegacyConfigMapName(name)
				if errs := validation.IsDNS1123Subdomain(cm); len(errs) > 0 {
					t.Fatalf("LegacyConfigMapName(%q) = %q: %v", name, cm, errs)
				}
				if len(name) <= 249 && cm != "rlp-"+name {
					t.Fatalf("LegacyConfigMapName(%q) = %q, want rlp-%s", name, cm, name)
				}
				if other, ok := seenName[cm]; ok && other != name {
					t.Fatalf("LegacyConfigMapName(%q) = LegacyConfigMapName(%q) = %q", name, other, cm)
				}
				seenName[cm] = name
				lv := PolicyLabelValue(name)
				if errs := validation.IsValidLabelValue(lv); len(errs) > 0 {
					t.Fatalf("PolicyLabelValue(%q) = %q: %v", name, lv, errs)
				}
				if other, ok := seenLabel[lv]; ok && other != name {
					t.Fatalf("PolicyLabelValue(%q) = PolicyLabelValue(%q) = %q", name, other, lv)
				}
				seenLabel[lv] = name
			}
		}
	}
}

// TestConfigMapRoundTripAwkwardKeys checks client keys that YAML could misread if the rendering
// did not quote or escape them.
func TestConfigMapRoundTripAwkwardKeys(t *testing.T) {
	keys := []string{"null", "~", "true", "yes", "1_000", "0x10", "1e3", ".inf", "- a", "#a", "a #b", ": a",
		" lead", "trail ", "ls\u2028ps\u2029", "bom\ufeff", "\ufffd", "\U0010fffd", "\ufdd0", "'q'", `"dq"`, "{a: b}", "[a]", "&anchor", "*alias", "!tag", "%dir", "@at", "`tick`",
		"---", "...", "ключ", "🔑", "\u00a0nbsp"}
	p := validPolicy()
	p.Spec.Overrides = []Override{{Tier: "pro", Clients: keys, ClientPrefixes: keys}}
	data, err := RenderConfigMapData(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseConfigMapData(ConfigMapName(p.ID()), data)
	if err != nil {
		t.Fatalf("ParseConfigMapData: %v\n%s", err, data[ConfigMapDataKey])
	}
	if !equality.Semantic.DeepEqual(got.Spec.Overrides, p.Spec.Overrides) {
		t.Errorf("keys changed in the round trip:\nwant %q\ngot  %q", p.Spec.Overrides[0].Clients, got.Spec.Overrides[0].Clients)
	}
}

// TestConfigMapRoundTripEveryCharacter checks that every character a client key may contain
// survives rendering and parsing, and that Validate rejects the others.
func TestConfigMapRoundTripEveryCharacter(t *testing.T) {
	var keys []string
	flush := func() {
		p := validPolicy()
		half := len(keys) / 2
		p.Spec.Overrides = []Override{{Tier: "pro", Clients: keys[:half]}, {Tier: "pro", Clients: keys[half:]}}
		data, err := RenderConfigMapData(p)
		if err != nil {
			t.Fatalf("RenderConfigMapData: %v", err)
		}
		got, err := ParseConfigMapData(ConfigMapName(p.ID()), data)
		if err != nil {
			t.Fatalf("ParseConfigMapData: %v", err)
		}
		if !equality.Semantic.DeepEqual(got.Spec.Overrides, p.Spec.Overrides) {
			t.Fatalf("keys changed in the round trip: %q", keys)
		}
		keys = keys[:0]
	}
	for r := range sweptRunes() {
		if r > 0xFFFF && r%61 != 0 && r&0xFFFE != 0xFFFE {
			continue // sample the astral planes
		}
		key := "a" + string(r)
		if forbiddenInKey(r) {
			p := validPolicy()
			p.Spec.Overrides[0].Clients = []string{key}
			if err := Validate(p); err == nil || !namesField(err, "spec.overrides[0].clients[0]") {
				t.Errorf("Validate accepted the client key %q: %v", key, err)
			}
			continue
		}
		keys = append(keys, key)
		if len(keys) == MaxOverrideClients {
			flush()
		}
	}
	flush()
}

// sweptRunes yields the characters a sweep over every character checks: every Unicode scalar
// value (the surrogates are not characters), or under -short (make test-unit) a sample that
// keeps every control character, the Latin ranges, U+FFF0-U+FFFF, the ends of each plane, and
// one in 97 of the rest.
func sweptRunes() iter.Seq[rune] {
	return func(yield func(rune) bool) {
		for r := rune(0); r <= unicode.MaxRune; r++ {
			if r >= 0xD800 && r <= 0xDFFF {
				continue
			}
			if testing.Short() && r > 0x7FF && r%97 != 0 && (r < 0xFFF0 || r > 0xFFFF) && r&0xFFFE != 0xFFFE {
				continue
			}
			if !yield(r) {
				return
			}
		}
	}
}
