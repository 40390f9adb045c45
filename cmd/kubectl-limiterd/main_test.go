package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// testNow is the clock of the tests' decisions: a Tuesday, 22:00 UTC, 23:00 in Paris (UTC+1
// until the end of March), 21 days and 2 hours before the month ends.
var testNow = time.Date(2026, time.March, 10, 22, 0, 0, 0, time.UTC)

const testPolicy = "testdata/policy.yaml"

// runTest runs the plugin at testNow and returns its exit code, stdout and stderr.
func runTest(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := runAt(args, &stdout, &stderr, func() time.Time { return testNow })
	return code, stdout.String(), stderr.String()
}

// explainJSON runs explain -o json and decodes its answer.
func explainJSON(t *testing.T, args ...string) Explanation {
	t.Helper()
	code, stdout, stderr := runTest(t, append([]string{"explain", "-o", "json"}, args...)...)
	if code != 0 || stderr != "" {
		t.Fatalf("explain %v: exit %d, stderr %q", args, code, stderr)
	}
	var x Explanation
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&x); err != nil {
		t.Fatalf("explain %v -o json: %v\n%s", args, err, stdout)
	}
	return x
}

func ptr(v int64) *int64 { return &v }

func TestExplainResolution(t *testing.T) {
	for _, c := range []struct {
		key, tier, rule, field, match string
	}{
		{"someone", "free", "default", "spec.defaultTier", ""},
		{"acme", "pro", "exact", "spec.overrides[0].clients[0]", "acme"},
		{"acme-1", "pro", "prefix", "spec.overrides[0].clientPrefixes[0]", "acme-"},
		// An exact override beats every prefix, acme- included.
		{"acme-batch", "internal", "exact", "spec.overrides[1].clients[0]", "acme-batch"},
		// The longest prefix wins: acme-int over acme-, svc:beta over svc:.
		{"acme-internal-7", "internal", "prefix", "spec.overrides[1].clientPrefixes[1]", "acme-int"},
		{"acme-in", "pro", "prefix", "spec.overrides[0].clientPrefixes[0]", "acme-"},
		{"svc:beta-7", "shadow", "prefix", "spec.overrides[4].clientPrefixes[0]", "svc:beta"},
		{"svc:billing", "internal", "prefix", "spec.overrides[1].clientPrefixes[0]", "svc:"},
		{"team:red", "paid", "exact", "spec.overrides[2].clients[1]", "team:red"},
		{"team:green", "free", "default", "spec.defaultTier", ""},
	} {
		x := explainJSON(t, "-f", testPolicy, c.key)
		if x.Policy != "shop/api" || x.Generation != 4 || x.Key != c.key {
			t.Errorf("%s: policy %s generation %d key %q", c.key, x.Policy, x.Generation, x.Key)
		}
		r := x.Reason
		if x.Tier != c.tier || r.Rule != c.rule || r.Field != c.field || r.Match != c.match {
			t.Errorf("%s: tier %s, rule %s, field %s, match %q; want tier %s, rule %s, field %s, match %q",
				c.key, x.Tier, r.Rule, r.Field, r.Match, c.tier, c.rule, c.field, c.match)
		}
		if !strings.Contains(r.Message, c.rule) || (c.match != "" && !strings.Contains(r.Message, strconv.Quote(c.match))) {
			t.Errorf("%s: message %q does not name the rule and the match", c.key, r.Message)
		}
	}
}

func TestExplainLimitsAndDecision(t *testing.T) {
	t.Run("token bucket", func(t *testing.T) {
		x := explainJSON(t, "-f", testPolicy, "someone", "--cost", "3")
		if len(x.Limits) != 1 || x.Limits[0].Algorithm != "TokenBucket" || x.Limits[0].TokenBucket.Capacity != 10 ||
			x.Limits[0].TokenBucket.RefillPeriod == nil || x.Limits[0].TokenBucket.RefillPeriod.Duration != time.Second {
			t.Fatalf("limits %+v", x.Limits)
		}
		want := Decision{Cost: 3, Allowed: true, Outcome: "Allowed", Limit: ptr(10), Remaining: ptr(7), ResetAfterSeconds: 3}
		checkDecision(t, x.Decision, want)
	})
	t.Run("cost above the limit", func(t *testing.T) {
		x := explainJSON(t, "-f", testPolicy, "someone", "--cost", "11")
		checkDecision(t, x.Decision, Decision{Cost: 11, Outcome: "Rejected", Limit: ptr(10), Remaining: ptr(10), Never: true})
	})
	t.Run("peek", func(t *testing.T) {
		x := explainJSON(t, "-f", testPolicy, "acme", "--cost", "0")
		checkDecision(t, x.Decision, Decision{Cost: 0, Allowed: true, Outcome: "Allowed", Limit: ptr(100), Remaining: ptr(100)})
	})
	t.Run("unlimited", func(t *testing.T) {
		x := explainJSON(t, "-f", testPolicy, "svc:billing", "--cost", "1000000")
		if len(x.Limits) != 0 {
			t.Fatalf("limits of an Unlimited tier: %+v", x.Limits)
		}
		checkDecision(t, x.Decision, Decision{Cost: 1000000, Allowed: true, Outcome: "Allowed"})
	})
	t.Run("quota", func(t *testing.T) {
		x := explainJSON(t, "-f", testPolicy, "daily:1", "--cost", "10")
		if len(x.Limits) != 1 || x.Limits[0].Quota == nil || x.Limits[0].Quota.TimeZone != "Europe/Paris" || x.Limits[0].Quota.Period != "Day" {
			t.Fatalf("limits %+v", x.Limits)
		}
		// Midnight in Paris is an hour away.
		checkDecision(t, x.Decision, Decision{Cost: 10, Allowed: true, Outcome: "Allowed", Limit: ptr(1000), Remaining: ptr(990), ResetAfterSeconds: 3600})
	})
	t.Run("stacked", func(t *testing.T) {
		x := explainJSON(t, "-f", testPolicy, "team:blue", "--cost", "5")
		if len(x.Limits) != 2 || x.Limits[0].Name != "burst" || x.Limits[0].Algorithm != "TokenBucket" ||
			x.Limits[1].Name != "monthly" || x.Limits[1].Algorithm != "Quota" || x.Limits[1].Quota.Limit != 5000 {
			t.Fatalf("limits %+v", x.Limits)
		}
		month := int64(21*86400 + 2*3600)
		checkDecision(t, x.Decision, Decision{Cost: 5, Allowed: true, Outcome: "Allowed", Limit: ptr(20), Remaining: ptr(15), ResetAfterSeconds: 1,
			Binding: "burst", Limits: []LimitDecision{
				{Name: "burst", Allowed: true, Limit: 20, Remaining: 15, ResetAfterSeconds: 1},
				{Name: "monthly", Allowed: true, Limit: 5000, Remaining: 4995, ResetAfterSeconds: month},
			}})
		x = explainJSON(t, "-f", testPolicy, "team:blue", "--cost", "21")
		checkDecision(t, x.Decision, Decision{Cost: 21, Outcome: "Rejected", Limit: ptr(20), Remaining: ptr(20), Never: true,
			Binding: "burst", Limits: []LimitDecision{
				{Name: "burst", Limit: 20, Remaining: 20},
				// Not charged (a stack charges all its limits or none): still fresh.
				{Name: "monthly", Allowed: true, Limit: 5000, Remaining: 5000},
			}})
	})
	t.Run("concurrency", func(t *testing.T) {
		x := explainJSON(t, "-f", testPolicy, "report:1", "--cost", "2")
		if len(x.Limits) != 1 || x.Limits[0].Algorithm != "Concurrency" || x.Limits[0].Concurrency == nil ||
			x.Limits[0].Concurrency.Limit != 3 || x.Limits[0].Concurrency.LeaseTimeout.Duration != 30*time.Second {
			t.Fatalf("limits %+v", x.Limits)
		}
		// Two places held until the lease times out.
		checkDecision(t, x.Decision, Decision{Cost: 2, Allowed: true, Outcome: "Allowed", Limit: ptr(3), Remaining: ptr(1), ResetAfterSeconds: 30})
		_, stdout, _ := runTest(t, "explain", "-f", testPolicy, "report:1")
		if !strings.Contains(stdout, "3 in flight, lease timeout 30s") {
			t.Errorf("concurrency tier's table:\n%s", stdout)
		}
	})
	t.Run("dry run", func(t *testing.T) {
		x := explainJSON(t, "-f", testPolicy, "svc:beta-1", "--cost", "6")
		if !x.DryRun {
			t.Fatal("the shadow tier is not reported as a dry run")
		}
		checkDecision(t, x.Decision, Decision{Cost: 6, Allowed: true, Outcome: "DryRunRejected", Limit: ptr(5), Remaining: ptr(5), Never: true})
	})
}

func checkDecision(t *testing.T, got, want Decision) {
	t.Helper()
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if !bytes.Equal(g, w) {
		t.Errorf("decision\n got %s\nwant %s", g, w)
	}
}

func TestExplainTable(t *testing.T) {
	code, stdout, stderr := runTest(t, "explain", "-f", testPolicy, "team:blue", "--cost", "21")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	lines := strings.Split(stdout, "\n")
	want := [][]string{
		{"POLICY", "KEY", "TIER", "RULE", "FIELD", "COST", "DECISION"},
		{"shop/api", "team:blue", "paid", "exact", "spec.overrides[2].clients[0]", "21", "Rejected", "by", "burst", "(retry:", "never,"},
		nil,
		{"LIMIT", "ALGORITHM", "PARAMETERS", "ALLOWED", "REMAINING", "RESET", "AFTER"},
		{"burst", "TokenBucket", "capacity", "20,", "refill", "10", "per", "1s", "false", "20/20", "0s"},
		{"monthly", "Quota", "5000", "per", "calendar", "month", "(UTC)", "true", "5000/5000", "0s"},
	}
	if len(lines) < len(want) {
		t.Fatalf("table:\n%s", stdout)
	}
	for i, w := range want {
		f := strings.Fields(lines[i])
		if len(f) > len(w) {
			f = f[:len(w)]
		}
		if strings.Join(f, " ") != strings.Join(w, " ") {
			t.Errorf("line %d: %q, want it to start with %q", i, lines[i], strings.Join(w, " "))
		}
	}
	if !strings.Contains(stdout, `Reason: exact override: spec.overrides[2].clients[0] is "team:blue".`) {
		t.Errorf("no reason line:\n%s", stdout)
	}
	// The columns are aligned: each header starts where its values do.
	if strings.Index(lines[0], "TIER") != strings.Index(lines[1], "paid") {
		t.Errorf("columns not aligned:\n%s", stdout)
	}

	_, stdout, _ = runTest(t, "explain", "-f", testPolicy, "svc:x")
	if !strings.Contains(stdout, "Unlimited") || !strings.Contains(stdout, "no limit") {
		t.Errorf("unlimited tier's table:\n%s", stdout)
	}
}

func TestExplainYAML(t *testing.T) {
	code, stdout, stderr := runTest(t, "explain", "-f", testPolicy, "acme-2", "-o", "yaml")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	var x Explanation
	if err := yaml.UnmarshalStrict([]byte(stdout), &x); err != nil {
		t.Fatalf("-o yaml: %v\n%s", err, stdout)
	}
	if x.Tier != "pro" || x.Reason.Match != "acme-" || x.Limits[0].SlidingWindow.Limit != 100 || *x.Decision.Remaining != 99 {
		t.Fatalf("-o yaml: %+v", x)
	}
}

func TestExplainSeveralPolicies(t *testing.T) {
	code, _, stderr := runTest(t, "explain", "-f", "testdata/two.yaml", "k")
	if code != 1 || !strings.Contains(stderr, "holds 3 policies (default/api, shop/api, shop/web): name one") {
		t.Fatalf("no POLICY: exit %d, stderr %q", code, stderr)
	}
	for policy, tier := range map[string]string{"default/api": "small", "shop/api": "big", "web": "web", "shop/web": "web"} {
		x := explainJSON(t, "-f", "testdata/two.yaml", policy, "k")
		if x.Tier != tier {
			t.Errorf("POLICY %s: tier %s, want %s", policy, x.Tier, tier)
		}
	}
	code, _, stderr = runTest(t, "explain", "-f", "testdata/two.yaml", "api", "k")
	if code != 1 || !strings.Contains(stderr, `several policies named "api": name one as NAMESPACE/NAME`) {
		t.Fatalf("ambiguous POLICY: exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runTest(t, "explain", "-f", "testdata/two.yaml", "shop/nope", "k")
	if code != 1 || !strings.Contains(stderr, `holds no policy "shop/nope"; it holds default/api, shop/api, shop/web`) {
		t.Fatalf("unknown POLICY: exit %d, stderr %q", code, stderr)
	}
}

func TestExplainErrors(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, []byte("# nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		args  []string
		wants []string
	}{
		{"invalid file", []string{"-f", "testdata/invalid.yaml", "k"},
			[]string{"testdata/invalid.yaml is not a valid policy file", "document 1 (default/broken)", "spec.defaultTier", "fix the file"}},
		{"missing file", []string{"-f", "testdata/nope.yaml", "k"}, []string{"read the policy file", "nope.yaml"}},
		{"no policy in the file", []string{"-f", empty, "k"}, []string{"holds no RateLimitPolicy"}},
		{"unknown output", []string{"-f", testPolicy, "k", "-o", "xml"},
			[]string{`output format "xml", allowed formats are: json,yaml`, "See 'kubectl limiterd explain --help' for usage."}},
		{"no file", []string{"shop/api", "k"}, []string{"give it with -f FILENAME", "not supported yet"}},
		{"negative cost", []string{"-f", testPolicy, "k", "--cost", "-1"}, []string{"--cost must be 0 or more"}},
		{"cost not a number", []string{"-f", testPolicy, "k", "--cost", "many"}, []string{`invalid argument "many"`, "See 'kubectl limiterd explain --help'"}},
		{"no key", []string{"-f", testPolicy}, []string{"explain takes KEY, or POLICY KEY; got 0 arguments", "See 'kubectl limiterd explain --help'"}},
		{"too many arguments", []string{"-f", testPolicy, "a", "b", "c"}, []string{"got 3 arguments"}},
		{"empty key", []string{"-f", testPolicy, ""}, []string{"KEY must not be empty"}},
		{"unknown flag", []string{"-f", testPolicy, "k", "--bogus"}, []string{"unknown flag: --bogus"}},
	} {
		code, stdout, stderr := runTest(t, append([]string{"explain"}, c.args...)...)
		if code != 1 || stdout != "" || !strings.HasPrefix(stderr, "error: ") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1, nothing on stdout, an error", c.name, code, stdout, stderr)
			continue
		}
		for _, w := range c.wants {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: stderr %q does not say %q", c.name, stderr, w)
			}
		}
	}
	code, _, stderr := runTest(t, "frobnicate")
	if code != 1 || !strings.Contains(stderr, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, stderr %q", code, stderr)
	}
}

func TestHelp(t *testing.T) {
	code, stdout, _ := runTest(t, "--help")
	if code != 0 || !strings.Contains(stdout, "kubectl limiterd [command]") || !strings.Contains(stdout, "explain ") {
		t.Fatalf("--help: exit %d\n%s", code, stdout)
	}
	code, stdout, _ = runTest(t, "explain", "--help")
	for _, w := range []string{"kubectl limiterd explain -f FILENAME [POLICY] KEY", "Examples:", "-f, --filename", "--cost", "-o, --output"} {
		if code != 0 || !strings.Contains(stdout, w) {
			t.Errorf("explain --help: exit %d, no %q\n%s", code, w, stdout)
		}
	}
}
