// Package policytestdata loads the table of RateLimitPolicy files in api/v1alpha1/testdata, which
// is run against both the Go validator and the API server. It imports only the standard library,
// so the API package's own tests can use it. Import it from tests only.
package policytestdata

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// File is one policy file of the table.
type File struct {
	// Name is the file name without .yaml.
	Name string
	// Path is where the file was read from.
	Path string
	// Data is the file's content.
	Data []byte
	// Field is the path the Go validator's error must name ("# field: ..."), for invalid files.
	Field string
	// APIServerField is the path the API server's error names: Field, unless the file says
	// otherwise ("# apiserver-field: ...") because the rule is CEL on an enclosing object.
	APIServerField string
	// APIServerAccepts, for an invalid file, says why the API server admits it
	// ("# apiserver-accepts: ..."): a rule that the CRD cannot express, which only the Go
	// validator, and so the operator and limiterd, enforce (no file has one today).
	// Empty: the API server must reject it.
	APIServerAccepts string
}

// Load returns the files of dir (a testdata/valid or testdata/invalid directory), sorted by
// name. It fails the test if there are none, or if a file of an "invalid" directory lacks its
// field line.
func Load(t testing.TB, dir string) []File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no files in %s", dir)
	}
	sort.Strings(paths)
	files := make([]File, 0, len(paths))
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f := File{Name: strings.TrimSuffix(filepath.Base(path), ".yaml"), Path: path, Data: data}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "# field:"); ok {
				f.Field = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(sc.Text(), "# apiserver-field:"); ok {
				f.APIServerField = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(sc.Text(), "# apiserver-accepts:"); ok {
				f.APIServerAccepts = strings.TrimSpace(v)
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if filepath.Base(dir) == "invalid" && f.Field == "" {
			t.Fatalf("%s has no '# field: <path>' line", path)
		}
		if f.APIServerAccepts != "" && f.Field == "" {
			t.Fatalf("%s: an '# apiserver-accepts:' line is for invalid files only", path)
		}
		if f.APIServerField == "" {
			f.APIServerField = f.Field
		}
		files = append(files, f)
	}
	return files
}
