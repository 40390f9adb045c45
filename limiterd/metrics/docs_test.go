package metrics

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestEveryMetricIsDocumented checks that docs/metrics.md has a table row for every metric
// declared here (prometheus.*Opts{Name: ...} and prometheus.NewDesc), and names no metric that
// is not declared.
func TestEveryMetricIsDocumented(t *testing.T) {
	src, err := os.ReadFile("metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`Name:\s*"(limiterd_[a-z0-9_]+)"`),
		regexp.MustCompile(`prometheus\.NewDesc\(\s*"(limiterd_[a-z0-9_]+)"`),
	} {
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			declared[m[1]] = true
		}
	}
	if !declared["limiterd_decisions_total"] || !declared["limiterd_leases_held"] {
		t.Fatalf("found %v in metrics.go: update the patterns", declared)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if m := regexp.MustCompile("^\\| `(limiterd_[a-z0-9_]+)` \\|").FindStringSubmatch(line); m != nil {
			rows[m[1]] = true
		}
	}
	for name := range declared {
		if !rows[name] {
			t.Errorf("docs/metrics.md has no row for %s", name)
		}
	}
	for name := range rows {
		if !declared[name] {
			t.Errorf("docs/metrics.md documents %s, which metrics.go does not declare", name)
		}
	}
}
