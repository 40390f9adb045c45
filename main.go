// Command manager is the limiterd operator: it renders every RateLimitPolicy into a ConfigMap
// that limiterd reads. It runs in a cluster (installed by the chart, charts/limiterd) or outside one with KUBECONFIG.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	// Validate looks a quota's time zone up in the tz database: embedded, so that the scratch
	// image, which has no /usr/share/zoneinfo, knows every zone (about 400 KB).
	_ "time/tzdata"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/controllers"
)

// LeaderElectionID names the Lease that replicas of the operator elect a leader with.
const LeaderElectionID = "limiterd-operator.limiterd.dev"

func main() {
	err := run(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		ctrl.Log.WithName("setup").Error(err, "operator failed")
		os.Exit(1)
	}
}

// metricsOptions serves the metrics on addr: with secure, over HTTPS and only to callers
// authenticated by TokenReview and authorized by SubjectAccessReview (get /metrics), which needs
// the rights to create both (the RBAC markers of controllers/).
func metricsOptions(addr string, secure bool) metricsserver.Options {
	if !secure {
		return metricsserver.Options{BindAddress: addr}
	}
	return metricsserver.Options{BindAddress: addr, SecureServing: true, FilterProvider: filters.WithAuthenticationAndAuthorization}
}

func run(args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	var (
		metricsAddr             string
		metricsSecure           bool
		probeAddr               string
		leaderElect             bool
		leaderElectionNamespace string
		configMapNamespace      string
		removeLegacyConfigMaps  bool
		shutdownTimeout         time.Duration
	)
	fs.StringVar(&metricsAddr, "metrics-bind-address", ":8080", `The address the metrics endpoint binds to; "0" disables it.`)
	fs.BoolVar(&metricsSecure, "metrics-secure", true,
		"Serve /metrics over HTTPS (a self-signed certificate), to callers whose bearer token a TokenReview authenticates and "+
			"a SubjectAccessReview allows to get the non-resource URL /metrics; false serves it over HTTP to anyone (local development only).")
	fs.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "The address the health probe endpoints (/healthz, /readyz) bind to.")
	fs.BoolVar(&leaderElect, "leader-elect", false, "Elect a leader among replicas, so that one operator is active at a time.")
	fs.StringVar(&leaderElectionNamespace, "leader-election-namespace", "",
		"The namespace of the leader election Lease; defaults to the operator's own namespace in a cluster. Required with --leader-elect outside a cluster.")
	fs.StringVar(&configMapNamespace, "configmap-namespace", controllers.DefaultStatusNamespace(),
		"The namespace the policies' ConfigMaps are written to, which limiterd reads: limiterd's namespace. The operator writes ConfigMaps there only. Defaults to the operator's own namespace in a cluster, else "+limiterdv1alpha1.DefaultReplicaStatusNamespace+".")
	fs.BoolVar(&removeLegacyConfigMaps, "remove-legacy-configmaps", false,
		"Delete the ConfigMap an earlier version rendered into each policy's own namespace once no live limiterd replica serves the policy from it: "+
			"a one-time step of the upgrade from that version, which needs the right to delete ConfigMaps outside the operator's namespace "+
			"(the chart's operator.legacyConfigMapCleanup grants it). Off, those ConfigMaps are left in place, each reported by a warning event.")
	fs.DurationVar(&shutdownTimeout, "shutdown-timeout", 8*time.Second,
		"How long reconciles in flight may take to finish after SIGTERM; keep it below the pod's terminationGracePeriodSeconds.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("parse flags: %w", err) // the flag set has printed the error and usage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if shutdownTimeout <= 0 {
		return errors.New("--shutdown-timeout must be positive")
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(limiterdv1alpha1.AddToScheme(scheme))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load Kubernetes client configuration: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsOptions(metricsAddr, metricsSecure),
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: leaderElectionNamespace,
		// Stepping down on shutdown lets the next leader start at once; safe because the
		// process exits right after the manager stops.
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       &shutdownTimeout,
		Cache:                         cache.Options{ByObject: controllers.CacheByObject(configMapNamespace)},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	reconciler := controllers.NewRateLimitPolicyReconciler(mgr, configMapNamespace)
	reconciler.RemoveLegacyConfigMaps = removeLegacyConfigMaps
	if err := reconciler.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	// Not ready as soon as shutdown starts (SIGTERM), while the manager stops its controllers
	// and releases leadership.
	if err := mgr.AddReadyzCheck("shutdown", func(*http.Request) error {
		if ctx.Err() != nil {
			return errors.New("shutting down")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	// Ready once the informer caches have synced (they run on every replica, leader or not).
	if err := mgr.AddReadyzCheck("readyz", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("informer caches have not synced")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}

	log.Info("starting operator", "configMapNamespace", configMapNamespace, "removeLegacyConfigMaps", removeLegacyConfigMaps, "metricsBindAddress", metricsAddr, "metricsSecure", metricsSecure, "healthProbeBindAddress", probeAddr, "leaderElect", leaderElect)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}
