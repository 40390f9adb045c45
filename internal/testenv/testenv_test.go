package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
)

func TestMain(m *testing.M) { Main(m) }

func TestSharedServesTheCRD(t *testing.T) {
	env := Shared(t)
	var list limiterdv1alpha1.RateLimitPolicyList
	if err := env.Client.List(t.Context(), &list); err != nil {
		t.Fatalf("list RateLimitPolicies: %v", err)
	}
	if Shared(t) != env {
		t.Errorf("Shared started a second control plane")
	}
}

// The API server restarts on the same port with the same certificates: clients made before, and
// subprocesses given KubeconfigPath, keep working, and the objects survive in etcd.
func TestRestartAPIServer(t *testing.T) {
	env := New(t)
	ctx := t.Context()
	ns := env.Namespace(t)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kept"}, Data: map[string]string{"k": "v"}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}

	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := env.Client.Get(short, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); err == nil {
		t.Errorf("get succeeded while the API server was stopped")
	}
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	got := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cm), got); err != nil {
		t.Fatalf("get with the client made before the restart: %v", err)
	}
	if got.Data["k"] != "v" {
		t.Errorf("ConfigMap data %v after the restart, want k=v", got.Data)
	}

	if err := env.RestartAPIServer(); err != nil {
		t.Fatal(err)
	}
	out, err := env.Command(ctx, "kubectl", "get", "configmap", "-n", ns, "kept", "-o", "jsonpath={.data.k}").CombinedOutput()
	if err != nil || string(out) != "v" {
		t.Errorf("kubectl with KubeconfigPath after a restart: %q, %v", out, err)
	}
}

func TestAssetsDirFromEnvironment(t *testing.T) {
	t.Setenv("KUBEBUILDER_ASSETS", t.TempDir())
	_, err := AssetsDir()
	if err == nil || !strings.Contains(err.Error(), "KUBEBUILDER_ASSETS") || !strings.Contains(err.Error(), "make envtest") {
		t.Errorf("AssetsDir with an empty KUBEBUILDER_ASSETS: %v, want an error naming the variable and `make envtest`", err)
	}
}
