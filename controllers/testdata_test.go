package controllers

import (
	"path/filepath"
	"testing"

	"github.com/limiterd/limiterd/internal/policytestdata"
)

// loadPolicyFiles returns the files of api/v1alpha1/testdata/<dir>: the table run against both
// the Go validator and the API server.
func loadPolicyFiles(t *testing.T, dir string) []policytestdata.File {
	t.Helper()
	return policytestdata.Load(t, filepath.Join("..", "api", "v1alpha1", "testdata", dir))
}
