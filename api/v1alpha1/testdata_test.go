package v1alpha1

import (
	"path/filepath"
	"testing"

	"github.com/limiterd/limiterd/internal/policytestdata"
)

// loadTestCases returns the files of testdata/<dir>. The same files are applied to a real API
// server by the integration tests: an invalid file must be rejected there too.
func loadTestCases(t testing.TB, dir string) []policytestdata.File {
	t.Helper()
	return policytestdata.Load(t, filepath.Join("testdata", dir))
}
