package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/incluster"
	"github.com/limiterd/limiterd/limiterd/replicastatus"
	"github.com/limiterd/limiterd/limiterd/server"
	"github.com/limiterd/limiterd/limiterd/source"
)

// kubeConfig is what the Kubernetes flags say: whether policies come from the operator's
// ConfigMaps, and where this replica publishes its status.
type kubeConfig struct {
	kubeconfig         string
	configMapNamespace string
	namespace          string
	replicaName        string
	statusNamespace    string
	statusInterval     time.Duration
	podUID             string

	enabled bool         // policies come from ConfigMaps
	rest    *rest.Config // the in-cluster configuration, when used
}

// register adds the Kubernetes flags to fs.
func (c *kubeConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "",
		"`path` of a kubeconfig file: read policies from the operator's ConfigMaps on that cluster "+
			"(in a pod, without --policy-file or --kubeconfig, the in-cluster configuration is used)")
	fs.StringVar(&c.configMapNamespace, "configmap-namespace", "",
		"`namespace` of the policy ConfigMaps, where the operator renders them; the only one whose ConfigMaps are read "+
			"(default: the pod's namespace, else "+v1alpha1.DefaultReplicaStatusNamespace+", the operator's default)")
	fs.StringVar(&c.namespace, "namespace", "", "serve the policies of this `namespace` only (default: every namespace)")
	fs.StringVar(&c.replicaName, "replica-name", "",
		"`name` of this replica's status Lease: its pod name (default: the host name, which is the pod name in a pod)")
	fs.StringVar(&c.statusNamespace, "status-namespace", "",
		"`namespace` of the replicas' status Leases (default: the pod's namespace, else "+replicastatus.DefaultNamespace+")")
	fs.DurationVar(&c.statusInterval, "status-interval", replicastatus.DefaultInterval,
		"how often this replica renews its status Lease, which expires after 3 intervals (0: publish no status)")
	fs.StringVar(&c.podUID, "pod-uid", "",
		"`UID` of this replica's pod, named --replica-name: its status Lease is owned by the pod and deleted with it (default: none)")
}

// check resolves the Kubernetes flags after parsing. Policies come from ConfigMaps with
// --kubeconfig, or, when neither it nor a policy file is given, with the in-cluster
// configuration if limiterd runs in a pod.
func (c *kubeConfig) check(fs *flag.FlagSet, policyFiles bool) error {
	switch {
	case c.kubeconfig != "":
		c.enabled = true
	case !policyFiles:
		cfg, err := rest.InClusterConfig()
		switch {
		case errors.Is(err, rest.ErrNotInCluster):
		case err != nil:
			return fmt.Errorf("in-cluster Kubernetes configuration: %w", err)
		default:
			c.enabled, c.rest = true, cfg
		}
	}
	if !c.enabled {
		var kubeFlags []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "configmap-namespace", "namespace", "replica-name", "status-namespace", "status-interval", "pod-uid":
				kubeFlags = append(kubeFlags, "--"+f.Name)
			}
		})
		if len(kubeFlags) > 0 {
			return fmt.Errorf("%s need --kubeconfig (or running in a pod without --policy-file)", strings.Join(kubeFlags, ", "))
		}
		return nil
	}
	if c.statusInterval < 0 {
		return errors.New("--status-interval must not be negative")
	}
	if c.replicaName == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--replica-name not given and no host name: %w", err)
		}
		c.replicaName = strings.ToLower(host)
	}
	podNamespace := ""
	if c.rest != nil {
		podNamespace = incluster.Namespace()
	}
	if c.statusNamespace == "" {
		c.statusNamespace = cmp.Or(podNamespace, replicastatus.DefaultNamespace)
	}
	if c.configMapNamespace == "" {
		c.configMapNamespace = cmp.Or(podNamespace, v1alpha1.DefaultReplicaStatusNamespace)
	}
	return nil
}

// restConfig returns the configuration of the API server's client.
func (c *kubeConfig) restConfig() (*rest.Config, error) {
	cfg := c.rest
	if cfg == nil {
		var err error
		if cfg, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
			return nil, fmt.Errorf("load --kubeconfig %s: %w", c.kubeconfig, err)
		}
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "limiterd"
	return cfg, nil
}

// addKube feeds d's pipeline from the policy ConfigMaps and publishes this replica's status,
// when the flags ask for it. limiterd is ready once the ConfigMaps are synced, with or without
// a policy.
func (d *daemon) addKube(c kubeConfig, tally *replicastatus.Tally) error {
	if !c.enabled {
		return nil
	}
	cfg, err := c.restConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	var publisher *replicastatus.Publisher
	kube := source.NewKube(client, d.pipeline, source.KubeOptions{
		ConfigMapNamespace: c.configMapNamespace,
		PolicyNamespace:    c.namespace,
		Logger:             d.log,
		OnChange: func() {
			if publisher != nil {
				publisher.Changed()
			}
		},
	})
	if c.statusInterval > 0 {
		publisher, err = replicastatus.NewPublisher(client.CoordinationV1(), func() v1alpha1.ReplicaRecord {
			rejections := kube.Rejections()
			r := replicastatus.Collect(d.engine.Policies(), tally, rejections)
			// Say where each policy is read from: the operator removes a policy's ConfigMap of an
			// earlier layout once no replica serves the policy without saying so.
			rejected := make(map[v1alpha1.PolicyID]string, len(rejections))
			for _, rej := range rejections {
				rejected[rej.PolicyID] = rej.ConfigMap
			}
			for id, s := range r {
				s.ConfigMap = kube.ConfigMapOf(id)
				if s.State == v1alpha1.ReplicaRejected && s.ConfigMap == "" {
					s.ConfigMap = rejected[id]
				}
				r[id] = s
			}
			return r
		}, replicastatus.PublisherOptions{
			Namespace: c.statusNamespace,
			Name:      c.replicaName,
			Interval:  c.statusInterval,
			PodUID:    types.UID(c.podUID),
			Logger:    d.log,
		})
		if err != nil {
			return err
		}
		d.background = append(d.background, publisher.Run)
	}
	d.readiness = append(d.readiness, server.ReadinessCheck{Name: "configmaps", Check: kube.Ready})
	d.background = append(d.background, kube.Run)
	d.log.Info("policy source", "kind", "configmaps", "host", cfg.Host, "configmap_namespace", c.configMapNamespace, "namespace", c.namespace,
		"replica", c.replicaName, "status_namespace", c.statusNamespace, "status_interval", c.statusInterval.String())
	return nil
}
