package controllers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// timeout bounds every wait on the control plane; generous, as CPUs are shared.
const timeout = 60 * time.Second

func TestMain(m *testing.M) {
	// Loggers not given to a manager (envtest's, for one) report errors only.
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapcore.ErrorLevel)))
	testenv.Main(m)
}

// startOperator runs the reconciler in a manager that watches the policies of namespace only,
// as main.go wires it, rendering into a namespace of its own, until the test ends or until the
// returned function stops it. It returns that namespace (limiterd's, as the operator sees it).
// The manager's logs are printed if t fails.
func startOperator(t *testing.T, env *testenv.Env, namespace string) (configMapNamespace string, stop func()) {
	t.Helper()
	configMapNamespace = env.Namespace(t)
	return configMapNamespace, startOperatorWith(t, env, namespace, configMapNamespace, DefaultStatusNamespace())
}

// startOperatorWith runs the operator for the policies of namespace, rendering into
// configMapNamespace and reading the replicas' status from statusNamespace, until the test ends
// or the returned function stops it. Each of configure changes the reconciler before it starts.
func startOperatorWith(t *testing.T, env *testenv.Env, namespace, configMapNamespace, statusNamespace string,
	configure ...func(*RateLimitPolicyReconciler)) (stop func()) {
	t.Helper()
	logs := &testsupport.SyncBuffer{}
	byObject := CacheByObject(configMapNamespace)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Logger:                 zap.New(zap.WriteTo(logs), zap.UseDevMode(true)),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{namespace: {}},
			ByObject:          byObject,
		},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}, // one manager per test
	})
	if err != nil {
		t.Fatalf("create manager: %v", err)
	}
	r := NewRateLimitPolicyReconciler(mgr, configMapNamespace)
	r.StatusNamespace = statusNamespace
	for _, c := range configure {
		c(r)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("operator logs:\n%s", logs.String())
		}
	})
	return stop
}

// newPolicy returns a small valid policy.
func newPolicy(namespace, name string) *limiterdv1alpha1.RateLimitPolicy {
	return &limiterdv1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: limiterdv1alpha1.RateLimitPolicySpec{
			DefaultTier: "free",
			Tiers: []limiterdv1alpha1.Tier{
				{Name: "free", Algorithm: limiterdv1alpha1.AlgorithmTokenBucket,
					TokenBucket: &limiterdv1alpha1.TokenBucket{Capacity: 20, RefillRate: 5}},
				{Name: "internal", Algorithm: limiterdv1alpha1.AlgorithmUnlimited},
			},
			Overrides: []limiterdv1alpha1.Override{
				{Tier: "internal", Clients: []string{"svc-a"}, ClientPrefixes: []string{"internal-"}},
			},
		},
	}
}

// waitReady waits until the policy's status reports generation gen with the given Ready reason,
// and returns the policy.
func waitReady(t *testing.T, c client.Client, key client.ObjectKey, gen int64, reason string) *limiterdv1alpha1.RateLimitPolicy {
	t.Helper()
	p := &limiterdv1alpha1.RateLimitPolicy{}
	testsupport.Eventually(t, timeout, "policy Ready reason "+reason, func() error {
		if err := c.Get(t.Context(), key, p); err != nil {
			return err
		}
		ready := meta.FindStatusCondition(p.Status.Conditions, ConditionReady)
		if p.Status.ObservedGeneration != gen || ready == nil || ready.ObservedGeneration != gen || ready.Reason != reason {
			return fmt.Errorf("policy %s at generation %d: status %+v, want generation %d with Ready reason %s",
				key, p.Generation, p.Status, gen, reason)
		}
		return nil
	})
	return p
}

// waitEvent waits for an event about the policy with the given type and reason, and returns it.
func waitEvent(t *testing.T, c client.Client, p *limiterdv1alpha1.RateLimitPolicy, eventType, reason string) *eventsv1.Event {
	t.Helper()
	var found *eventsv1.Event
	testsupport.Eventually(t, timeout, "policy event "+reason, func() error {
		var list eventsv1.EventList
		if err := c.List(t.Context(), &list, client.InNamespace(p.Namespace)); err != nil {
			return err
		}
		for i := range list.Items {
			e := &list.Items[i]
			if e.Regarding.UID == p.UID && e.Type == eventType && e.Reason == reason {
				found = e
				return nil
			}
		}
		return errors.New("no " + eventType + " event " + reason + " about " + p.Name)
	})
	return found
}
