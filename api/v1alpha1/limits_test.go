package v1alpha1

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestLimitValues pins the bounds: the strategies' come from limiterd/limiter, the HTTP and Envoy
// APIs take theirs from these constants, so a change to either changes what limiterd accepts.
func TestLimitValues(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"MaxCapacity", MaxCapacity, 1_000_000_000},
		{"MaxWindowLimit", MaxWindowLimit, 100_000},
		{"MaxQuotaLimit", MaxQuotaLimit, 1_000_000_000},
		{"MaxConcurrencyLimit", MaxConcurrencyLimit, 10_000},
		{"MaxTimeZoneLength", MaxTimeZoneLength, 64},
		{"MinPeriod", int64(MinPeriod), int64(time.Millisecond)},
		{"MaxPeriod", int64(MaxPeriod), int64(24 * time.Hour)},
		{"MaxRefillWindow", int64(MaxRefillWindow), int64(366 * 24 * time.Hour)},
		{"MaxLimits", MaxLimits, 4},
		{"DefaultRefillPeriod", int64(DefaultRefillPeriod), int64(time.Second)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

const crdFile = "../../config/crd/bases/limiterd.dev_ratelimitpolicies.yaml"

// schemaNode is a node of the CRD's OpenAPI schema, read generically.
type schemaNode map[string]any

func (n schemaNode) prop(path ...string) schemaNode {
	cur := n
	for _, p := range path {
		var next any
		if p == "[]" {
			next = cur["items"]
		} else {
			props, _ := cur["properties"].(map[string]any)
			next = props[p]
		}
		m, ok := next.(map[string]any)
		if !ok {
			panic(fmt.Sprintf("no schema at %v (%s)", path, p))
		}
		cur = m
	}
	return cur
}

func (n schemaNode) num(key string) int64 {
	v, ok := n[key].(float64)
	if !ok {
		return -1
	}
	return int64(v)
}

func (n schemaNode) rules() []string {
	var rules []string
	for _, r := range n.validations() {
		rules = append(rules, r.rule)
	}
	return rules
}

// celRule is one CEL rule of the CRD with its message.
type celRule struct{ rule, message string }

func (n schemaNode) validations() []celRule {
	var out []celRule
	xv, _ := n["x-kubernetes-validations"].([]any)
	for _, r := range xv {
		m := r.(map[string]any)
		msg, _ := m["message"].(string)
		out = append(out, celRule{rule: m["rule"].(string), message: msg})
	}
	return out
}

// ruleMessage returns the message of n's rule that contains part, "" when none does.
func (n schemaNode) ruleMessage(part string) string {
	for _, v := range n.validations() {
		if strings.Contains(v.rule, part) {
			return v.message
		}
	}
	return ""
}

func loadCRDSchema(t *testing.T) schemaNode {
	t.Helper()
	data, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatalf("%v (make manifests generates it)", err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	v := crd["spec"].(map[string]any)["versions"].([]any)[0].(map[string]any)
	return v["schema"].(map[string]any)["openAPIV3Schema"].(map[string]any)
}

// TestCRDMatchesLimits checks the literal bounds of the CRD markers against the constants that
// Validate uses, so that the API server and limiterd accept the same policies.
func TestCRDMatchesLimits(t *testing.T) {
	root := loadCRDSchema(t)
	spec := root.prop("spec")
	tier := spec.prop("tiers", "[]")
	limit := tier.prop("limits", "[]")
	override := spec.prop("overrides", "[]")
	for _, c := range []struct {
		what      string
		got, want int64
	}{
		{"capacity minimum", tier.prop("tokenBucket", "capacity").num("minimum"), 1},
		{"capacity maximum", tier.prop("tokenBucket", "capacity").num("maximum"), MaxCapacity},
		{"refillRate minimum", tier.prop("tokenBucket", "refillRate").num("minimum"), 1},
		{"refillRate maximum", tier.prop("tokenBucket", "refillRate").num("maximum"), MaxCapacity},
		{"limit minimum", tier.prop("slidingWindow", "limit").num("minimum"), 1},
		{"limit maximum", tier.prop("slidingWindow", "limit").num("maximum"), MaxWindowLimit},
		{"tiers minItems", spec.prop("tiers").num("minItems"), 1},
		{"tiers maxItems", spec.prop("tiers").num("maxItems"), MaxTiers},
		{"tier name maxLength", tier.prop("name").num("maxLength"), MaxNameLength},
		{"limits minItems", tier.prop("limits").num("minItems"), 1},
		{"limits maxItems", tier.prop("limits").num("maxItems"), MaxLimits},
		{"limit name maxLength", limit.prop("name").num("maxLength"), MaxNameLength},
		{"limit capacity minimum", limit.prop("tokenBucket", "capacity").num("minimum"), 1},
		{"limit capacity maximum", limit.prop("tokenBucket", "capacity").num("maximum"), MaxCapacity},
		{"limit refillRate minimum", limit.prop("tokenBucket", "refillRate").num("minimum"), 1},
		{"limit refillRate maximum", limit.prop("tokenBucket", "refillRate").num("maximum"), MaxCapacity},
		{"limit limit minimum", limit.prop("slidingWindow", "limit").num("minimum"), 1},
		{"limit limit maximum", limit.prop("slidingWindow", "limit").num("maximum"), MaxWindowLimit},
		{"quota limit minimum", tier.prop("quota", "limit").num("minimum"), 1},
		{"quota limit maximum", tier.prop("quota", "limit").num("maximum"), MaxQuotaLimit},
		{"limit quota limit minimum", limit.prop("quota", "limit").num("minimum"), 1},
		{"limit quota limit maximum", limit.prop("quota", "limit").num("maximum"), MaxQuotaLimit},
		{"quota timeZone maxLength", tier.prop("quota", "timeZone").num("maxLength"), MaxTimeZoneLength},
		{"limit quota timeZone maxLength", limit.prop("quota", "timeZone").num("maxLength"), MaxTimeZoneLength},
		{"limit refillPeriod maxLength", limit.prop("tokenBucket", "refillPeriod").num("maxLength"), MaxDurationLength},
		{"limit window maxLength", limit.prop("slidingWindow", "window").num("maxLength"), MaxDurationLength},
		{"defaultTier maxLength", spec.prop("defaultTier").num("maxLength"), MaxNameLength},
		{"override tier maxLength", override.prop("tier").num("maxLength"), MaxNameLength},
		{"overrides maxItems", spec.prop("overrides").num("maxItems"), MaxOverrides},
		{"clients maxItems", override.prop("clients").num("maxItems"), MaxClientsPerOverride},
		{"clientPrefixes maxItems", override.prop("clientPrefixes").num("maxItems"), MaxClientsPerOverride},
		{"client maxLength", override.prop("clients", "[]").num("maxLength"), MaxClientKeyBytes},
		{"client prefix maxLength", override.prop("clientPrefixes", "[]").num("maxLength"), MaxClientKeyBytes},
		{"client minLength", override.prop("clients", "[]").num("minLength"), 1},
		{"client prefix minLength", override.prop("clientPrefixes", "[]").num("minLength"), 1},
		{"refillPeriod maxLength", tier.prop("tokenBucket", "refillPeriod").num("maxLength"), MaxDurationLength},
		{"window maxLength", tier.prop("slidingWindow", "window").num("maxLength"), MaxDurationLength},
		{"concurrency limit minimum", tier.prop("concurrency", "limit").num("minimum"), 1},
		{"concurrency limit maximum", tier.prop("concurrency", "limit").num("maximum"), MaxConcurrencyLimit},
		{"limit concurrency limit minimum", limit.prop("concurrency", "limit").num("minimum"), 1},
		{"limit concurrency limit maximum", limit.prop("concurrency", "limit").num("maximum"), MaxConcurrencyLimit},
		{"leaseTimeout maxLength", tier.prop("concurrency", "leaseTimeout").num("maxLength"), MaxDurationLength},
		{"limit leaseTimeout maxLength", limit.prop("concurrency", "leaseTimeout").num("maxLength"), MaxDurationLength},
	} {
		if c.got != c.want {
			t.Errorf("CRD %s = %d, want %d", c.what, c.got, c.want)
		}
	}

	// Byte bounds, and the messages that state them.
	for _, c := range []struct {
		what  string
		node  schemaNode
		bound int
	}{
		{"clients items", override.prop("clients", "[]"), MaxClientKeyBytes},
		{"clientPrefixes items", override.prop("clientPrefixes", "[]"), MaxClientKeyBytes},
		{"descriptorKey", spec.prop("envoy", "descriptorKey"), MaxDescriptorKeyBytes},
	} {
		bytesRule := fmt.Sprintf("size(bytes(self)) <= %d", c.bound)
		if rules := c.node.rules(); !slices.Contains(rules, bytesRule) {
			t.Errorf("CRD %s: rules %q, want %q", c.what, rules, bytesRule)
		}
		if got, want := c.node.ruleMessage(bytesRule), fmt.Sprintf("must be at most %d bytes", c.bound); got != want {
			t.Errorf("CRD %s: message %q, want %q", c.what, got, want)
		}
	}

	// The CRD's pattern for keys forbids exactly the characters Validate forbids.
	for _, path := range [][]string{{"overrides", "[]", "clients", "[]"}, {"overrides", "[]", "clientPrefixes", "[]"}, {"envoy", "descriptorKey"}} {
		pattern, _ := spec.prop(path...)["pattern"].(string)
		re, err := regexp.Compile(pattern)
		if err != nil {
			t.Errorf("CRD %v: pattern %q: %v", path, pattern, err)
			continue
		}
		for r := range sweptRunes() {
			if re.MatchString("a"+string(r)) == forbiddenInKey(r) {
				t.Errorf("CRD %v: pattern %q and forbiddenInKey disagree on %U", path, pattern, r)
				break
			}
		}
	}

	durationRule := regexp.MustCompile(`^duration\(self\) >= duration\('([^']+)'\) && duration\(self\) <= duration\('([^']+)'\)$`)
	for _, path := range [][]string{{"tokenBucket", "refillPeriod"}, {"slidingWindow", "window"}, {"concurrency", "leaseTimeout"},
		{"limits", "[]", "tokenBucket", "refillPeriod"}, {"limits", "[]", "slidingWindow", "window"},
		{"limits", "[]", "concurrency", "leaseTimeout"}} {
		rules := tier.prop(path...).rules()
		if len(rules) != 1 || !durationRule.MatchString(rules[0]) {
			t.Errorf("CRD %v: rules %q, want one bounding the duration", path, rules)
			continue
		}
		m := durationRule.FindStringSubmatch(rules[0])
		if lo, _ := time.ParseDuration(m[1]); lo != MinPeriod {
			t.Errorf("CRD %v: lower bound %s, want %v", path, m[1], MinPeriod)
		}
		if hi, _ := time.ParseDuration(m[2]); hi != MaxPeriod {
			t.Errorf("CRD %v: upper bound %s, want %v", path, m[2], MaxPeriod)
		}
		if got, want := tier.prop(path...).validations()[0].message, "must be between "+m[1]+" and "+m[2]; got != want {
			t.Errorf("CRD %v: message %q, want %q", path, got, want)
		}
	}

	refill := tier.prop("tokenBucket").rules()
	if len(refill) != 1 {
		t.Fatalf("CRD tokenBucket: %d rules, want 1 (the full refill)", len(refill))
	}
	if got := limit.prop("tokenBucket").rules(); !slices.Equal(got, refill) {
		t.Errorf("CRD limits[].tokenBucket: rules %q, want the tier's %q", got, refill)
	}
	for _, want := range []string{
		"self.capacity <= " + strconv.Itoa(MaxCapacity),
		"self.refillRate <= " + strconv.Itoa(MaxCapacity),
		">= " + strconv.FormatInt(int64(MinPeriod), 10),
		"<= " + strconv.FormatInt(int64(MaxPeriod), 10),
		"self.refillRate * " + strconv.FormatInt(int64(MaxRefillWindow/time.Second), 10),
		"orValue('" + DefaultRefillPeriod.String() + "')",
	} {
		if !strings.Contains(refill[0], want) {
			t.Errorf("CRD full-refill rule lacks %q", want)
		}
	}
	wantRefill := fmt.Sprintf("must take at most %d days (%dh)", MaxRefillWindow/(24*time.Hour), MaxRefillWindow/time.Hour)
	if got := tier.prop("tokenBucket").validations()[0].message; !strings.HasSuffix(got, wantRefill) {
		t.Errorf("CRD full-refill message %q, want it to end with %q", got, wantRefill)
	}
	for _, want := range []string{
		"flatten().size() <= " + strconv.Itoa(MaxOverrideClients),
		"flatten().size() > " + strconv.Itoa(MaxOverrideClients),
	} {
		n := 0
		for _, r := range spec.rules() {
			if strings.Contains(r, want) {
				n++
			}
		}
		if n != 2 {
			t.Errorf("CRD spec: %d rules contain %q, want 2 (clients, clientPrefixes)", n, want)
		}
	}
	for _, list := range []string{"clients", "clientPrefixes"} {
		rule := "o.?" + list + ".orValue([])).flatten().size() <= " + strconv.Itoa(MaxOverrideClients)
		want := fmt.Sprintf("all overrides together may list at most %d %s", MaxOverrideClients, list)
		if got := spec.ruleMessage(rule); got != want {
			t.Errorf("CRD spec: message of %q is %q, want %q", rule, got, want)
		}
	}

	for _, n := range []schemaNode{tier, limit} {
		if got := n.prop("tokenBucket", "refillPeriod")["default"]; got != DefaultRefillPeriod.String() {
			t.Errorf("CRD refillPeriod default %v, want %v", got, DefaultRefillPeriod)
		}
		if got := n.prop("quota", "timeZone")["default"]; got != DefaultTimeZone {
			t.Errorf("CRD timeZone default %v, want %v", got, DefaultTimeZone)
		}
		if got := fmt.Sprint(n.prop("quota", "period")["enum"]); got != fmt.Sprint(supportedPeriods) {
			t.Errorf("CRD quota period enum %v, want %v", got, supportedPeriods)
		}
		zone := n.prop("quota", "timeZone")
		// The rule that looks the zone up is checked against LoadTimeZone by
		// TestCRDTimeZoneRulesMatchLoadTimeZone.
		if got := zone.validations(); len(got) != 2 || got[0].rule != "self != 'Local'" || got[0].message != ErrTimeZoneLocal.Error() ||
			got[1].rule != timeZoneLookupRule {
			t.Errorf("CRD timeZone rules %+v, want one refusing Local with the message %q, then %q", got, ErrTimeZoneLocal, timeZoneLookupRule)
		}
		pattern, _ := zone["pattern"].(string)
		re, err := regexp.Compile(pattern)
		if err != nil {
			t.Errorf("CRD timeZone pattern %q: %v", pattern, err)
			continue
		}
		for name := range timeZoneNames() {
			if re.MatchString(name) != timeZoneForm(name) {
				t.Errorf("CRD timeZone pattern %q and timeZoneForm disagree on %q", pattern, name)
				break
			}
		}
	}
	if got := spec.prop("failureMode")["default"]; got != string(DefaultFailureMode) {
		t.Errorf("CRD failureMode default %v, want %v", got, DefaultFailureMode)
	}
	if got := fmt.Sprint(tier.prop("algorithm")["enum"]); got != fmt.Sprint(supportedAlgorithms) {
		t.Errorf("CRD algorithm enum %v, want %v", got, supportedAlgorithms)
	}
	// A limit's algorithm is the tier's enum less the algorithms a CEL rule excludes.
	var stacked []Algorithm
	for _, a := range supportedAlgorithms {
		if !slices.Contains(limit.rules(), "self.algorithm != '"+string(a)+"'") {
			stacked = append(stacked, a)
		}
	}
	if got := fmt.Sprint(limit.prop("algorithm")["enum"]); got != fmt.Sprint(supportedAlgorithms) {
		t.Errorf("CRD limits[].algorithm enum %v, want %v", got, supportedAlgorithms)
	}
	if !slices.Equal(stacked, stackedAlgorithms) {
		t.Errorf("CRD limits[].algorithm admits %v, Validate %v", stacked, stackedAlgorithms)
	}
	if got := fmt.Sprint(spec.prop("failureMode")["enum"]); got != fmt.Sprint(supportedFailureModes) {
		t.Errorf("CRD failureMode enum %v, want %v", got, supportedFailureModes)
	}
	if got := spec.prop("refunds")["default"]; got != string(DefaultRefunds) {
		t.Errorf("CRD refunds default %v, want %v", got, DefaultRefunds)
	}
	if got := fmt.Sprint(spec.prop("refunds")["enum"]); got != fmt.Sprint(supportedRefunds) {
		t.Errorf("CRD refunds enum %v, want %v", got, supportedRefunds)
	}
}

// TestCRDDescriptions checks that every field of spec and status has a description starting with
// its JSON name, which kubectl explain shows.
func TestCRDDescriptions(t *testing.T) {
	root := loadCRDSchema(t)
	var walk func(path string, n schemaNode)
	walk = func(path string, n schemaNode) {
		props, _ := n["properties"].(map[string]any)
		for name, v := range props {
			child := schemaNode(v.(map[string]any))
			if path == ".status" && name == "conditions" {
				// metav1.Condition documents itself.
				continue
			}
			if d, _ := child["description"].(string); !strings.HasPrefix(d, name+" ") {
				t.Errorf("%s.%s: description %q does not start with %q", path, name, d, name)
			}
			walk(path+"."+name, child)
		}
		if items, ok := n["items"].(map[string]any); ok {
			walk(path+"[]", items)
		}
	}
	walk("", root.prop("spec"))
	walk(".status", root.prop("status"))
	if d, _ := root.prop("spec")["description"].(string); !strings.HasPrefix(d, "spec ") {
		t.Errorf("spec: description %q", d)
	}
}
