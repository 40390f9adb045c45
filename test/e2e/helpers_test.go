// Package e2e runs the operator (bin/manager) and limiterd (bin/limiterd), built from this
// checkout by `make build` (see internal/testbin), as processes against a real control plane (internal/testenv), and drives them with
// kubectl as a user would.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// waitTimeout bounds waits that have no deadline of their own; generous, as CPUs are shared.
const waitTimeout = 60 * time.Second

// statusNamespace is where the test's limiterd replicas publish their status, the operator's
// default.
const statusNamespace = "limiterd-system"

func TestMain(m *testing.M) {
	// The tests talk to loopback servers only; make sure no proxy setting sends them elsewhere.
	for _, v := range []string{"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"} {
		os.Unsetenv(v)
	}
	testenv.Main(m) // exits
}

// binaries returns the paths of bin/manager and bin/limiterd.
func binaries(t *testing.T) (manager, limiterd string) {
	t.Helper()
	return testbin.Need(t, testbin.Manager), testbin.Need(t, testbin.Limiterd)
}

// process is a subprocess of the test.
type process struct {
	name   string
	cmd    *exec.Cmd
	logs   *testsupport.SyncBuffer
	exited chan struct{} // closed when it exited
	err    error         // its exit status, once exited is closed
}

// startProcess starts binary with args and KUBECONFIG=kubeconfig. It is stopped (SIGTERM, then
// SIGKILL after 30s) when t ends, and its logs are printed if t failed.
func startProcess(t *testing.T, name, kubeconfig, binary string, args ...string) *process {
	t.Helper()
	p := &process{name: name, cmd: exec.Command(binary, args...), logs: &testsupport.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, p.logs)
		}
	})
	return p
}

// running reports whether the process has not exited.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop stops the process gracefully (SIGTERM) and waits for it; a graceful stop must succeed.
func (p *process) stop(t *testing.T) {
	t.Helper()
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("%s exited after SIGTERM: %v", p.name, p.err)
		}
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Errorf("%s did not exit within 30s of SIGTERM", p.name)
	}
}

// kill kills the process (SIGKILL), as a crash would, and waits for it.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// kubectl runs kubectl as the administrator with stdin, and returns its stdout and stderr.
func kubectl(env *testenv.Env, stdin string, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cmd := env.Command(ctx, "kubectl", args...)
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// mustKubectl is kubectl that fails t on error.
func mustKubectl(t *testing.T, env *testenv.Env, stdin string, args ...string) string {
	t.Helper()
	out, errOut, err := kubectl(env, stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// installCRDWithKubectl installs the CRD with kubectl from config/crd/bases, as a user does,
// on a control plane started without it (testenv.NewWithoutCRDs).
func installCRDWithKubectl(t *testing.T, env *testenv.Env) {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	mustKubectl(t, env, "", "apply", "-f", filepath.Join(root, "config", "crd", "bases"))
	mustKubectl(t, env, "", "wait", "--for=condition=Established", "--timeout=60s", "crd/ratelimitpolicies.limiterd.dev")
	// The API server's discovery learns the new kind: wait until a list succeeds.
	testsupport.Eventually(t, waitTimeout, "ratelimitpolicies served", func() error {
		_, errOut, err := kubectl(env, "", "get", "ratelimitpolicies", "--all-namespaces")
		if err != nil {
			return fmt.Errorf("%w: %s", err, errOut)
		}
		return nil
	})
}

// createNamespace creates a namespace of that name.
func createNamespace(t *testing.T, env *testenv.Env, name string) {
	t.Helper()
	mustKubectl(t, env, "", "create", "namespace", name)
}

// freeAddr returns a loopback address with a port free at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// limiterd is a running limiterd process with its HTTP addresses.
type limiterd struct {
	*process
	decisions, admin string // base URLs
}

// startLimiterd runs bin/limiterd with the kubeconfig and args, on free loopback ports, and
// waits until it is ready.
func startLimiterd(t *testing.T, name, kubeconfig, binary string, args ...string) *limiterd {
	t.Helper()
	decisions, admin := freeAddr(t), freeAddr(t)
	// Admin authentication has tests of its own (cmd/limiterd); here /metrics is read without.
	// No shutdown delay: nothing routes to these processes, and stops are awaited.
	args = append([]string{"--kubeconfig", kubeconfig, "--addr", decisions, "--admin-addr", admin, "--admin-insecure-no-auth",
		"--shutdown-delay", "0s"}, args...)
	l := &limiterd{process: startProcess(t, name, kubeconfig, binary, args...), decisions: "http://" + decisions, admin: "http://" + admin}
	testsupport.Eventually(t, waitTimeout, name+" ready", func() error {
		if !l.running() {
			t.Fatalf("%s exited: %v\n%s", name, l.err, l.logs)
		}
		return get(l.admin + "/readyz")
	})
	return l
}

// get fails unless GET url answers 200.
func get(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s %s", url, resp.Status, body)
	}
	return nil
}

// answer is a decision's answer.
type answer struct {
	status int
	body   struct {
		Allowed bool   `json:"allowed"`
		Limit   *int64 `json:"limit"`
		Error   string `json:"error"`
	}
}

// decide asks limiterd at base URL for one unit of policy for key.
func decide(c *http.Client, base, policy, key string) (answer, error) {
	var a answer
	resp, err := c.Get(base + "/v1/allow?policy=" + policy + "&key=" + key)
	if err != nil {
		return a, err
	}
	defer resp.Body.Close()
	a.status = resp.StatusCode
	if err := json.NewDecoder(resp.Body).Decode(&a.body); err != nil {
		return a, fmt.Errorf("decode answer %d: %w", a.status, err)
	}
	return a, nil
}

// limitOf is the limit an answer reports: "none" for a tier without one.
func (a answer) limitOf() string {
	if a.body.Limit == nil {
		return "none"
	}
	return strconv.FormatInt(*a.body.Limit, 10)
}

// processStartTime returns limiterd's process_start_time_seconds.
func processStartTime(t *testing.T, admin string) string {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^process_start_time_seconds (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no process_start_time_seconds in /metrics")
	}
	return string(m[1])
}

// impersonatingKubeconfig writes a kubeconfig that authenticates as the administrator of env and
// impersonates limiterd's service account in a pod named pod (as a bound service account token
// would identify it: the pod name in the user's extra), and returns its path.
func impersonatingKubeconfig(t *testing.T, env *testenv.Env, pod string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range cfg.AuthInfos {
		auth.Impersonate = "system:serviceaccount:" + statusNamespace + ":limiterd"
		auth.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + statusNamespace, "system:authenticated"}
		auth.ImpersonateUserExtra = nil
		if pod != "" {
			auth.ImpersonateUserExtra = map[string][]string{"authentication.kubernetes.io/pod-name": {pod}}
		}
	}
	path := filepath.Join(t.TempDir(), "kubeconfig-"+pod)
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// clientFor returns a client for the kubeconfig file.
func clientFor(t *testing.T, env *testenv.Env, kubeconfig string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
