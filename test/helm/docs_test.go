package helm_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/limiterd/limiterd/internal/testbin"
)

// helmDocsFlags are the flags `make chart-docs` gives helm-docs (HELM_DOCS_FLAGS in the Makefile).
var helmDocsFlags = []string{"--chart-search-root", chartRel, "--sort-values-order", "file", "--log-level", "warning"}

// helmDocs runs the pinned helm-docs ($HELM_DOCS, `make helm-docs`) from the repository root with
// the flags of `make chart-docs`, --dry-run and args, and returns what it renders. helm-docs
// reports a bad template or values file with a warning and still exits 0, so anything it writes to
// stderr fails t.
func helmDocs(t *testing.T, args ...string) []byte {
	t.Helper()
	bin := testbin.Need(t, testbin.HelmDocs)
	cmd := exec.CommandContext(t.Context(), bin, slices.Concat(helmDocsFlags, []string{"--dry-run"}, args)...)
	cmd.Dir = repoRoot(t)
	// helm-docs also takes its flags from HELM_DOCS_* variables: keep the caller's out.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HELM_DOCS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() > 0 {
		t.Fatalf("%s: %v\n%s", cmd, err, stderr.String())
	}
	return stdout.Bytes()
}

// TestReadmeCurrent checks that README.md is, byte for byte, what helm-docs renders from
// README.md.gotmpl and the comments of values.yaml (`make chart-docs`).
func TestReadmeCurrent(t *testing.T) {
	t.Parallel()
	got := helmDocs(t)
	want, err := os.ReadFile(filepath.Join(chartDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, want) {
		return
	}
	gotLines, wantLines := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	i := 0
	for i < len(gotLines) && i < len(wantLines) && gotLines[i] == wantLines[i] {
		i++
	}
	line := func(lines []string) string {
		if i < len(lines) {
			return lines[i]
		}
		return "(end of file)"
	}
	t.Fatalf("%s/README.md is not what helm-docs renders: run `make chart-docs`. First difference, line %d:\ncommitted: %q\nhelm-docs: %q",
		chartRel, i+1, line(wantLines), line(gotLines))
}

// TestChartCopiesCurrent checks the chart's copies of files kept elsewhere, which `make
// chart-docs` makes: files/crds holds config/crd/bases (no file more, no file less) and
// files/dashboards/limiterd.json is docs/grafana/limiterd.json.
func TestChartCopiesCurrent(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	copies := map[string]string{ // source → copy, relative to the repository root
		"docs/grafana/limiterd.json": chartRel + "/files/dashboards/limiterd.json",
	}
	crds, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRD in config/crd/bases: %v", err)
	}
	for _, src := range crds {
		copies["config/crd/bases/"+filepath.Base(src)] = chartRel + "/files/crds/" + filepath.Base(src)
	}
	have, err := filepath.Glob(filepath.Join(chartDir(t), "files", "crds", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range have {
		if _, ok := copies["config/crd/bases/"+filepath.Base(p)]; !ok {
			t.Errorf("%s/files/crds/%s has no counterpart in config/crd/bases: run `make chart-docs`", chartRel, filepath.Base(p))
		}
	}
	for src, dst := range copies {
		want, err := os.ReadFile(filepath.Join(root, src))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(root, dst))
		if err != nil {
			t.Errorf("%v: run `make chart-docs`", err)
		} else if !bytes.Equal(got, want) {
			t.Errorf("%s is not a copy of %s: run `make chart-docs`", dst, src)
		}
	}
}

// valueKey is a key of values.yaml.
type valueKey struct {
	// Key is the dotted path, e.g. "limiterd.store.redis.addrs".
	Key string
	// Documented tells that a "# --" comment is above the key: helm-docs documents it with that
	// description.
	Documented bool
	// Section tells that the key is a mapping some of whose keys are documented: each of them must
	// be, and README.md lists them below it. A mapping with no documented key (resources,
	// securityContext) is documented as a whole.
	Section bool
}

// valueKeys returns, in file order, the top-level keys of values.yaml and, recursively, the keys
// of each section.
func valueKeys(t testing.TB) []valueKey {
	t.Helper()
	path := filepath.Join(chartDir(t), "values.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yamlv3.MappingNode {
		t.Fatalf("%s: not a YAML mapping", path)
	}
	// documented is helm-docs' test: a comment line above the key starts with "# --".
	documented := func(k *yamlv3.Node) bool {
		for line := range strings.Lines(k.HeadComment) {
			if strings.HasPrefix(strings.TrimSpace(line), "# --") {
				return true
			}
		}
		return false
	}
	var out []valueKey
	var walk func(m *yamlv3.Node, prefix string)
	walk = func(m *yamlv3.Node, prefix string) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			key := valueKey{Key: prefix + k.Value, Documented: documented(k)}
			for j := 0; v.Kind == yamlv3.MappingNode && j < len(v.Content); j += 2 {
				key.Section = key.Section || documented(v.Content[j])
			}
			out = append(out, key)
			if key.Section {
				walk(v, key.Key+".")
			}
		}
	}
	walk(doc.Content[0], "")
	return out
}

// TestValuesDocumented checks that every value a user may set is documented, as in
// cert-manager's chart: each top-level key of values.yaml and each key of a section carries a
// "# --" description, and README.md lists it.
func TestValuesDocumented(t *testing.T) {
	t.Parallel()
	keys := valueKeys(t)
	if len(keys) < 100 {
		t.Errorf("only %d keys in values.yaml", len(keys))
	}
	readme, err := os.ReadFile(filepath.Join(chartDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !k.Documented {
			t.Errorf(`values.yaml: %s has no "# --" description`, k.Key)
			continue
		}
		entry := "| `" + k.Key + "` |"
		if k.Section && !strings.Contains(k.Key, ".") {
			entry = "### `" + k.Key + "`\n"
		}
		if !strings.Contains(string(readme), entry) {
			t.Errorf("README.md does not document %s: run `make chart-docs`", k.Key)
		}
	}
}

// TestValuesDescribed checks the descriptions helm-docs reads from values.yaml: it describes
// exactly the keys valueKeys finds documented, each with a sentence.
func TestValuesDescribed(t *testing.T) {
	t.Parallel()
	tmpl := filepath.Join(t.TempDir(), "values.json.gotmpl")
	if err := os.WriteFile(tmpl, []byte("{{ toJson .Values }}"), 0o600); err != nil {
		t.Fatal(err)
	}
	var rows []struct{ Key, AutoDescription string }
	if out := helmDocs(t, "--template-files", tmpl); json.Unmarshal(out, &rows) != nil {
		t.Fatalf("helm-docs did not render the rows as JSON:\n%s", out)
	}
	described := map[string]bool{}
	for _, r := range rows {
		described[r.Key] = true
		d := r.AutoDescription
		capital := d != "" && (strings.ToUpper(d[:1]) == d[:1] || strings.HasPrefix(d, "limiterd"))
		if len(d) < 12 || !strings.HasSuffix(d, ".") || !capital {
			t.Errorf("%s: description %q is not a sentence", r.Key, d)
		}
	}
	for _, k := range valueKeys(t) {
		if k.Documented != described[k.Key] {
			t.Errorf("%s: documented by a \"# --\" comment %v, described by helm-docs %v", k.Key, k.Documented, described[k.Key])
		}
		delete(described, k.Key)
	}
	for k := range described {
		t.Errorf("helm-docs describes %s, which is neither a top-level key nor one of a section", k)
	}
}
