// Package helm_test tests the limiterd Helm chart (charts/limiterd): helm lint --strict,
// helm template with the defaults and the ci/ scenarios (the rendered objects are parsed and
// checked), the values schema, the generated files, the images and Dockerfiles, and helm
// install/upgrade/uninstall into a real API server (envtest).
//
// helm is the pinned binary of the Makefile: $HELM, by default bin/helm (`make helm` installs
// it; the test targets of the Makefile do first). Tests that need helm or the API server are
// skipped under -short (see internal/testbin).
package helm_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/internal/testenv"
)

const (
	// release and namespace are those of the rendered and installed chart.
	release   = "limiterd"
	namespace = "limiterd-system"
	chartRel  = "charts/limiterd"
)

// repoRoot returns the repository's root directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func chartDir(t testing.TB) string { return filepath.Join(repoRoot(t), chartRel) }

// helmBin returns the path of the pinned helm binary.
func helmBin(t testing.TB) string {
	t.Helper()
	return testbin.Need(t, testbin.Helm)
}

var helmHome struct {
	sync.Once
	dir string
}

// helmCmd returns a helm command run from the repository root, with helm's own configuration,
// cache and data in a private directory (not the user's).
func helmCmd(t testing.TB, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	bin := helmBin(t)
	helmHome.Do(func() {
		dir, err := os.MkdirTemp("", "limiterd-helm-home-")
		if err != nil {
			panic(err)
		}
		helmHome.dir = dir
	})
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(helmHome.dir, "config"),
		"HELM_CACHE_HOME="+filepath.Join(helmHome.dir, "cache"),
		"HELM_DATA_HOME="+filepath.Join(helmHome.dir, "data"),
	)
	return cmd
}

// runHelm runs helm and returns its stdout and stderr.
func runHelm(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	// Generous: on a cold machine other packages compile and start API servers at the same time.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := helmCmd(t, ctx, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// manifest is the list of objects a helm template printed.
type manifest []*unstructured.Unstructured

// render runs helm template of the chart as release "limiterd" in namespace "limiterd-system"
// with extra arguments (--values, --set) and parses the objects; it fails t on an error.
func render(t testing.TB, args ...string) manifest {
	t.Helper()
	out, errOut, err := runHelm(t, append([]string{"template", release, chartRel, "--namespace", namespace}, args...)...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	m, err := parseManifest(out)
	if err != nil {
		t.Fatalf("parse helm template output: %v\n%s", err, out)
	}
	return m
}

// renderErr runs helm template and returns its error output; it fails t when helm succeeds.
func renderErr(t testing.TB, args ...string) string {
	t.Helper()
	_, errOut, err := runHelm(t, append([]string{"template", release, chartRel, "--namespace", namespace}, args...)...)
	if err == nil {
		t.Fatalf("helm template %s succeeded, want an error", strings.Join(args, " "))
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("helm template: %v", err)
	}
	return errOut
}

// parseManifest splits a YAML stream into objects, dropping empty documents.
func parseManifest(s string) (manifest, error) {
	var out manifest
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(s)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("%w in:\n%s", err, doc)
		}
		if len(obj) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: obj})
	}
}

// kinds counts the objects by kind.
func (m manifest) kinds() map[string]int {
	c := map[string]int{}
	for _, o := range m {
		c[o.GetKind()]++
	}
	return c
}

// ofKind returns the objects of a kind.
func (m manifest) ofKind(kind string) manifest {
	var out manifest
	for _, o := range m {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// get returns the object of a kind and name, failing t when there is none.
func (m manifest) get(t testing.TB, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range m {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	var have []string
	for _, o := range m {
		have = append(have, o.GetKind()+"/"+o.GetName())
	}
	t.Fatalf("no %s %q rendered; have %v", kind, name, have)
	return nil
}

// typed converts an object to a typed one, refusing fields the type does not have (so that a
// misspelt field in a template fails here rather than being dropped).
func typed[T any](t testing.TB, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

// ciValues lists the chart's ci/*-values.yaml, relative to the repository root.
func ciValues(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("want at least 4 ci/*-values.yaml scenarios, have %v", files)
	}
	for i, f := range files {
		files[i] = filepath.ToSlash(filepath.Join(chartRel, "ci", filepath.Base(f)))
	}
	return files
}

// chartMeta reads Chart.yaml.
func chartMeta(t testing.TB) (version, appVersion string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir(t), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c.Version, c.AppVersion
}
