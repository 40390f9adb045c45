package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/metrics"
	"github.com/limiterd/limiterd/limiterd/server"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// swapDeadline is how soon a ConfigMap change must be served.
const swapDeadline = time.Second

// waitTimeout bounds waits on the control plane that have no deadline of their own.
const waitTimeout = 60 * time.Second

// kubeRig is a Kube source feeding an engine, with limiterd's metrics and decisions API.
type kubeRig struct {
	env       *testenv.Env
	namespace string
	engine    *engine.Engine
	metrics   *metrics.Metrics
	kube      *Kube
	decisions http.Handler
	changes   chan struct{}
}

// startKube runs a Kube source watching the ConfigMaps of namespace until t ends, serving the
// policies of policyNamespace ("": of every namespace).
func startKube(t *testing.T, env *testenv.Env, namespace, policyNamespace string) *kubeRig {
	t.Helper()
	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(testWriter{t}, nil))
	m := metrics.New(nil)
	e := engine.New(engine.Options{Observer: m})
	r := &kubeRig{env: env, namespace: namespace, engine: e, metrics: m, changes: make(chan struct{}, 1000)}
	p := NewPipeline(e, PipelineOptions{Logger: log, Observer: m})
	r.kube = NewKube(clientset, p, KubeOptions{ConfigMapNamespace: namespace, PolicyNamespace: policyNamespace, Logger: log, OnChange: func() {
		select {
		case r.changes <- struct{}{}:
		default:
		}
	}})
	r.decisions = server.NewDecisions(e, log)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.kube.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kube source: %v", err)
		}
	})
	return r
}

// waitSynced waits for the source's first sync.
func (r *kubeRig) waitSynced(t *testing.T) {
	t.Helper()
	testsupport.Eventually(t, waitTimeout, "kube source ready", func() error { return r.kube.Ready(t.Context()) })
}

// generation returns the generation of policy id the engine serves, -1 when it serves none.
func (r *kubeRig) generation(id v1alpha1.PolicyID) int64 {
	set := r.engine.Policies()
	if set == nil {
		return -1
	}
	p, ok := set.Get(id)
	if !ok {
		return -1
	}
	return p.Generation
}

// status returns the HTTP status of a decision request for policy id.
func (r *kubeRig) status(id v1alpha1.PolicyID) int {
	rec := httptest.NewRecorder()
	r.decisions.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/allow?policy="+id.String()+"&key=k", nil))
	return rec.Code
}

// reloads returns limiterd_policy_reloads_total for result.
func (r *kubeRig) reloads(t *testing.T, result string) int {
	t.Helper()
	rec := httptest.NewRecorder()
	r.metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	m := regexp.MustCompile(`(?m)^limiterd_policy_reloads_total\{result="` + result + `"\} (\d+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no reloads metric for %s in:\n%s", result, body)
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// policyConfigMap returns the ConfigMap the operator renders into namespace for policy
// "<policyNamespace>/<name>" with the capacity at generation.
func policyConfigMap(t *testing.T, namespace, policyNamespace, name string, capacity, generation int64) *corev1.ConfigMap {
	t.Helper()
	p := rlp(policyNamespace, name, capacity)
	p.Generation = generation
	data, err := v1alpha1.RenderConfigMapData(p)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      v1alpha1.ConfigMapName(p.ID()),
			Labels: map[string]string{
				v1alpha1.PolicyLabel:          v1alpha1.PolicyLabelValue(name),
				v1alpha1.PolicyNamespaceLabel: policyNamespace,
			},
			Annotations: map[string]string{v1alpha1.PolicyIDAnnotation: p.ID().String()},
		},
		Data: data,
	}
}

// put creates or updates cm, and returns when the API server has stored it.
func put(t *testing.T, c client.Client, cm *corev1.ConfigMap) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	current := &corev1.ConfigMap{}
	err := c.Get(ctx, client.ObjectKeyFromObject(cm), current)
	if err != nil {
		if err := c.Create(ctx, cm.DeepCopy()); err != nil {
			t.Fatalf("create ConfigMap %s: %v", cm.Name, err)
		}
		return
	}
	current.Labels, current.Data, current.BinaryData = cm.Labels, cm.Data, cm.BinaryData
	if err := c.Update(ctx, current); err != nil {
		t.Fatalf("update ConfigMap %s: %v", cm.Name, err)
	}
}

// waitServed waits, polling every 5ms, until the engine serves policy id at generation, and
// fails if that takes longer than within.
func (r *kubeRig) waitServed(t *testing.T, id v1alpha1.PolicyID, generation int64, within time.Duration) {
	t.Helper()
	testsupport.Eventually(t, within, fmt.Sprintf("serve %s at generation %d", id, generation), func() bool {
		return r.generation(id) == generation
	})
}

func TestKubeFollowsConfigMaps(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)   // limiterd's, where the operator renders every policy
	shop := env.Namespace(t) // the policies'
	api, other := v1alpha1.NewPolicyID(shop, "api"), v1alpha1.NewPolicyID(shop, "other")
	// Present before the watch starts: two policies, a ConfigMap without the label, and one of
	// the earlier layout, in the policy's namespace, which limiterd no longer reads.
	put(t, env.Client, policyConfigMap(t, ns, shop, "api", 10, 1))
	put(t, env.Client, policyConfigMap(t, ns, shop, "other", 5, 7))
	unlabelled := policyConfigMap(t, ns, shop, "unlabelled", 5, 1)
	unlabelled.Labels = nil
	put(t, env.Client, unlabelled)
	legacy := policyConfigMap(t, shop, shop, "legacy", 5, 1)
	legacy.Name = v1alpha1.LegacyConfigMapName("legacy")
	put(t, env.Client, legacy)

	r := startKube(t, env, ns, "")
	r.waitSynced(t)
	if g, o := r.generation(api), r.generation(other); g != 1 || o != 7 {
		t.Fatalf("after sync: serving %s at %d and %s at %d, want 1 and 7", api, g, other, o)
	}
	if got := r.generation(v1alpha1.NewPolicyID(shop, "unlabelled")); got != -1 {
		t.Errorf("an unlabelled ConfigMap is served (generation %d)", got)
	}
	if got := r.generation(v1alpha1.NewPolicyID(shop, "legacy")); got != -1 {
		t.Errorf("a ConfigMap of another namespace is served (generation %d)", got)
	}
	if code := r.status(api); code != http.StatusOK {
		t.Errorf("decision for %s: %d, want 200", api, code)
	}
	if got, want := r.kube.ConfigMapOf(api), ns+"/rlp-"+shop+".api"; got != want {
		t.Errorf("ConfigMapOf(%s) = %q, want %q", api, got, want)
	}

	t.Run("a new generation serves within 1s", func(t *testing.T) {
		for gen := int64(2); gen <= 4; gen++ {
			put(t, env.Client, policyConfigMap(t, ns, shop, "api", 10+gen, gen))
			r.waitServed(t, api, gen, swapDeadline)
			if got := r.engine.Policies(); got != nil {
				if p, _ := got.Get(api); p.Default.Limit(0).Limit() != 10+gen {
					t.Errorf("generation %d: capacity %d, want %d", gen, p.Default.Limit(0).Limit(), 10+gen)
				}
			}
		}
	})

	t.Run("unparsable data keeps the last good version", func(t *testing.T) {
		failures := r.reloads(t, metrics.ReloadFailure)
		for len(r.changes) > 0 {
			<-r.changes
		}
		bad := policyConfigMap(t, ns, shop, "api", 10, 5)
		bad.Data[v1alpha1.ConfigMapDataKey] = "spec: {tiers: [" // cut short
		put(t, env.Client, bad)
		testsupport.Eventually(t, waitTimeout, "reload failure counted", func() error {
			if got := r.reloads(t, metrics.ReloadFailure); got != failures+1 {
				return fmt.Errorf("reload failures %d, want %d", got, failures+1)
			}
			return nil
		})
		if g, o := r.generation(api), r.generation(other); g != 4 || o != 7 {
			t.Errorf("after a bad ConfigMap: serving %s at %d and %s at %d, want 4 and 7", api, g, other, o)
		}
		if code := r.status(api); code != http.StatusOK {
			t.Errorf("decision for %s: %d, want 200", api, code)
		}
		rej := r.kube.Rejections()
		if len(rej) != 1 || rej[0].PolicyID != api || rej[0].Generation != 5 || rej[0].ConfigMap != ns+"/rlp-"+shop+".api" ||
			!strings.Contains(rej[0].Err.Error(), "policy.yaml") {
			t.Errorf("rejections %+v, want %s at generation 5 naming key policy.yaml", rej, api)
		}
		if len(r.changes) == 0 {
			t.Error("OnChange not called for a rejection")
		}

		// A good version again clears the rejection.
		put(t, env.Client, policyConfigMap(t, ns, shop, "api", 10, 6))
		r.waitServed(t, api, 6, swapDeadline)
		testsupport.Eventually(t, waitTimeout, "rejections cleared by a good version", func() error {
			if rej := r.kube.Rejections(); len(rej) != 0 {
				return fmt.Errorf("rejections %+v after a good version", rej)
			}
			return nil
		})
	})

	t.Run("malformed ConfigMaps are rejected", func(t *testing.T) {
		for name, mutate := range map[string]func(cm *corev1.ConfigMap){
			"binary data":   func(cm *corev1.ConfigMap) { cm.BinaryData = map[string][]byte{"x": {1}} },
			"another name":  func(cm *corev1.ConfigMap) { cm.Name = "rlp-" + shop + ".impostor" },
			"legacy name":   func(cm *corev1.ConfigMap) { cm.Name = v1alpha1.LegacyConfigMapName("m-legacy-name") },
			"unknown key":   func(cm *corev1.ConfigMap) { cm.Data["extra"] = "x" },
			"no generation": func(cm *corev1.ConfigMap) { delete(cm.Data, v1alpha1.ConfigMapGenerationKey) },
		} {
			t.Run(name, func(t *testing.T) {
				failures := r.reloads(t, metrics.ReloadFailure)
				policy := "m-" + strings.ReplaceAll(name, " ", "-")
				cm := policyConfigMap(t, ns, shop, policy, 3, 1)
				mutate(cm)
				put(t, env.Client, cm)
				testsupport.Eventually(t, waitTimeout, "reload failure counted", func() error {
					if got := r.reloads(t, metrics.ReloadFailure); got <= failures {
						return fmt.Errorf("reload failures %d, want more than %d", got, failures)
					}
					return nil
				})
				if g := r.generation(v1alpha1.NewPolicyID(shop, policy)); g != -1 {
					t.Errorf("malformed ConfigMap served at generation %d", g)
				}
			})
		}
	})

	t.Run("a deleted ConfigMap's policy answers 404", func(t *testing.T) {
		if err := env.Client.Delete(t.Context(), policyConfigMap(t, ns, shop, "api", 10, 6)); err != nil {
			t.Fatal(err)
		}
		testsupport.Eventually(t, waitTimeout, "policy removed", func() bool { return r.generation(api) == -1 })
		if got := r.kube.ConfigMapOf(api); got != "" {
			t.Errorf("ConfigMapOf(%s) = %q after its ConfigMap was deleted", api, got)
		}
		if code := r.status(api); code != http.StatusNotFound {
			t.Errorf("decision for a removed policy: %d, want 404", code)
		}
		if o := r.generation(other); o != 7 {
			t.Errorf("%s at %d after deleting another policy, want 7", other, o)
		}
	})

	t.Run("removing the label removes the policy", func(t *testing.T) {
		cm := policyConfigMap(t, ns, shop, "other", 5, 7)
		cm.Labels = map[string]string{"app": "unrelated"}
		put(t, env.Client, cm)
		testsupport.Eventually(t, waitTimeout, "policy removed", func() bool { return r.generation(other) == -1 })
	})
}

func TestKubeSyncedWithoutPoliciesIsReady(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	r := startKube(t, env, ns, "")
	r.waitSynced(t)
	if !r.engine.Ready() {
		t.Fatal("engine not ready after a sync with no policy")
	}
	if code := r.status(v1alpha1.NewPolicyID(ns, "missing")); code != http.StatusNotFound {
		t.Errorf("decision for an unknown policy after sync: %d, want 404", code)
	}
	// The first policy then serves as usual.
	put(t, env.Client, policyConfigMap(t, ns, "shop", "late", 1, 1))
	r.waitServed(t, v1alpha1.NewPolicyID("shop", "late"), 1, swapDeadline+waitTimeout)
}

// TestKubeServesOnePolicyNamespace checks KubeOptions.PolicyNamespace: of the ConfigMaps of
// limiterd's namespace, only those of policies of that namespace are served, even one labelled
// with it by mistake.
func TestKubeServesOnePolicyNamespace(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	put(t, env.Client, policyConfigMap(t, ns, "team-a", "api", 1, 1))
	put(t, env.Client, policyConfigMap(t, ns, "shop", "api", 1, 1))
	mislabelled := policyConfigMap(t, ns, "shop", "sneaky", 1, 1)
	mislabelled.Labels[v1alpha1.PolicyNamespaceLabel] = "team-a"
	put(t, env.Client, mislabelled)

	r := startKube(t, env, ns, "team-a")
	r.waitSynced(t)
	if g := r.generation(v1alpha1.NewPolicyID("team-a", "api")); g != 1 {
		t.Errorf("team-a/api served at %d, want 1", g)
	}
	for _, id := range []v1alpha1.PolicyID{"shop/api", "shop/sneaky"} {
		if g := r.generation(id); g != -1 {
			t.Errorf("%s of another namespace served at %d", id, g)
		}
	}
	rej := r.kube.Rejections()
	if len(rej) != 1 || rej[0].PolicyID != "shop/sneaky" || !strings.Contains(rej[0].Err.Error(), "not of namespace team-a") {
		t.Errorf("rejections %+v, want shop/sneaky as not of namespace team-a", rej)
	}
}

func TestKubeNotReadyBeforeSync(t *testing.T) {
	p, target, _, _ := newTestPipeline(t)
	k := NewKube(nil, p, KubeOptions{})
	if err := k.Ready(t.Context()); !errors.Is(err, ErrNotSynced) {
		t.Errorf("Ready before Run: %v, want ErrNotSynced", err)
	}
	// Synced swaps the empty set once, and only when nothing was swapped yet.
	p.Synced()
	p.Synced()
	if n := target.swaps(); n != 1 {
		t.Fatalf("%d swaps after Synced twice, want 1", n)
	}
	if err := p.Apply("configmap:ns/a", []*v1alpha1.RateLimitPolicy{rlp("ns", "a", 1)}); err != nil {
		t.Fatal(err)
	}
	p.Synced()
	if got := target.loaded(); len(got) != 1 || got[0] != "ns/a" {
		t.Errorf("loaded %v after Synced, want [ns/a]", got)
	}
}

func TestKubeHandlesTombstonesAndResyncs(t *testing.T) {
	p, target, _, _ := newTestPipeline(t)
	changes := 0
	k := NewKube(nil, p, KubeOptions{OnChange: func() { changes++ }})
	cm := policyConfigMap(t, "ns", "ns", "api", 3, 1)
	cm.ResourceVersion = "10"
	k.onAdd(cm)
	if got := target.loaded(); len(got) != 1 || got[0] != "ns/api" {
		t.Fatalf("loaded %v after add, want [ns/api]", got)
	}
	k.onUpdate(cm, cm.DeepCopy()) // a resync: same version
	if changes != 1 || target.swaps() != 1 {
		t.Errorf("a resync made %d changes and %d swaps, want 1 and 1 (the add's)", changes, target.swaps())
	}
	k.onDelete(cache.DeletedFinalStateUnknown{Key: "ns/rlp-ns.api", Obj: cm})
	if got := target.loaded(); len(got) != 0 || changes != 2 {
		t.Errorf("loaded %v and %d changes after a tombstone, want none and 2", got, changes)
	}
	k.onDelete(cache.DeletedFinalStateUnknown{Key: "ns/gone", Obj: nil}) // nothing to remove
	k.onAdd("not a ConfigMap")
	if changes != 2 {
		t.Errorf("%d changes after events of no ConfigMap, want 2", changes)
	}
}

// TestKubeSurvivesAPIServerRestart stops the API server under a running source: decisions go
// on with the policies it has, and a change made once the API server is back is served.
func TestKubeSurvivesAPIServerRestart(t *testing.T) {
	env := testenv.New(t)
	ns := env.Namespace(t)
	id := v1alpha1.NewPolicyID(ns, "api")
	put(t, env.Client, policyConfigMap(t, ns, ns, "api", 2, 1))
	r := startKube(t, env, ns, "")
	r.waitSynced(t)
	r.waitServed(t, id, 1, waitTimeout)

	// kube-apiserver started without --shutdown-send-retry-after waits for open watches (the
	// source's) to end before it exits, which they never do by themselves: envtest then kills it
	// after its stop timeout and reports that. Either way it is stopped.
	if err := env.StopAPIServer(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process kube-apiserver to stop") {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := env.Client.Get(short, client.ObjectKey{Namespace: ns, Name: "rlp-" + ns + ".api"}, &corev1.ConfigMap{}); err == nil {
		t.Fatal("the API server still answers after StopAPIServer")
	}
	// Outage: the source keeps what it has, and keeps deciding (capacity 2, refill 1/s).
	allowed, rejected := 0, 0
	for i := range 20 {
		res, err := r.engine.Decide(t.Context(), id, "client", 1)
		if err != nil {
			t.Fatalf("decision %d during the outage: %v", i, err)
		}
		if res.Allowed {
			allowed++
		} else {
			rejected++
		}
		time.Sleep(50 * time.Millisecond)
	}
	if allowed < 2 || rejected < 1 {
		t.Errorf("during the outage: %d allowed, %d rejected; want at least 2 allowed and some rejected", allowed, rejected)
	}
	if !r.kube.Synced() || r.generation(id) != 1 {
		t.Errorf("during the outage: synced %v, generation %d; want true, 1", r.kube.Synced(), r.generation(id))
	}

	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	put(t, env.Client, policyConfigMap(t, ns, ns, "api", 5, 2))
	// The reflector retries with a backoff of up to 30s.
	r.waitServed(t, id, 2, waitTimeout)
}
