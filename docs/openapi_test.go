package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// specFile is the OpenAPI description of the decisions and admin APIs.
const specFile = "../api/openapi/openapi.yaml"

var (
	// endpoint matches a path of limiterd's HTTP APIs in a page (its first group): /v1/..., up
	// to a query, a bracket, a quote or a space, or one of the admin API's paths at the root;
	// not within another path (an upstream's /api/v1/users), but after a port (:8080/v1/...).
	endpoint = regexp.MustCompile(`(?:^|[^A-Za-z_./-])(/v1/[A-Za-z0-9:<>/_.-]*[A-Za-z0-9>]|/(?:healthz|readyz(?:/verbose)?|metrics|openapi\.yaml)\b)`)
	// templateParam is a path parameter of the spec, {name}; the pages write it <name>.
	templateParam = regexp.MustCompile(`\{([a-z]+)\}`)
	quotedParam   = regexp.MustCompile(`\\\{([a-z]+)\\\}`)
)

// notEndpoints are paths the pages name that are no endpoint of the spec, and why.
var notEndpoints = map[string]string{
	"/readyz/verbose": "the non-resource URL a caller must be allowed to get to read /readyz's errors",
}

// TestOpenAPIPathsDocumented: every path of the OpenAPI description is mentioned by the page its
// x-docs names (a parameter {name} written <name>), and every path of limiterd's HTTP APIs that
// the README or a page of docs/ mentions is one of the spec (a parameter may be written <name>
// or given a value), so that the reference and the spec cannot part.
func TestOpenAPIPathsDocumented(t *testing.T) {
	b, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Paths map[string]struct {
			Docs string `yaml:"x-docs"`
		} `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatalf("%s: %v", specFile, err)
	}
	if len(spec.Paths) == 0 {
		t.Fatalf("%s has no paths", specFile)
	}
	var matchers []*regexp.Regexp
	for path, item := range spec.Paths {
		written := templateParam.ReplaceAllString(path, "<$1>")
		page, ok := strings.CutPrefix(item.Docs, "docs/")
		if !ok {
			t.Errorf("%s: x-docs %q, want the page of docs/ that explains it", path, item.Docs)
			continue
		}
		text, err := os.ReadFile(page)
		if err != nil {
			t.Errorf("%s: x-docs: %v", path, err)
			continue
		}
		if !strings.Contains(string(text), written) {
			t.Errorf("%s (x-docs) does not mention %s", item.Docs, written)
		}
		// A parameter matches <name> or a value: QuoteMeta has escaped its braces.
		pattern := quotedParam.ReplaceAllString(regexp.QuoteMeta(path), `(?:<$1>|[A-Za-z0-9._-]+)`)
		matchers = append(matchers, regexp.MustCompile(`^`+pattern+`$`))
	}

	var pages []string
	for _, g := range pagesGlobs {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, m...)
	}
	for _, page := range pages {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		// An HTML line break (the generated crd-reference.md writes one per line of a Go doc
		// comment) ends a path as a line's end does.
		prose := strings.ReplaceAll(string(text), "<br />", "\n")
		for _, m := range endpoint.FindAllStringSubmatch(prose, -1) {
			p := m[1]
			if _, ok := notEndpoints[p]; ok {
				continue
			}
			if !slices.ContainsFunc(matchers, func(m *regexp.Regexp) bool { return m.MatchString(p) }) {
				t.Errorf("%s mentions %s, which is no path of %s", page, p, specFile)
			}
		}
	}
}
