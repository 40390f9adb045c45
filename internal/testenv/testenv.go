// Package testenv runs a real Kubernetes control plane (etcd and kube-apiserver, through
// controller-runtime's envtest) for integration tests, with the RateLimitPolicy CRDs of
// config/crd/bases installed.
//
// The control plane binaries (kube-apiserver, etcd) come from the directory named by
// KUBEBUILDER_ASSETS, by default bin/k8s/current; `make envtest` builds them, and every test
// target of the Makefile runs it first (see internal/testbin). Under `go test -short` the tests
// that need a control plane are skipped.
//
// Typical use, one control plane per test binary:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		env := testenv.Shared(t)
//		ns := env.Namespace(t)
//		...
//	}
//
// Tests that stop or restart the API server take their own control plane with New.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testbin"
)

// Env is a running control plane.
type Env struct {
	// Environment is the underlying envtest environment. Environment.ControlPlane.APIServer and
	// Environment.ControlPlane.Etcd are the two processes.
	Environment *envtest.Environment
	// Config authenticates as an administrator (group system:masters).
	Config *rest.Config
	// Scheme is NewScheme().
	Scheme *runtime.Scheme
	// Client is an uncached client for Config and Scheme.
	Client client.WithWatch

	dir        string // private working directory, removed by Stop
	kubeconfig string // administrator kubeconfig file, inside dir
	stopOnce   sync.Once
	stopErr    error
}

// NewScheme returns a scheme with the client-go types, CustomResourceDefinitions and
// limiterd.dev/v1alpha1.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	utilruntime.Must(limiterdv1alpha1.AddToScheme(s))
	return s
}

// Root returns the root directory of the limiterd module, found from the working directory up.
func Root() (string, error) { return testbin.Root() }

// AssetsDir returns the directory holding kube-apiserver and etcd: KUBEBUILDER_ASSETS, by default
// bin/k8s/current. It errs, naming `make envtest`, when either is missing.
func AssetsDir() (string, error) {
	var dir string
	for _, p := range []testbin.Program{testbin.KubeAPIServer, testbin.Etcd} {
		path, err := p.Path()
		if err != nil {
			return "", err
		}
		dir = filepath.Dir(path)
	}
	return dir, nil
}

// NeedAssets returns AssetsDir, or ends t when the control plane binaries are missing: skipped
// under -short, failed (once per test binary, naming `make envtest`) otherwise. New and Shared
// call it; a test that starts an envtest.Environment of its own calls it first.
func NeedAssets(t testing.TB) string {
	t.Helper()
	testbin.Need(t, testbin.Etcd)
	return filepath.Dir(testbin.Need(t, testbin.KubeAPIServer))
}

// Start starts a control plane and installs the CRDs of config/crd/bases. Stop it with Stop.
func Start() (*Env, error) { return start(true) }

// start starts a control plane, with the CRDs of config/crd/bases installed if crds is set.
func start(crds bool) (_ *Env, err error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	root, err := Root()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "limiterd-testenv-")
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	// The API server's certificates live in a directory of ours rather than one envtest removes
	// on Stop, so that the API server restarts with the same serving certificate and port, and
	// existing clients and kubeconfig files keep working.
	certDir := filepath.Join(dir, "apiserver")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	scheme := NewScheme()
	var crdPaths []string
	if crds {
		crdPaths = []string{filepath.Join(root, "config", "crd", "bases")}
	}
	te := &envtest.Environment{
		// CPUs are shared with other tests: give the processes longer than envtest's 20s to start.
		ControlPlaneStartTimeout: startTimeout(),
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        crdPaths,
		ErrorIfCRDPathMissing:    crds,
		Scheme:                   scheme,
		ControlPlane: envtest.ControlPlane{
			APIServer: &envtest.APIServer{CertDir: certDir},
		},
	}
	// Open watches would otherwise hold a stopping API server for its whole shutdown timeout.
	te.ControlPlane.APIServer.Configure().Set("shutdown-send-retry-after", "true")
	cfg, err := te.Start()
	if err != nil {
		_ = te.Stop()
		return nil, fmt.Errorf("start control plane (assets %s): %w", assets, err)
	}
	e := &Env{Environment: te, Config: cfg, Scheme: scheme, dir: dir}
	defer func() {
		if err != nil {
			_ = te.Stop()
		}
	}()
	if e.Client, err = client.NewWithWatch(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	e.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(e.kubeconfig, te.KubeConfig, 0o600); err != nil {
		return nil, fmt.Errorf("write kubeconfig: %w", err)
	}
	return e, nil
}

// startTimeout is how long each control plane process may take to start:
// KUBEBUILDER_CONTROLPLANE_START_TIMEOUT if set (envtest reads it), else 90s.
func startTimeout() time.Duration {
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") != "" {
		return 0 // envtest's default: the variable
	}
	return 90 * time.Second
}

// Stop stops the control plane and removes its files. Later calls return the first result.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		e.stopErr = e.Environment.Stop()
		if err := os.RemoveAll(e.dir); err != nil {
			e.stopErr = errors.Join(e.stopErr, err)
		}
		if e.stopErr != nil {
			e.stopErr = fmt.Errorf("stop control plane: %w", e.stopErr)
		}
	})
	return e.stopErr
}

// KubeconfigPath returns the path of a kubeconfig file for Config (an administrator), for
// subprocesses such as kubectl, bin/manager and bin/limiterd. It stays valid across
// RestartAPIServer.
func (e *Env) KubeconfigPath() string { return e.kubeconfig }

// UserKubeconfig provisions a user authenticated by client certificate, writes a kubeconfig file
// for it and returns the file's path. The user has only the permissions RBAC grants it: a service
// account's is named "system:serviceaccount:<namespace>:<name>" with groups
// "system:serviceaccounts" and "system:serviceaccounts:<namespace>".
func (e *Env) UserKubeconfig(user envtest.User) (string, error) {
	u, err := e.Environment.AddUser(user, e.Config)
	if err != nil {
		return "", fmt.Errorf("provision user %s: %w", user.Name, err)
	}
	data, err := u.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("kubeconfig of user %s: %w", user.Name, err)
	}
	f, err := os.CreateTemp(e.dir, "kubeconfig-user-")
	if err != nil {
		return "", fmt.Errorf("write kubeconfig of user %s: %w", user.Name, err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("write kubeconfig of user %s: %w", user.Name, err)
	}
	return f.Name(), nil
}

// Command returns a command for a subprocess with KUBECONFIG set to KubeconfigPath and the rest
// of the environment inherited.
func (e *Env) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
	return cmd
}

// StopAPIServer stops the API server and leaves etcd running.
func (e *Env) StopAPIServer() error {
	if err := e.Environment.ControlPlane.APIServer.Stop(); err != nil {
		return fmt.Errorf("stop API server: %w", err)
	}
	return nil
}

// StartAPIServer starts the API server stopped by StopAPIServer on the same port, etcd and
// certificates, and returns once it reports healthy.
func (e *Env) StartAPIServer() error {
	if err := e.Environment.ControlPlane.APIServer.Start(); err != nil {
		return fmt.Errorf("start API server: %w", err)
	}
	return nil
}

// RestartAPIServer stops and starts the API server; the stored objects survive in etcd.
func (e *Env) RestartAPIServer() error {
	if err := e.StopAPIServer(); err != nil {
		return err
	}
	return e.StartAPIServer()
}

// Namespace creates a namespace with a unique name for t and returns its name. Namespaces are
// not removed: the test control plane has no namespace controller to finish their deletion.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// New starts a control plane for t alone, stopped when t ends. Use it when a test stops or
// restarts the API server; otherwise share one with Shared.
func New(t testing.TB) *Env { return newEnv(t, true) }

// NewWithoutCRDs is New with no CRD installed, for a test that installs them as a user does.
func NewWithoutCRDs(t testing.TB) *Env { return newEnv(t, false) }

func newEnv(t testing.TB, crds bool) *Env {
	t.Helper()
	NeedAssets(t)
	e, err := start(crds)
	if err != nil {
		t.Fatalf("test control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return e
}

var shared struct {
	once    sync.Once
	env     *Env
	err     error
	mu      sync.Mutex
	stopped bool
}

// Shared returns the control plane shared by every test of the binary, starting it on first use.
// TestMain must call Main (or StopShared) so that it is stopped. Tests sharing it isolate
// themselves by namespace (see Namespace) and must not stop or restart it.
func Shared(t testing.TB) *Env {
	t.Helper()
	NeedAssets(t)
	shared.once.Do(func() {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		if shared.stopped {
			shared.err = errors.New("shared control plane used after StopShared")
			return
		}
		shared.env, shared.err = Start()
	})
	if shared.err != nil {
		t.Fatalf("shared test control plane: %v", shared.err)
	}
	return shared.env
}

// StopShared stops the shared control plane if it was started.
func StopShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.stopped = true
	if shared.env == nil {
		return nil
	}
	return shared.env.Stop()
}

// Main runs the tests of m, stops the shared control plane and exits. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if err := StopShared(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
