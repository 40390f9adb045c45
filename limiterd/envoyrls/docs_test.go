package envoyrls

import (
	"os"
	"regexp"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// TestDocsDescriptorKeys checks the table of docs/envoy.md that shows users the client key of a
// whole descriptor, so that the overrides they write from it match what JoinEntries builds.
func TestDocsDescriptorKeys(t *testing.T) {
	page, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| ((?:`\\(\"[^\"]*\", \"[^\"]*\"\\)`(?:, )?)+) \\| `([^`]*)` \\|$")
	entry := regexp.MustCompile(`\("([^"]*)", "([^"]*)"\)`)
	rows := row.FindAllStringSubmatch(string(page), -1)
	if len(rows) < 3 {
		t.Fatalf("docs/envoy.md: %d rows of descriptor entries and client keys, want the table's (at least 3)", len(rows))
	}
	for _, r := range rows {
		var entries []*ratelimitv3.RateLimitDescriptor_Entry
		for _, e := range entry.FindAllStringSubmatch(r[1], -1) {
			entries = append(entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e[1], Value: e[2]})
		}
		if got := JoinEntries(entries); got != r[2] {
			t.Errorf("docs/envoy.md shows the client key of %s as %q; JoinEntries gives %q", r[1], r[2], got)
		}
	}
}
