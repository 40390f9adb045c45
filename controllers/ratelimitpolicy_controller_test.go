package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// getConfigMap returns the policy's ConfigMap, in namespace (limiterd's).
func getConfigMap(t *testing.T, c client.Client, namespace string, p *limiterdv1alpha1.RateLimitPolicy) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	key := client.ObjectKey{Namespace: namespace, Name: limiterdv1alpha1.ConfigMapName(p.ID())}
	if err := c.Get(t.Context(), key, cm); err != nil {
		t.Fatalf("get ConfigMap of policy %s: %v", p.ID(), err)
	}
	return cm
}

// checkConfigMap fails t unless cm is the policy's ConfigMap for p as the API server returned it:
// labelled with the policy's name and namespace, annotated with its ID, and carrying p's
// generation and spec. It has no owner reference: owner references cannot cross namespaces.
func checkConfigMap(t *testing.T, cm *corev1.ConfigMap, p *limiterdv1alpha1.RateLimitPolicy) {
	t.Helper()
	if len(cm.OwnerReferences) != 0 {
		t.Errorf("ConfigMap %s: owner references %+v, want none", cm.Name, cm.OwnerReferences)
	}
	if got, want := cm.Labels[limiterdv1alpha1.PolicyLabel], limiterdv1alpha1.PolicyLabelValue(p.Name); got != want {
		t.Errorf("ConfigMap %s: label %s=%q, want %q", cm.Name, limiterdv1alpha1.PolicyLabel, got, want)
	}
	if got := cm.Labels[limiterdv1alpha1.PolicyNamespaceLabel]; got != p.Namespace {
		t.Errorf("ConfigMap %s: label %s=%q, want %q", cm.Name, limiterdv1alpha1.PolicyNamespaceLabel, got, p.Namespace)
	}
	if got := cm.Annotations[limiterdv1alpha1.PolicyIDAnnotation]; got != p.ID().String() {
		t.Errorf("ConfigMap %s: annotation %s=%q, want %q", cm.Name, limiterdv1alpha1.PolicyIDAnnotation, got, p.ID())
	}
	parsed, err := limiterdv1alpha1.ParseConfigMapData(cm.Name, cm.Data)
	if err != nil {
		t.Fatalf("ConfigMap %s: %v", cm.Name, err)
	}
	if parsed.Name != p.Name || parsed.Namespace != p.Namespace || parsed.Generation != p.Generation {
		t.Errorf("ConfigMap %s carries policy %s/%s generation %d, want %s/%s generation %d",
			cm.Name, parsed.Namespace, parsed.Name, parsed.Generation, p.Namespace, p.Name, p.Generation)
	}
	want := p.DeepCopy()
	want.Default() // as the CRD does, unless it is an older one
	if !equality.Semantic.DeepEqual(parsed.Spec, want.Spec) {
		t.Errorf("ConfigMap %s carries spec %+v, want %+v", cm.Name, parsed.Spec, want.Spec)
	}
}

func TestCreateAndUpdateRenderConfigMap(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	cmNS, _ := startOperator(t, env, ns)
	ctx := t.Context()

	p := newPolicy(ns, "public-api")
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(p)
	got := waitReady(t, env.Client, key, 1, ReasonRendered)
	ready := meta.FindStatusCondition(got.Status.Conditions, ConditionReady)
	if ready.Status != metav1.ConditionTrue {
		t.Errorf("Ready = %s, want True", ready.Status)
	}
	if want := limiterdv1alpha1.ConfigMapName(p.ID()); got.Status.ConfigMapName != want {
		t.Errorf("status.configMapName = %q, want %q", got.Status.ConfigMapName, want)
	}
	if got.Status.TierCount != 2 {
		t.Errorf("status.tierCount = %d, want 2", got.Status.TierCount)
	}
	checkConfigMap(t, getConfigMap(t, env.Client, cmNS, got), got)

	// A new generation is rendered, and the status follows it.
	got = edit(t, env.Client, key, func(p *limiterdv1alpha1.RateLimitPolicy) {
		p.Spec.Tiers[0].TokenBucket.Capacity = 40
		p.Spec.Tiers = append(p.Spec.Tiers, limiterdv1alpha1.Tier{Name: "pro", Algorithm: limiterdv1alpha1.AlgorithmSlidingWindow,
			SlidingWindow: &limiterdv1alpha1.SlidingWindow{Limit: 100, Window: metav1.Duration{Duration: 60e9}}})
	})
	got = waitReady(t, env.Client, key, 2, ReasonRendered)
	if got.Status.TierCount != 3 {
		t.Errorf("status.tierCount = %d, want 3", got.Status.TierCount)
	}
	cm := getConfigMap(t, env.Client, cmNS, got)
	checkConfigMap(t, cm, got)
	if g := cm.Data[limiterdv1alpha1.ConfigMapGenerationKey]; g != "2" {
		t.Errorf("ConfigMap generation = %q, want 2", g)
	}
}

func TestResyncWritesNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	cmNS, stopOperator := startOperator(t, env, ns)
	ctx := t.Context()

	p := newPolicy(ns, "steady")
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)
	// Stop the operator, so that the objects change only by the resync below.
	stopOperator()
	before := &limiterdv1alpha1.RateLimitPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), before); err != nil {
		t.Fatal(err)
	}
	cmBefore := getConfigMap(t, env.Client, cmNS, before)

	// Reconcile as a resync does, through a client that counts writes.
	var writes atomic.Int32
	count := func() { writes.Add(1) }
	c := interceptor.NewClient(env.Client, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			count()
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			count()
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			count()
			return c.Patch(ctx, obj, patch, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			count()
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			count()
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			count()
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	recorder := events.NewFakeRecorder(10)
	// The same status namespace as the operator's, whose status this resync must find current.
	r := &RateLimitPolicyReconciler{Client: c, APIReader: c, ConfigMapNamespace: cmNS, Recorder: recorder,
		StatusNamespace: DefaultStatusNamespace()}
	for range 3 {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
	}
	if n := writes.Load(); n != 0 {
		t.Errorf("a resync of an up-to-date policy made %d writes, want 0", n)
	}
	if n := len(recorder.Events); n != 0 {
		t.Errorf("a resync of an up-to-date policy recorded %d events, want 0: %s", n, <-recorder.Events)
	}

	after := &limiterdv1alpha1.RateLimitPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("policy resourceVersion %s -> %s after a resync, want unchanged", before.ResourceVersion, after.ResourceVersion)
	}
	if cmAfter := getConfigMap(t, env.Client, cmNS, after); cmAfter.ResourceVersion != cmBefore.ResourceVersion {
		t.Errorf("ConfigMap resourceVersion %s -> %s after a resync, want unchanged", cmBefore.ResourceVersion, cmAfter.ResourceVersion)
	}
}

func TestConfigMapDriftIsRestored(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	cmNS, _ := startOperator(t, env, ns)
	ctx := t.Context()

	p := newPolicy(ns, "drift")
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)
	want := getConfigMap(t, env.Client, cmNS, p)

	restored := func(cm *corev1.ConfigMap) error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(want), cm); err != nil {
			return err
		}
		if !equality.Semantic.DeepEqual(cm.Data, want.Data) || cm.Labels[limiterdv1alpha1.PolicyLabel] != want.Labels[limiterdv1alpha1.PolicyLabel] {
			return fmt.Errorf("ConfigMap not restored: labels %v, data %v", cm.Labels, cm.Data)
		}
		return nil
	}

	t.Run("edited data", func(t *testing.T) {
		cm := getConfigMap(t, env.Client, cmNS, p)
		cm.Data[limiterdv1alpha1.ConfigMapDataKey] = "tampered"
		cm.Data["extra"] = "x"
		if err := env.Client.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
		testsupport.Eventually(t, timeout, "ConfigMap restored after an edit", func() error { return restored(&corev1.ConfigMap{}) })
		waitEvent(t, env.Client, p, corev1.EventTypeNormal, ReasonRestored)
	})

	t.Run("label removed", func(t *testing.T) {
		// The operator's cache no longer sees an unlabelled ConfigMap: it must find it anyway.
		cm := getConfigMap(t, env.Client, cmNS, p)
		delete(cm.Labels, limiterdv1alpha1.PolicyLabel)
		if err := env.Client.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
		testsupport.Eventually(t, timeout, "ConfigMap label restored", func() error { return restored(&corev1.ConfigMap{}) })
	})

	t.Run("deleted", func(t *testing.T) {
		cm := getConfigMap(t, env.Client, cmNS, p)
		if err := env.Client.Delete(ctx, cm); err != nil {
			t.Fatal(err)
		}
		testsupport.Eventually(t, timeout, "ConfigMap recreated", func() error {
			var again corev1.ConfigMap
			if err := restored(&again); err != nil {
				return err
			}
			if again.UID == cm.UID {
				return fmt.Errorf("ConfigMap %s not deleted yet", cm.Name)
			}
			checkConfigMap(t, &again, p)
			return nil
		})
	})

	// Restoring changes nothing of the status.
	if got := waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered); got.ResourceVersion != p.ResourceVersion {
		t.Errorf("policy resourceVersion %s -> %s after restoring its ConfigMap, want unchanged", p.ResourceVersion, got.ResourceVersion)
	}
}

// TestDeletedPolicyConfigMapIsDeleted checks the garbage collection of ConfigMaps, which owner
// references cannot do across namespaces: a deleted policy's ConfigMap is deleted, and so is one
// whose policy was deleted while the operator was not running, once it starts; a ConfigMap
// annotated with a policy that exists, or with none, stays.
func TestDeletedPolicyConfigMapIsDeleted(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	cmNS := env.Namespace(t)
	ctx := t.Context()

	// Left behind by a policy deleted while no operator ran, and a ConfigMap that is no policy's.
	ghost := newPolicy(ns, "ghost")
	data, err := limiterdv1alpha1.RenderConfigMapData(ghost)
	if err != nil {
		t.Fatal(err)
	}
	leftover := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cmNS, Name: limiterdv1alpha1.ConfigMapName(ghost.ID()),
		Labels:      map[string]string{limiterdv1alpha1.PolicyLabel: "ghost", limiterdv1alpha1.PolicyNamespaceLabel: ns},
		Annotations: map[string]string{limiterdv1alpha1.PolicyIDAnnotation: ghost.ID().String()}}, Data: data}
	unrelated := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cmNS, Name: "unrelated",
		Labels: map[string]string{limiterdv1alpha1.PolicyLabel: "unrelated"}}}
	for _, cm := range []*corev1.ConfigMap{leftover, unrelated} {
		if err := env.Client.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	startOperatorWith(t, env, ns, cmNS, DefaultStatusNamespace())
	gone := func(cm *corev1.ConfigMap) func() error {
		return func() error {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{})
			switch {
			case err == nil:
				return fmt.Errorf("ConfigMap %s still there", cm.Name)
			case !apierrors.IsNotFound(err):
				return err
			}
			return nil
		}
	}
	testsupport.Eventually(t, timeout, "leftover ConfigMap gone", gone(leftover))

	p := newPolicy(ns, "short-lived")
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)
	cm := getConfigMap(t, env.Client, cmNS, p)
	checkConfigMap(t, cm, p)
	if err := env.Client.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, timeout, "ConfigMap of the deleted policy gone", gone(cm))
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(unrelated), &corev1.ConfigMap{}); err != nil {
		t.Errorf("a ConfigMap of no policy: %v, want kept", err)
	}
}

// bigSpec returns a valid spec whose rendering exceeds MaxConfigMapDataBytes: 1000 client keys
// and prefixes of 1000 bytes, within every bound the API server checks.
func bigSpec() limiterdv1alpha1.RateLimitPolicySpec {
	spec := newPolicy("", "").Spec
	key := func(kind string, i int) string {
		s := kind + strconv.Itoa(i) + "-"
		return s + strings.Repeat("k", 1000-len(s))
	}
	for o := range 2 {
		var clients, prefixes []string
		for i := range 250 {
			clients = append(clients, key("client", o*250+i))
			prefixes = append(prefixes, key("prefix", o*250+i))
		}
		spec.Overrides = append(spec.Overrides, limiterdv1alpha1.Override{Tier: "internal", Clients: clients, ClientPrefixes: prefixes})
	}
	return spec
}

func TestTooLargePolicyIsNotWritten(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	cmNS, _ := startOperator(t, env, ns)
	ctx := t.Context()

	t.Run("new", func(t *testing.T) {
		p := newPolicy(ns, "too-large")
		p.Spec = bigSpec()
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatalf("the API server rejected a policy within its bounds: %v", err)
		}
		p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonTooLarge)
		checkNotReady(t, p, "bytes, more than")
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: cmNS, Name: limiterdv1alpha1.ConfigMapName(p.ID())}, &corev1.ConfigMap{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("get ConfigMap of a policy too large: %v, want NotFound", err)
		}
		waitEvent(t, env.Client, p, corev1.EventTypeWarning, ReasonTooLarge)
	})

	t.Run("grown", func(t *testing.T) {
		p := newPolicy(ns, "grown")
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)
		good := getConfigMap(t, env.Client, cmNS, p)
		p = edit(t, env.Client, client.ObjectKeyFromObject(p), func(p *limiterdv1alpha1.RateLimitPolicy) { p.Spec = bigSpec() })
		p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 2, ReasonTooLarge)
		checkNotReady(t, p, "bytes, more than")
		if cm := getConfigMap(t, env.Client, cmNS, p); cm.ResourceVersion != good.ResourceVersion {
			t.Errorf("ConfigMap rewritten (generation %s) for a policy too large, want the last good one kept",
				cm.Data[limiterdv1alpha1.ConfigMapGenerationKey])
		}
		if p.Status.ConfigMapName != good.Name {
			t.Errorf("status.configMapName = %q, want the last good ConfigMap %q", p.Status.ConfigMapName, good.Name)
		}
	})
}

// checkNotReady fails t unless the policy's Ready condition is False with a message containing
// want.
func checkNotReady(t *testing.T, p *limiterdv1alpha1.RateLimitPolicy, want string) {
	t.Helper()
	ready := meta.FindStatusCondition(p.Status.Conditions, ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionFalse || !strings.Contains(ready.Message, want) {
		t.Errorf("Ready condition %+v, want False with a message containing %q", ready, want)
	}
}

func TestConfigMapOfAnotherPolicyIsLeftAlone(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	cmNS, _ := startOperator(t, env, ns)
	ctx := t.Context()

	// A ConfigMap of the name of policy "taken", carrying another policy (as a hash collision of
	// long names would).
	p := newPolicy(ns, "taken")
	taken := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: cmNS, Name: limiterdv1alpha1.ConfigMapName(p.ID()),
			Annotations: map[string]string{limiterdv1alpha1.PolicyIDAnnotation: ns + "/someone-else"}},
		Data: map[string]string{"mine": "yes"},
	}
	if err := env.Client.Create(ctx, taken); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonConfigMapConflict)
	checkNotReady(t, p, "carries policy "+ns+"/someone-else")
	if cm := getConfigMap(t, env.Client, cmNS, p); cm.ResourceVersion != taken.ResourceVersion {
		t.Errorf("the operator wrote a ConfigMap of another policy: %+v", cm)
	}
	waitEvent(t, env.Client, p, corev1.EventTypeWarning, ReasonConfigMapConflict)
}

// TestInvalidPolicyKeepsLastGoodConfigMap loosens the CRD's schema, as an older CRD would be,
// so that invalid policies get past admission. It changes the shared control plane, so it does
// not run in parallel (parallel tests wait for it) and restores the CRD before it ends.
func TestInvalidPolicyKeepsLastGoodConfigMap(t *testing.T) {
	env := testenv.Shared(t)
	ctx := t.Context()
	loosenCRD(t, env)
	ns := env.Namespace(t)
	cmNS, _ := startOperator(t, env, ns)

	t.Run("new", func(t *testing.T) {
		p := newPolicy(ns, "invalid-new")
		p.Spec.DefaultTier = "gold"
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonInvalid)
		checkNotReady(t, p, "spec.defaultTier")
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: cmNS, Name: limiterdv1alpha1.ConfigMapName(p.ID())}, &corev1.ConfigMap{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("get ConfigMap of an invalid policy: %v, want NotFound", err)
		}
		if p.Status.ConfigMapName != "" {
			t.Errorf("status.configMapName = %q for a policy never rendered, want empty", p.Status.ConfigMapName)
		}
	})

	t.Run("broken and fixed", func(t *testing.T) {
		p := newPolicy(ns, "broken")
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)
		good := getConfigMap(t, env.Client, cmNS, p)

		p = edit(t, env.Client, client.ObjectKeyFromObject(p), func(p *limiterdv1alpha1.RateLimitPolicy) { p.Spec.Tiers[0].TokenBucket.Capacity = 0 })
		p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 2, ReasonInvalid)
		checkNotReady(t, p, "spec.tiers[0].tokenBucket.capacity")
		if cm := getConfigMap(t, env.Client, cmNS, p); cm.ResourceVersion != good.ResourceVersion {
			t.Errorf("ConfigMap rewritten (generation %s) for an invalid policy, want the last good one kept",
				cm.Data[limiterdv1alpha1.ConfigMapGenerationKey])
		}
		e := waitEvent(t, env.Client, p, corev1.EventTypeWarning, ReasonInvalid)
		if !strings.Contains(e.Note, "spec.tiers[0].tokenBucket.capacity") {
			t.Errorf("event note %q does not name the invalid field", e.Note)
		}

		p = edit(t, env.Client, client.ObjectKeyFromObject(p), func(p *limiterdv1alpha1.RateLimitPolicy) { p.Spec.Tiers[0].TokenBucket.Capacity = 30 })
		p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 3, ReasonRendered)
		checkConfigMap(t, getConfigMap(t, env.Client, cmNS, p), p)
	})
}

// TestUnknownTimeZoneKeepsLastGoodConfigMap: the API server refuses a zone its tz database does
// not have (Quota.TimeZone), but its database may be newer than the operator's, which looks the
// zone up again: a zone the API server admitted and the operator does not know is refused as
// invalid, naming the field, and the last good ConfigMap is kept, so that limiterd goes on
// serving the policy's last good version; a fixed zone renders again. The test stands in for the
// newer database by loosening the CRD (so it does not run in parallel, see
// TestInvalidPolicyKeepsLastGoodConfigMap).
func TestUnknownTimeZoneKeepsLastGoodConfigMap(t *testing.T) {
	env := testenv.Shared(t)
	ctx := t.Context()
	ns := env.Namespace(t)
	cmNS, _ := startOperator(t, env, ns)

	p := newPolicy(ns, "quota-zone")
	p.Spec.Tiers[0] = limiterdv1alpha1.Tier{Name: "free", Algorithm: limiterdv1alpha1.AlgorithmQuota,
		Quota: &limiterdv1alpha1.Quota{Limit: 1000, Period: limiterdv1alpha1.CalendarPeriodMonth}}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)
	if got := p.Spec.Tiers[0].Quota.TimeZone; got != limiterdv1alpha1.DefaultTimeZone {
		t.Errorf("the API server defaulted timeZone to %q, want %q", got, limiterdv1alpha1.DefaultTimeZone)
	}
	good := getConfigMap(t, env.Client, cmNS, p)
	checkConfigMap(t, good, p)

	loosenCRD(t, env) // an API server whose tz database has Europe/Atlantis
	p = edit(t, env.Client, client.ObjectKeyFromObject(p), func(p *limiterdv1alpha1.RateLimitPolicy) {
		p.Spec.Tiers[0].Quota.TimeZone = "Europe/Atlantis"
	})
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 2, ReasonInvalid)
	checkNotReady(t, p, `spec.tiers[0].quota.timeZone: Invalid value: "Europe/Atlantis": unknown time zone`)
	if cm := getConfigMap(t, env.Client, cmNS, p); cm.ResourceVersion != good.ResourceVersion {
		t.Errorf("ConfigMap rewritten (generation %s) for a policy of an unknown zone, want the last good one kept",
			cm.Data[limiterdv1alpha1.ConfigMapGenerationKey])
	}
	e := waitEvent(t, env.Client, p, corev1.EventTypeWarning, ReasonInvalid)
	if !strings.Contains(e.Note, "spec.tiers[0].quota.timeZone") {
		t.Errorf("event note %q does not name the time zone", e.Note)
	}

	p = edit(t, env.Client, client.ObjectKeyFromObject(p), func(p *limiterdv1alpha1.RateLimitPolicy) {
		p.Spec.Tiers[0].Quota.TimeZone = "America/Argentina/Buenos_Aires"
	})
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 3, ReasonRendered)
	checkConfigMap(t, getConfigMap(t, env.Client, cmNS, p), p)
}

// loosenCRD replaces the RateLimitPolicy CRD's spec schema by one that accepts anything, until t
// ends; then it restores the CRD and waits until the API server validates again.
func loosenCRD(t *testing.T, env *testenv.Env) {
	t.Helper()
	ctx := context.Background() // also used by the cleanup, after the test's context is done
	key := client.ObjectKey{Name: "ratelimitpolicies." + limiterdv1alpha1.GroupVersion.Group}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := env.Client.Get(ctx, key, crd); err != nil {
		t.Fatal(err)
	}
	original := crd.DeepCopy().Spec.Versions
	for i := range crd.Spec.Versions {
		crd.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"] = apiextensionsv1.JSONSchemaProps{
			Type: "object", XPreserveUnknownFields: ptr.To(true),
		}
	}
	if err := env.Client.Update(ctx, crd); err != nil {
		t.Fatalf("loosen CRD: %v", err)
	}
	invalid := newPolicy("default", "probe-invalid")
	invalid.Spec.DefaultTier = "none"
	admitted := func() error {
		return env.Client.Create(ctx, invalid.DeepCopy(), client.DryRunAll)
	}
	testsupport.Eventually(t, timeout, "invalid policy admitted without the CRD validation", admitted)
	t.Cleanup(func() {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := env.Client.Get(ctx, key, crd); err != nil {
			t.Fatal(err)
		}
		crd.Spec.Versions = original
		if err := env.Client.Update(ctx, crd); err != nil {
			t.Fatalf("restore CRD: %v", err)
		}
		testsupport.Eventually(t, timeout, "invalid policy refused by the restored CRD", func() error {
			err := admitted()
			switch {
			case err == nil:
				return errors.New("restored CRD: an invalid policy was admitted, want Invalid")
			case !apierrors.IsInvalid(err):
				return fmt.Errorf("restored CRD: an invalid policy got %w, want Invalid", err)
			}
			return nil
		})
	})
}

// TestUnannotatedConfigMapIsLeftAlone: a ConfigMap that has the name of a policy's ConfigMap but
// not the operator's annotation (someone else's, labelled like the operator's or not) is neither
// adopted nor changed nor deleted: the policy is not Ready (ConfigMapConflict). Before, the
// operator took over any ConfigMap of that name without the annotation.
func TestUnannotatedConfigMapIsLeftAlone(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	cmNS, _ := startOperator(t, env, ns)
	ctx := t.Context()

	for name, labels := range map[string]map[string]string{
		"unlabelled": nil,
		"labelled":   {limiterdv1alpha1.PolicyLabel: "foreign"},
	} {
		t.Run(name, func(t *testing.T) {
			p := newPolicy(ns, "foreign-"+name)
			foreign := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: cmNS, Name: limiterdv1alpha1.ConfigMapName(p.ID()), Labels: labels},
				Data:       map[string]string{"mine": "yes"},
			}
			if err := env.Client.Create(ctx, foreign); err != nil {
				t.Fatal(err)
			}
			if err := env.Client.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
			p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonConfigMapConflict)
			checkNotReady(t, p, "without annotation "+limiterdv1alpha1.PolicyIDAnnotation)
			if cm := getConfigMap(t, env.Client, cmNS, p); cm.ResourceVersion != foreign.ResourceVersion {
				t.Errorf("the operator changed a ConfigMap without its annotation: %+v", cm)
			}
			// Deleting the policy leaves the ConfigMap too.
			if err := env.Client.Delete(ctx, p); err != nil {
				t.Fatal(err)
			}
			testsupport.Eventually(t, timeout, "the policy to be gone", func() bool {
				return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(p), &limiterdv1alpha1.RateLimitPolicy{}))
			})
			// The deletion's reconciliation runs at once; a later policy reconciled by the
			// same operator shows it has passed.
			marker := newPolicy(ns, "marker-"+name)
			if err := env.Client.Create(ctx, marker); err != nil {
				t.Fatal(err)
			}
			waitReady(t, env.Client, client.ObjectKeyFromObject(marker), 1, ReasonRendered)
			if cm := getConfigMap(t, env.Client, cmNS, p); cm.ResourceVersion != foreign.ResourceVersion {
				t.Errorf("the ConfigMap changed after its policy was deleted: %+v", cm)
			}
		})
	}
}

// edit makes change to the policy key names, on its latest version, and updates it: again on a
// conflict, since the controller may write the policy's status between the read and the update
// (as kubectl edit is retried). It returns the policy as updated.
func edit(t *testing.T, c client.Client, key client.ObjectKey, change func(*limiterdv1alpha1.RateLimitPolicy)) *limiterdv1alpha1.RateLimitPolicy {
	t.Helper()
	p := &limiterdv1alpha1.RateLimitPolicy{}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(t.Context(), key, p); err != nil {
			return err
		}
		change(p)
		return c.Update(t.Context(), p)
	}); err != nil {
		t.Fatalf("update %s: %v", key, err)
	}
	return p
}
