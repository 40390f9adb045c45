package testbin

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records how a test would have ended.
type recorder struct {
	testing.TB
	name            string
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Name() string                      { return r.name }
func (r *recorder) Skipf(format string, args ...any)  { r.skipped = fmt.Sprintf(format, args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func executable(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestPathFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	executable(t, filepath.Join(dir, "kube-apiserver"))
	t.Setenv("KUBEBUILDER_ASSETS", dir)
	if got, err := KubeAPIServer.Path(); err != nil || got != filepath.Join(dir, "kube-apiserver") {
		t.Errorf("KubeAPIServer.Path() = %q, %v; want the file in KUBEBUILDER_ASSETS", got, err)
	}
	_, err := Etcd.Path()
	if err == nil || !strings.Contains(err.Error(), "KUBEBUILDER_ASSETS") || !strings.Contains(err.Error(), "run `make envtest`") {
		t.Errorf("Etcd.Path() without etcd: %v; want an error naming KUBEBUILDER_ASSETS and `make envtest`", err)
	}

	helm := filepath.Join(dir, "helm")
	if err := os.WriteFile(helm, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HELM", helm)
	if _, err := Helm.Path(); err == nil || !strings.Contains(err.Error(), "not an executable") || !strings.Contains(err.Error(), "make helm") {
		t.Errorf("Helm.Path() of a non-executable file: %v; want an error naming `make helm`", err)
	}

	t.Setenv("HELM_DOCS", filepath.Join(dir, "helm-docs"))
	if _, err := HelmDocs.Path(); err == nil || !strings.Contains(err.Error(), "HELM_DOCS") || !strings.Contains(err.Error(), "run `make helm-docs`") {
		t.Errorf("HelmDocs.Path() without helm-docs: %v; want an error naming HELM_DOCS and `make helm-docs`", err)
	}
}

func TestPathDefaultsToBin(t *testing.T) {
	t.Setenv("HELM", "")
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	path, err := Helm.path()
	want := filepath.Join(root, "bin", "helm")
	if err == nil && path != want {
		t.Errorf("Helm.path() = %q, want %q", path, want)
	}
	if err != nil && !strings.Contains(err.Error(), want) {
		t.Errorf("Helm.path() error %v does not name %s", err, want)
	}
}

// A project binary older than a source file of the module is refused: a test would run code
// that is not the checkout's.
func TestStaleBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "limiterd")
	executable(t, bin)
	t.Setenv("LIMITERD_BIN_DIR", dir)
	src, mod, err := newestSource()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(src, ".go") && !strings.HasSuffix(src, "go.mod") && !strings.HasSuffix(src, "go.sum") {
		t.Errorf("newest source %s is not a Go file, go.mod or go.sum", src)
	}
	if err := os.Chtimes(bin, mod.Add(-time.Second), mod.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := checkFresh(bin); err == nil || !strings.Contains(err.Error(), src) {
		t.Errorf("checkFresh of a binary older than %s: %v, want an error naming it", src, err)
	}
	if _, err := Limiterd.Path(); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("Limiterd.Path() of a stale binary: %v, want an error naming `make build`", err)
	}
	if err := os.Chtimes(bin, mod.Add(time.Second), mod.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, err := Limiterd.Path(); err != nil || got != bin {
		t.Errorf("Limiterd.Path() of a fresh binary = %q, %v; want %q", got, err, bin)
	}
}

// A missing program fails the first test that needs it, naming how to install it, and skips the
// later ones with a pointer to that failure.
func TestNeedFailsOnce(t *testing.T) {
	setShort(t, false)
	failed.Clear()
	t.Cleanup(failed.Clear)
	t.Setenv("HELM", filepath.Join(t.TempDir(), "helm"))
	first := &recorder{TB: t, name: "TestFirst"}
	Need(first, Helm)
	if first.failed == "" || !strings.Contains(first.failed, "run `make helm`") || first.skipped != "" {
		t.Errorf("first test: failed %q, skipped %q; want a failure naming `make helm`", first.failed, first.skipped)
	}
	second := &recorder{TB: t, name: "TestSecond"}
	Need(second, Helm)
	if second.failed != "" || !strings.Contains(second.skipped, "TestFirst") {
		t.Errorf("second test: failed %q, skipped %q; want skipped pointing at TestFirst", second.failed, second.skipped)
	}
}

func TestNeedSkipsUnderShort(t *testing.T) {
	failed.Clear()
	t.Cleanup(failed.Clear)
	t.Setenv("HELM", filepath.Join(t.TempDir(), "helm"))
	setShort(t, true)
	r := &recorder{TB: t, name: "TestShort"}
	Need(r, Helm)
	if r.failed != "" || !strings.Contains(r.skipped, "-short") {
		t.Errorf("under -short: failed %q, skipped %q; want skipped", r.failed, r.skipped)
	}
}

// setShort sets -test.short for the duration of t.
func setShort(t *testing.T, short bool) {
	t.Helper()
	was := flag.Lookup("test.short").Value.String()
	if err := flag.Set("test.short", strconv.FormatBool(short)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set("test.short", was) })
}
