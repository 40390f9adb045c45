package controllers

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// policyFile is one file of api/v1alpha1/testdata/{valid,invalid}: the table run against both the
// Go validator and the API server.
type policyFile struct {
	name string // file name without .yaml
	data []byte
	// field is the path the Go validator's error names ("# field: ..."), for invalid files.
	field string
	// apiServerField is the path the API server's error names ("# apiserver-field: ..."),
	// field unless the file says otherwise (a CEL rule on an enclosing object).
	apiServerField string
}

// loadPolicyFiles returns the files of api/v1alpha1/testdata/<dir>, sorted by name.
func loadPolicyFiles(t *testing.T, dir string) []policyFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "api", "v1alpha1", "testdata", dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no files in api/v1alpha1/testdata/%s", dir)
	}
	sort.Strings(paths)
	files := make([]policyFile, 0, len(paths))
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f := policyFile{name: strings.TrimSuffix(filepath.Base(path), ".yaml"), data: data}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "# field:"); ok {
				f.field = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(sc.Text(), "# apiserver-field:"); ok {
				f.apiServerField = strings.TrimSpace(v)
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if dir == "invalid" && f.field == "" {
			t.Fatalf("%s has no '# field: <path>' line", path)
		}
		if f.apiServerField == "" {
			f.apiServerField = f.field
		}
		files = append(files, f)
	}
	return files
}
