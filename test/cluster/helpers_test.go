// Package cluster runs limiterd as users run it: the images `make images` built, installed with
// the Helm chart on a real single-node cluster (hack/node/node.sh: kubelet, containerd, runc, CNI
// bridge, kube-proxy), serving through a Service. `make test-cluster` runs it (as root, with the
// node's binaries and images built first); elsewhere it is skipped.
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
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

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
)

// The environment `make test-cluster` passes (see NODE_ENV in the Makefile).
var requiredEnv = []string{"NODE_BIN", "ENVTEST_BIN", "PAUSE_IMAGE_ARCHIVE", "NODE_IMAGES", "HELM", "IMG_LIMITERD", "IMG_MANAGER"}

// prerequisites skips the test unless `make test-cluster` runs it with everything in place; under
// CI a missing piece fails instead, so that CI cannot pass by skipping.
func prerequisites(t *testing.T) {
	t.Helper()
	if os.Getenv("LIMITERD_TEST_CLUSTER") != "1" {
		t.Skip("the single-node cluster test runs only through `make test-cluster` (LIMITERD_TEST_CLUSTER=1)")
	}
	if testing.Short() {
		t.Skip("-short: the single-node cluster test takes minutes")
	}
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (it starts containerd and the kubelet)")
	}
	for _, v := range requiredEnv {
		if os.Getenv(v) == "" {
			missing = append(missing, "$"+v)
		}
	}
	for _, f := range append(strings.Fields(os.Getenv("NODE_IMAGES")), os.Getenv("PAUSE_IMAGE_ARCHIVE"), os.Getenv("HELM")) {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	for _, b := range []string{"containerd", "runc", "ctr", "iptables", "conntrack", "redis-server", "curl", "jq", "openssl"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("the single-node cluster test needs %s: run `make test-cluster` as root, "+
			"after `apt-get install containerd runc containernetworking-plugins iptables conntrack redis-server curl jq`",
			strings.Join(missing, ", "))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// lockNode serialises tests that start the node (one bridge, one set of ports per machine).
func lockNode(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/run/lock/limiterd-node.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("open the node lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("lock the node: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// command runs name with args in the repository root and returns its stdout; stderr is logged.
func command(t *testing.T, ctx context.Context, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = repoRoot(t)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if errOut.Len() > 0 {
		t.Logf("%s %s:\n%s", filepath.Base(name), strings.Join(args, " "), lastLines(errOut.String(), 40))
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, lastLines(errOut.String(), 40))
	}
	return out.String(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// node is the running single-node cluster.
type node struct {
	dir, ip, kubeconfig string
	env                 map[string]string
	config              *rest.Config
	cs                  *kubernetes.Clientset
	c                   client.Client
}

func nodeScript(t *testing.T) string { return filepath.Join(repoRoot(t), "hack", "node", "node.sh") }

// startNode runs `node.sh up` and stops the node when the test ends (LIMITERD_KEEP_NODE=1 keeps it).
func startNode(t *testing.T) *node {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := command(t, ctx, nodeScript(t), "up")
	if err != nil {
		t.Fatalf("start the node: %v", err)
	}
	t.Logf("node Ready in %v", time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if os.Getenv("LIMITERD_KEEP_NODE") == "1" {
			t.Logf("LIMITERD_KEEP_NODE=1: the node keeps running; stop it with make node-down")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // the test's context is done
		defer cancel()
		if _, err := command(t, ctx, nodeScript(t), "down"); err != nil {
			t.Errorf("stop the node: %v", err)
		}
	})
	envOut, err := command(t, ctx, nodeScript(t), "env")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{env: map[string]string{}}
	for _, l := range strings.Split(strings.TrimSpace(envOut), "\n") {
		k, v, _ := strings.Cut(l, "=")
		n.env[k] = v
	}
	n.dir, n.ip, n.kubeconfig = n.env["NODE_DIR"], n.env["NODE_IP"], strings.TrimSpace(out)
	if n.kubeconfig != n.env["KUBECONFIG"] {
		t.Fatalf("node.sh up printed %q, env says KUBECONFIG=%s", out, n.env["KUBECONFIG"])
	}
	n.config, err = clientcmd.BuildConfigFromFlags("", n.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	n.config.QPS, n.config.Burst = 50, 100
	n.cs = kubernetes.NewForConfigOrDie(n.config)
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, limiterdv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	ctrllog.SetLogger(logr.Discard())
	n.c, err = client.New(n.config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// helm runs the pinned helm against the node.
func (n *node) helm(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := command(t, ctx, os.Getenv("HELM"), append([]string{"--kubeconfig", n.kubeconfig}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// decision is one answer of the decisions API.
type decision struct {
	status     int
	retryAfter string
}

// allow asks url (http://host:port) for a decision for key under policy.
func allow(c *http.Client, url, policy, key string) (decision, error) {
	resp, err := c.Get(fmt.Sprintf("%s/v1/allow?policy=%s&key=%s", url, policy, key))
	if err != nil {
		return decision{}, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return decision{}, err
	}
	return decision{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}, nil
}

// series is one sample line of a Prometheus text exposition.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// parseMetrics reads the samples of a Prometheus text exposition.
func parseMetrics(r io.Reader) ([]series, error) {
	var out []series
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unparsable metrics line %q", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: value: %w", line, err)
		}
		se := series{name: m[1], labels: map[string]string{}, value: v}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			se.labels[p[1]] = p[2]
		}
		out = append(out, se)
	}
	return out, s.Err()
}
