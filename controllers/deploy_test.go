package controllers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

const systemNamespace = "limiterd-system"

// TestDeployConfigDefault applies `kubectl kustomize config/default` to the API server with
// server-side apply, checks the secure defaults of what it created, then runs bin/manager (built
// from this checkout by `make build`) with the permissions of the operator's service account only, to show the
// RBAC generated from the markers is enough. It does not run in parallel: the operator it starts
// watches every namespace.
func TestDeployConfigDefault(t *testing.T) {
	manager := testbin.Need(t, testbin.Manager)
	env := testenv.Shared(t)
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	rendered := run(t, env.Command(ctx, "kubectl", "kustomize", filepath.Join(root, "config", "default")), nil)
	// Namespaced objects need their namespace first.
	var namespaces, rest bytes.Buffer
	for _, obj := range decodeObjects(t, rendered) {
		out := &rest
		if obj.GetKind() == "Namespace" {
			out = &namespaces
		}
		j, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		out.Write(j)
		out.WriteByte('\n')
	}
	apply := func(objs []byte) {
		run(t, env.Command(ctx, "kubectl", "apply", "--server-side", "--field-manager=limiterd-test", "-f", "-"), objs)
	}
	apply(namespaces.Bytes())
	apply(rest.Bytes())

	t.Run("secure defaults", func(t *testing.T) {
		for _, name := range []string{"limiterd-operator", "limiterd"} {
			d := &appsv1.Deployment{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: name}, d); err != nil {
				t.Fatal(err)
			}
			checkPodSecurity(t, name, &d.Spec.Template.Spec)
		}
		svc := &corev1.Service{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: "limiterd"}, svc); err != nil {
			t.Fatal(err)
		}
		ports := map[string]int32{}
		for _, p := range svc.Spec.Ports {
			ports[p.Name] = p.Port
		}
		if ports["decisions"] != 8080 || ports["admin"] != 9090 || len(ports) != 2 {
			t.Errorf("Service limiterd ports %v, want decisions 8080 and admin 9090", ports)
		}
	})

	t.Run("operator with its service account", func(t *testing.T) {
		runManagerAsServiceAccount(t, env, manager)
	})
}

func checkPodSecurity(t *testing.T, name string, spec *corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil ||
		psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("Deployment %s: pod security context %+v, want runAsNonRoot and seccomp RuntimeDefault", name, psc)
	}
	for _, c := range spec.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("Deployment %s container %s: security context %+v, want a read-only root, no privilege escalation, all capabilities dropped", name, c.Name, sc)
		}
		if c.LivenessProbe == nil || c.ReadinessProbe == nil {
			t.Errorf("Deployment %s container %s: want liveness and readiness probes", name, c.Name)
		}
	}
}

// runManagerAsServiceAccount runs bin/manager as the operator's service account would, with
// leader election, and checks it renders a policy, restores a deleted ConfigMap (an event) and
// answers its probes.
func runManagerAsServiceAccount(t *testing.T, env *testenv.Env, manager string) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	kubeconfig, err := env.UserKubeconfig(envtest.User{
		Name:   "system:serviceaccount:" + systemNamespace + ":limiterd-operator",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + systemNamespace},
	})
	if err != nil {
		t.Fatal(err)
	}
	probes := freeAddr(t)
	cmd := exec.CommandContext(ctx, manager, "--leader-elect", "--leader-election-namespace="+systemNamespace,
		"--health-probe-bind-address="+probes, "--metrics-bind-address=0", "--zap-log-level=debug")
	cmd.Env = []string{"KUBECONFIG=" + kubeconfig}
	logs := &testsupport.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("manager exited after SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("manager did not exit within 30s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("manager logs:\n%s", logs.String())
		}
	}()

	for _, path := range []string{"/healthz", "/readyz"} {
		testsupport.Eventually(t, timeout, "probe "+path, func() error { return probe("http://" + probes + path) })
	}

	ns := env.Namespace(t)
	p := newPolicy(ns, "deployed")
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)
	cm := getConfigMap(t, env.Client, systemNamespace, p)
	checkConfigMap(t, cm, p)
	if err := env.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, env.Client, p, corev1.EventTypeNormal, ReasonRestored)
	checkConfigMap(t, getConfigMap(t, env.Client, systemNamespace, p), p)

	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: "limiterd-operator.limiterd.dev"}, lease); err != nil {
		t.Errorf("leader election Lease: %v", err)
	}
}

// run runs cmd with stdin and returns its stdout; it fails t with stderr if cmd fails.
func run(t *testing.T, cmd *exec.Cmd, stdin []byte) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, stderr.String())
	}
	return stdout.Bytes()
}

func decodeObjects(t *testing.T, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decode kustomize output: %v", err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
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

func probe(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
