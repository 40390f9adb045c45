package main

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/replicastatus"
)

// outsideCluster makes rest.InClusterConfig report that limiterd does not run in a pod.
func outsideCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
}

func TestKubeFlags(t *testing.T) {
	outsideCluster(t)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parseFlags([]string{"--kubeconfig", "kc"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.kube
	if !k.enabled || k.namespace != "" || k.configMapNamespace != v1alpha1.DefaultReplicaStatusNamespace || k.replicaName != strings.ToLower(host) ||
		k.statusNamespace != replicastatus.DefaultNamespace || k.statusInterval != replicastatus.DefaultInterval {
		t.Errorf("defaults with --kubeconfig: %+v", k)
	}

	cfg, err = parseFlags([]string{"--kubeconfig", "kc", "--configmap-namespace", "limiterd", "--namespace", "shop", "--replica-name", "limiterd-0",
		"--status-namespace", "ops", "--status-interval", "2s", "--policy-file", "extra.yaml"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	k = cfg.kube
	if !k.enabled || k.configMapNamespace != "limiterd" || k.namespace != "shop" || k.replicaName != "limiterd-0" || k.statusNamespace != "ops" ||
		k.statusInterval != 2*time.Second || len(cfg.policyFiles) != 1 {
		t.Errorf("explicit flags: %+v, files %v", k, cfg.policyFiles)
	}

	cfg, err = parseFlags([]string{"--policy-file", "a.yaml"}, io.Discard)
	if err != nil || cfg.kube.enabled {
		t.Errorf("file mode outside a cluster: kube enabled %v, %v", cfg.kube.enabled, err)
	}

	for args, want := range map[string]string{
		"":                                 "no policy source",
		"--policy-file a --namespace shop": "--namespace need --kubeconfig",
		"--policy-file a --configmap-namespace x":               "--configmap-namespace need --kubeconfig",
		"--policy-file a --status-interval 1s":                  "--status-interval need --kubeconfig",
		"--kubeconfig kc --status-interval -1s":                 "must not be negative",
		"--policy-file a --replica-name x --status-namespace y": "--replica-name, --status-namespace need --kubeconfig",
	} {
		_, err := parseFlags(strings.Fields(args), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", args, err, want)
		}
	}
}

func TestKubeconfigMustLoad(t *testing.T) {
	outsideCluster(t)
	cfg, err := parseFlags([]string{"--kubeconfig", t.TempDir() + "/missing"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newDaemon(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("newDaemon with a missing kubeconfig: %v, want an error naming --kubeconfig", err)
	}
}
