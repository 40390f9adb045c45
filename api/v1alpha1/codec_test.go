package v1alpha1

import (
	"os"
	"strings"
	"testing"
	"time"
)

const docA = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: a
spec:
  defaultTier: free
  tiers:
    - name: free
      algorithm: TokenBucket
      tokenBucket: {capacity: 10, refillRate: 1}
`

const docB = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: b
  namespace: team
spec:
  defaultTier: all
  tiers: [{name: all, algorithm: Unlimited}]
  failureMode: Closed
`

func TestDecodePolicies(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // namespace/name of the policies
	}{
		{"empty", "", nil},
		{"only comments and separators", "# nothing\n---\n---\n# more\n", nil},
		{"one", docA, []string{"default/a"}},
		{"two with empty documents", "---\n" + docA + "---\n# empty\n---\nnull\n---\n" + docB, []string{"default/a", "team/b"}},
		{"same name in two namespaces", docA + "---\n" + strings.Replace(docA, "name: a", "name: a\n  namespace: other", 1),
			[]string{"default/a", "other/a"}},
		{"JSON object", `{"apiVersion":"limiterd.dev/v1alpha1","kind":"RateLimitPolicy","metadata":{"name":"j"},
			"spec":{"defaultTier":"x","tiers":[{"name":"x","algorithm":"Unlimited"}]}}`, []string{"default/j"}},
		{"JSON stream", `{"apiVersion":"limiterd.dev/v1alpha1","kind":"RateLimitPolicy","metadata":{"name":"j"},
			"spec":{"defaultTier":"x","tiers":[{"name":"x","algorithm":"Unlimited"}]}}
			null
			{"apiVersion":"limiterd.dev/v1alpha1","kind":"RateLimitPolicy","metadata":{"name":"k"},
			"spec":{"defaultTier":"x","tiers":[{"name":"x","algorithm":"Unlimited"}]}}`, []string{"default/j", "default/k"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := DecodePolicies([]byte(tt.in))
			if err != nil {
				t.Fatalf("DecodePolicies: %v", err)
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.Namespace+"/"+p.Name)
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("policies %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDecodePoliciesDefaults(t *testing.T) {
	ps, err := DecodePolicies([]byte(docA + "---\n" + docB))
	if err != nil {
		t.Fatal(err)
	}
	if p := ps[0].Spec.Tiers[0].TokenBucket.RefillPeriod; p == nil || p.Duration != time.Second {
		t.Errorf("refillPeriod = %v, want the default 1s", p)
	}
	if ps[0].Spec.FailureMode != FailureModeOpen || ps[1].Spec.FailureMode != FailureModeClosed {
		t.Errorf("failureModes %q, %q; want Open (default), Closed", ps[0].Spec.FailureMode, ps[1].Spec.FailureMode)
	}
}

func TestDecodePoliciesErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // substrings of the error
	}{
		{"unknown field", strings.Replace(docA, "  defaultTier: free", "  defaultTier: free\n  burst: 3", 1),
			[]string{"document 1 (default/a)", `unknown field "spec.burst"`}},
		{"unknown top-level field", docA + "extra: 1\n", []string{"document 1 (default/a)", `unknown field "extra"`}},
		{"field of the wrong case", strings.Replace(docA, "defaultTier", "defaulttier", 1),
			[]string{"document 1 (default/a)", `unknown field "spec.defaulttier"`}},
		{"duplicate field", strings.Replace(docA, "  defaultTier: free", "  defaultTier: free\n  defaultTier: free", 1),
			[]string{"document 1", "already set"}},
		{"wrong apiVersion", strings.Replace(docA, "limiterd.dev/v1alpha1", "limiterd.dev/v1", 1),
			[]string{"document 1 (default/a)", `apiVersion "limiterd.dev/v1"`}},
		{"wrong kind", strings.Replace(docA, "kind: RateLimitPolicy", "kind: ConfigMap", 1),
			[]string{"document 1 (default/a)", `kind "ConfigMap"`}},
		{"no type", "metadata: {name: a}\nspec: {}\n", []string{"document 1 (default/a)", `apiVersion ""`}},
		{"invalid second document, empty ones not counted", docA + "---\n---\n" + strings.Replace(docB, "Closed", "Shut", 1),
			[]string{"document 2 (team/b)", "spec.failureMode: Unsupported value"}},
		{"duplicate namespace and name", docA + "---\n" + strings.Replace(docA, "name: a", "name: a\n  namespace: default", 1),
			[]string{"document 2 (default/a)", "document 1"}},
		{"a string where a number goes", strings.Replace(docA, "capacity: 10", `capacity: "10"`, 1),
			[]string{"document 1 (default/a)", "capacity"}},
		{"a fraction where an integer goes", strings.Replace(docA, "capacity: 10", `capacity: 10.5`, 1),
			[]string{"document 1 (default/a)", "capacity"}},
		{"bad duration", strings.Replace(docA, "refillRate: 1}", "refillRate: 1, refillPeriod: 1d}", 1),
			[]string{"document 1 (default/a)", "1d"}},
		{"a scalar", "hello\n", []string{"document 1"}},
		{"a list", "- a\n- b\n", []string{"document 1"}},
		{"bad YAML", docA + "---\nkey: [unclosed\n", []string{"document 2", "invalid YAML"}},
		{"bad separator", docA + "--- x\n", []string{"document 1", "separator"}},
		{"bad JSON", `{"apiVersion": `, []string{"document 1", "invalid YAML"}},
		{"JSON of another type", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}`,
			[]string{"document 1 (default/c)", `kind "ConfigMap"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := DecodePolicies([]byte(tt.in))
			if err == nil {
				t.Fatalf("DecodePolicies accepted it: %+v", ps)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestSamplePolicy checks the sample that `make run` serves.
func TestSamplePolicy(t *testing.T) {
	data, err := os.ReadFile("../../config/samples/ratelimitpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ps, err := DecodePolicies(data)
	if err != nil {
		t.Fatalf("DecodePolicies: %v", err)
	}
	if len(ps) != 1 {
		t.Fatalf("%d policies, want 1", len(ps))
	}
	p := ps[0]
	if p.Namespace != DefaultNamespace {
		t.Errorf("namespace %q, want %q", p.Namespace, DefaultNamespace)
	}
	algorithms := map[Algorithm]int{}
	dryRun, stacked := 0, 0
	for _, tier := range p.Spec.Tiers {
		if len(tier.Limits) > 0 {
			stacked++
		} else {
			algorithms[tier.Algorithm]++
		}
		if tier.DryRun {
			dryRun++
		}
	}
	if len(algorithms) != 3 || dryRun == 0 || stacked == 0 {
		t.Errorf("the sample should show every algorithm, a dry-run tier and stacked limits; has %v, %d dry-run, %d stacked",
			algorithms, dryRun, stacked)
	}
	clients, prefixes := 0, 0
	for _, o := range p.Spec.Overrides {
		clients += len(o.Clients)
		prefixes += len(o.ClientPrefixes)
	}
	if clients == 0 || prefixes == 0 {
		t.Errorf("the sample should show overrides by client and by prefix; has %d, %d", clients, prefixes)
	}
}
