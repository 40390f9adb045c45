package chartgen

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseValues(t *testing.T) {
	p := writeFile(t, t.TempDir(), "values.yaml", `# A file comment, not a description.

# -- The name.
name: ""
# -- A section.
server:
  # -- The port,
  # on two lines.
  port: 8080
  # -- (int or string) A budget.
  budget: null
  # -- The tag.
  # @default -- the app version
  tag: ""
  # -- Free-form labels.
  labels:
    a: "1"
`)
	got, err := ParseValues(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Value{
		{Key: "name", Type: "string", Default: "`\"\"`", Description: "The name."},
		{Key: "server", Type: "object", Description: "A section.", Section: true},
		{Key: "server.port", Type: "int", Default: "`8080`", Description: "The port, on two lines.", Depth: 1},
		{Key: "server.budget", Type: "int or string", Default: "`null`", Description: "A budget.", Depth: 1},
		{Key: "server.tag", Type: "string", Default: "the app version", Description: "The tag.", Depth: 1},
		{Key: "server.labels", Type: "object", Default: "`{\"a\":\"1\"}`", Description: "Free-form labels.", Depth: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseValues:\ngot  %+v\nwant %+v", got, want)
	}
}

func TestParseValuesRefusesUndocumentedKeys(t *testing.T) {
	p := writeFile(t, t.TempDir(), "values.yaml", `# -- Documented.
a: 1
b: 2
# -- A section.
s:
  # -- Documented.
  x: 1
  y: 2
`)
	_, err := ParseValues(p)
	if err == nil {
		t.Fatal("ParseValues accepted undocumented keys")
	}
	for _, key := range []string{": b has no", ": s.y has no"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q does not name %q", err, key)
		}
	}
}

// TestCheckAndWrite checks that Check reports out-of-date and stale files and that Write fixes
// them.
func TestCheckAndWrite(t *testing.T) {
	root := t.TempDir()
	writeFile(t, root, "config/crd/bases/a.yaml", "kind: CustomResourceDefinition\n")
	writeFile(t, root, "docs/grafana/limiterd.json", "{}\n")
	writeFile(t, root, ChartDir+"/Chart.yaml", "name: c\nversion: 1.0.0\nappVersion: \"2.0.0\"\ndescription: D.\n")
	writeFile(t, root, ChartDir+"/values.yaml", "# -- The replicas.\nreplicas: 1\n")
	writeFile(t, root, ChartDir+"/README.md.gotmpl", "# {{ .Name }} {{ .AppVersion }}\n{{ range .General }}{{ .Key }}={{ .Default }}: {{ .Description }}\n{{ end }}")
	writeFile(t, root, ChartDir+"/files/crds/old.yaml", "stale\n")

	err := Check(root)
	if err == nil {
		t.Fatal("Check passed with missing and stale files")
	}
	for _, want := range []string{"files/crds/a.yaml", "files/crds/old.yaml is stale", "README.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check error %q does not mention %q", err, want)
		}
	}
	if _, err := Write(root); err != nil {
		t.Fatal(err)
	}
	if err := Check(root); err != nil {
		t.Fatalf("Check after Write: %v", err)
	}
	readme, _ := os.ReadFile(filepath.Join(root, ChartDir, "README.md"))
	if string(readme) != "# c 2.0.0\nreplicas=`1`: The replicas.\n" {
		t.Errorf("README = %q", readme)
	}
	if _, err := os.Stat(filepath.Join(root, ChartDir, "files/crds/old.yaml")); !os.IsNotExist(err) {
		t.Errorf("stale copy not removed: %v", err)
	}
}
