package v1alpha1

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// testCase is one policy file of testdata/valid or testdata/invalid. The same files are applied
// to a real API server by the integration tests: an invalid file must be rejected there too.
type testCase struct {
	name string // file name without .yaml
	path string
	data []byte
	// field is the path the error of Validate (and DecodePolicies) must name ("# field: ..."),
	// for invalid files.
	field string
	// apiServerField is the path the API server's error names, when it differs from field
	// ("# apiserver-field: ..."): some rules are CEL on an enclosing object.
	apiServerField string
}

// loadTestCases returns the files of testdata/<dir>, sorted by name. It fails the test if there
// are none, or if an invalid file lacks its field line.
func loadTestCases(t testing.TB, dir string) []testCase {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no files in testdata/%s", dir)
	}
	sort.Strings(paths)
	cases := make([]testCase, 0, len(paths))
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		tc := testCase{name: strings.TrimSuffix(filepath.Base(path), ".yaml"), path: path, data: data}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "# field:"); ok {
				tc.field = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "# apiserver-field:"); ok {
				tc.apiServerField = strings.TrimSpace(v)
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if dir == "invalid" && tc.field == "" {
			t.Fatalf("%s has no '# field: <path>' line", path)
		}
		if tc.apiServerField == "" {
			tc.apiServerField = tc.field
		}
		cases = append(cases, tc)
	}
	return cases
}
