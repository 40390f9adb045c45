// Package docs holds no code: its tests check the links of the README, SECURITY.md, the
// CHANGELOG and the pages here, and the oldest Kubernetes the pages name against the CRD.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	fence      = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```[^\\n]*$")
	link       = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpan   = regexp.MustCompile("`[^`\n]*`")
	heading    = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	notInSlug  = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
	hasScheme  = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)
	pagesGlobs = []string{"../README.md", "../SECURITY.md", "../CHANGELOG.md", "*.md", "*/*.md"}
)

// TestRelativeLinks: every relative link of README.md, SECURITY.md, CHANGELOG.md and docs/ names a file that
// exists, and a link to a heading of a Markdown file (#anchor) names one of its headings, as
// GitHub spells their anchors. Pages move (the README's sections moved here); links must follow.
func TestRelativeLinks(t *testing.T) {
	var pages []string
	for _, g := range pagesGlobs {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, m...)
	}
	anchors := map[string]map[string]bool{}
	for _, page := range pages {
		// Nothing in a code span is a link (a validation pattern of crd-reference.md looks
		// like one); headings keep theirs, which are part of their anchors.
		text := codeSpan.ReplaceAllString(readWithoutCode(t, page), "")
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if hasScheme.MatchString(target) {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %q: %v", page, target, err)
				continue
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if anchors[path] == nil {
				anchors[path] = headingAnchors(readWithoutCode(t, path))
			}
			if !anchors[path][anchor] {
				t.Errorf("%s: link %q: %s has no heading with the anchor #%s", page, target, path, anchor)
			}
		}
	}
}

func readWithoutCode(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fence.ReplaceAllString(string(b), "")
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown text: lower case,
// punctuation but '-' and '_' dropped, spaces made '-', "-1", "-2"... appended to repeats.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		a := strings.ReplaceAll(notInSlug.ReplaceAllString(strings.ToLower(strings.TrimSpace(m[1])), ""), " ", "-")
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}
