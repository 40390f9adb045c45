package incluster

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNamespaceIn(t *testing.T) {
	dir := t.TempDir()
	for content, want := range map[string]string{"team-a\n": "team-a", "  \n": "", "": ""} {
		file := filepath.Join(dir, "namespace")
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := namespaceIn(file); got != want {
			t.Errorf("namespace file %q: got %q, want %q", content, got, want)
		}
	}
	if got := namespaceIn(filepath.Join(dir, "missing")); got != "" {
		t.Errorf("missing file: got %q, want none", got)
	}
}
