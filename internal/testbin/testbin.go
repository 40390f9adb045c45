// Package testbin finds the programs that tests run: the pinned tools (the control plane, helm,
// helm-docs, caddy, traefik), the project's own binaries (bin/limiterd, bin/manager) and system
// packages (redis-server).
//
// Tests never build or install a program. `make test` (and the other test targets of the
// Makefile) installs and builds them first and tells the tests where they are through the
// environment: KUBEBUILDER_ASSETS (the directory of kube-apiserver and etcd), HELM (the helm
// binary), HELM_DOCS (the helm-docs binary), CADDY (the caddy binary), TRAEFIK (the traefik
// binary) and LIMITERD_BIN_DIR (the directory of limiterd and manager). Unset, each defaults to
// the links make leaves in the repository's bin/ directory, so that a plain `go test` works after
// `make tools build`.
//
// A test that needs a missing program fails once per test binary with a message naming the
// command that installs it; the other tests of that binary that need it are skipped, pointing at
// that failure. Under `go test -short` every test that needs such a program is skipped instead:
// the short run (make test-unit) needs nothing but Go.
package testbin

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// modulePath is the module whose root holds bin/, hack/ and config/.
const modulePath = "github.com/limiterd/limiterd"

// Program is a program that tests run. The zero value is not useful: use the package's variables.
type Program struct {
	name    string // file name
	env     string // variable that overrides where it is; "" for $PATH only
	envDir  bool   // env (and def) names the directory holding the file, not the file
	def     string // default of env, relative to the module root
	install string // the command that installs it
	source  bool   // built from this module: must not be older than its sources
}

// The programs tests may need.
var (
	// KubeAPIServer and Etcd are the test control plane (internal/testenv).
	KubeAPIServer = Program{name: "kube-apiserver", env: "KUBEBUILDER_ASSETS", envDir: true, def: "bin/k8s/current", install: "make envtest"}
	Etcd          = Program{name: "etcd", env: "KUBEBUILDER_ASSETS", envDir: true, def: "bin/k8s/current", install: "make envtest"}
	// Helm is the pinned helm.
	Helm = Program{name: "helm", env: "HELM", def: "bin/helm", install: "make helm"}
	// HelmDocs is the pinned helm-docs, which generates the chart's README.
	HelmDocs = Program{name: "helm-docs", env: "HELM_DOCS", def: "bin/helm-docs", install: "make helm-docs"}
	// Caddy is the pinned caddy, whose forward_auth the gateway tests (test/gateways) run in
	// front of limiterd.
	Caddy = Program{name: "caddy", env: "CADDY", def: "bin/caddy", install: "make caddy"}
	// Traefik is the pinned traefik, whose ForwardAuth middleware the gateway tests
	// (test/gateways) run in front of limiterd.
	Traefik = Program{name: "traefik", env: "TRAEFIK", def: "bin/traefik", install: "make traefik"}
	// Limiterd and Manager are the project's binaries, built from this checkout.
	Limiterd = Program{name: "limiterd", env: "LIMITERD_BIN_DIR", envDir: true, def: "bin", install: "make build", source: true}
	Manager  = Program{name: "manager", env: "LIMITERD_BIN_DIR", envDir: true, def: "bin", install: "make build", source: true}
	// RedisServer and RedisCLI come from Debian's redis-server and redis-tools, on $PATH.
	RedisServer = Program{name: "redis-server", install: "apt-get install redis-server redis-tools"}
	RedisCLI    = Program{name: "redis-cli", install: "apt-get install redis-server redis-tools"}
	// Curl comes from Debian's curl (7.82 or later, for --json), on $PATH: test/e2e runs the
	// README's quick start with it.
	Curl = Program{name: "curl", install: "apt-get install curl"}
	// Nginx comes from Debian's nginx-light (with ngx_http_auth_request_module), on $PATH: the
	// gateway tests (test/gateways) run it in front of limiterd.
	Nginx = Program{name: "nginx", install: "apt-get install nginx-light"}
)

// Path returns the program's path, or an error naming the command that installs it (and, for a
// project binary older than a source file, the file).
func (p Program) Path() (string, error) {
	path, err := p.path()
	if err == nil && p.source {
		err = checkFresh(path)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w: run `%s`", p.name, err, p.install)
	}
	return path, nil
}

func (p Program) path() (string, error) {
	if p.env == "" {
		path, err := exec.LookPath(p.name)
		if err != nil {
			return "", errors.New("not found on $PATH")
		}
		return path, nil
	}
	loc, from := os.Getenv(p.env), p.env
	if loc == "" {
		root, err := Root()
		if err != nil {
			return "", err
		}
		loc, from = filepath.Join(root, p.def), p.env+" unset, default"
	}
	if p.envDir {
		loc = filepath.Join(loc, p.name)
	}
	info, err := os.Stat(loc)
	if err != nil {
		return "", fmt.Errorf("not found at %s (%s)", loc, from)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s is not an executable file", loc)
	}
	return loc, nil
}

var newest struct {
	sync.Once
	path string
	mod  time.Time
	err  error
}

// checkFresh fails when a Go source file of the module (or go.mod, go.sum) changed after the
// binary was built, so that no test runs a stale binary.
func checkFresh(binary string) error {
	newest.Do(func() { newest.path, newest.mod, newest.err = newestSource() })
	if newest.err != nil {
		return newest.err
	}
	info, err := os.Stat(binary)
	if err != nil {
		return fmt.Errorf("check %s is current: %w", binary, err)
	}
	if newest.mod.After(info.ModTime()) {
		return fmt.Errorf("%s is older than %s", binary, newest.path)
	}
	return nil
}

// newestSource returns the most recently modified non-test Go file of the module, go.mod or
// go.sum. Directories of other modules (hack/tools, nested go.mod files), bin/ and testdata/ are
// not the module's sources.
func newestSource() (string, time.Time, error) {
	root, err := Root()
	if err != nil {
		return "", time.Time{}, err
	}
	var path string
	var mod time.Time
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "hack" || name == "testdata" || exists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if (strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go")) || (filepath.Dir(p) == root && (name == "go.mod" || name == "go.sum")) {
			info, err := d.Info()
			if err != nil {
				return fmt.Errorf("stat %s: %w", p, err)
			}
			if info.ModTime().After(mod) {
				path, mod = p, info.ModTime()
			}
		}
		return nil
	})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("find the newest source file: %w", err)
	}
	return path, mod, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

var failed sync.Map // Program.name → the name of the test that reported it missing

// Need returns the program's path, or ends t: skipped under -short; otherwise failed, naming the
// command that installs the program, by the first test of the binary that needs it, and skipped,
// pointing at that failure, in the tests after it.
func Need(t testing.TB, p Program) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("skipped under -short: needs %s", p.name)
		return ""
	}
	path, err := p.Path()
	if err == nil {
		return path
	}
	if first, seen := failed.LoadOrStore(p.name, t.Name()); seen {
		t.Skipf("needs %s, which is missing: see the failure of %s", p.name, first)
		return ""
	}
	t.Fatalf("%v", err)
	return ""
}

// SkipIfShort skips t under -short, saying what it needs. Use it in tests that need a program
// only through a helper that finds it later, or that are slow for another reason.
func SkipIfShort(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("skipped under -short: needs %s", needs)
	}
}

// Root returns the root directory of the limiterd module, found from the working directory up.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && moduleLine(mod) == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find module root: no go.mod of module " + modulePath + " above the working directory")
		}
		dir = parent
	}
}

func moduleLine(gomod []byte) string {
	for line := range bytes.Lines(gomod) {
		if rest, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("module ")); ok {
			return strings.Trim(string(bytes.TrimSpace(rest)), `"`)
		}
	}
	return ""
}
