package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

func TestLegacyServers(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	id := limiterdv1alpha1.NewPolicyID("shop", "api")
	current := "limiterd-system/rlp-shop.api"
	rep := func(name string, live bool, entries limiterdv1alpha1.ReplicaRecord) limiterdv1alpha1.Replica {
		expires := now.Add(time.Second)
		if !live {
			expires = now.Add(-time.Second)
		}
		return limiterdv1alpha1.Replica{Name: name, Expires: expires, Record: entries}
	}
	old := limiterdv1alpha1.ReplicaRecord{id: {Generation: 3, State: limiterdv1alpha1.ReplicaServing}}
	fromCurrent := limiterdv1alpha1.ReplicaRecord{id: {Generation: 3, State: limiterdv1alpha1.ReplicaServing, ConfigMap: current}}
	rejectedCurrent := limiterdv1alpha1.ReplicaRecord{id: {Generation: 4, State: limiterdv1alpha1.ReplicaRejected, ConfigMap: current}}
	elsewhere := limiterdv1alpha1.ReplicaRecord{id: {Generation: 3, State: limiterdv1alpha1.ReplicaServing, ConfigMap: "other/rlp-shop.api"}}
	otherPolicy := limiterdv1alpha1.ReplicaRecord{"shop/other": {Generation: 1, State: limiterdv1alpha1.ReplicaServing}}

	for _, tc := range []struct {
		name     string
		replicas []limiterdv1alpha1.Replica
		want     []string
	}{
		{"no replica", nil, nil},
		{"a replica of an earlier version serves it", []limiterdv1alpha1.Replica{rep("new", true, fromCurrent), rep("old", true, old)}, []string{"old"}},
		{"an expired replica of an earlier version", []limiterdv1alpha1.Replica{rep("new", true, fromCurrent), rep("old", false, old)}, nil},
		{"every replica reads the current ConfigMap", []limiterdv1alpha1.Replica{rep("a", true, fromCurrent), rep("b", true, rejectedCurrent)}, nil},
		{"a replica reads it from another ConfigMap", []limiterdv1alpha1.Replica{rep("a", true, elsewhere)}, []string{"a"}},
		{"replicas that do not serve it", []limiterdv1alpha1.Replica{rep("a", true, otherPolicy), rep("b", true, limiterdv1alpha1.ReplicaRecord{})}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := legacyServers(id, current, tc.replicas, now); !slices.Equal(got, tc.want) {
				t.Errorf("legacyServers = %v, want %v", got, tc.want)
			}
		})
	}
}

// createLegacyPolicy creates policy name in namespace as an earlier operator left it: its status
// names its ConfigMap, which is controlled by the policy and lives in the policy's namespace. It
// returns the policy and that ConfigMap.
func createLegacyPolicy(t *testing.T, env *testenv.Env, namespace, name string) (*limiterdv1alpha1.RateLimitPolicy, *corev1.ConfigMap) {
	t.Helper()
	ctx := t.Context()
	p := newPolicy(namespace, name)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	data, err := limiterdv1alpha1.RenderConfigMapData(p)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: limiterdv1alpha1.LegacyConfigMapName(name),
			Labels: map[string]string{limiterdv1alpha1.PolicyLabel: limiterdv1alpha1.PolicyLabelValue(name)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: limiterdv1alpha1.GroupVersion.String(), Kind: limiterdv1alpha1.Kind,
				Name: name, UID: p.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		Data: data,
	}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	p.Status.ObservedGeneration = p.Generation
	p.Status.ConfigMapName = cm.Name
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	return p, cm
}

// removeLegacy switches the reconciler's removal of legacy ConfigMaps on.
func removeLegacy(r *RateLimitPolicyReconciler) { r.RemoveLegacyConfigMaps = true }

// TestLegacyConfigMapRemoved starts the operator, with RemoveLegacyConfigMaps, on policies an
// earlier version rendered into ConfigMaps of their own namespace: it renders them into
// limiterd's namespace, and deletes the old ConfigMap once no live replica serves the policy from
// it (at once for a policy no replica reports). The replicas are status Leases written by the
// test, as limiterd of an earlier version (no configMap in its record) and of this one would
// write them.
func TestLegacyConfigMapRemoved(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns, cmNS, statusNS := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	ctx := t.Context()

	served, servedCM := createLegacyPolicy(t, env, ns, "served")
	unreported, unreportedCM := createLegacyPolicy(t, env, ns, "unreported")

	// A live replica of an earlier version serves "served" from its old ConfigMap.
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: statusNS, Name: "limiterd-old",
			Labels: map[string]string{limiterdv1alpha1.ReplicaLabel: "limiterd-old"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("limiterd-old"), LeaseDurationSeconds: ptr.To(int32(3600))},
	}
	setRecord := func(entry limiterdv1alpha1.ReplicaPolicyStatus) {
		t.Helper()
		rec, err := limiterdv1alpha1.ReplicaRecord{served.ID(): entry}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		lease.Annotations = map[string]string{limiterdv1alpha1.ReplicaStatusAnnotation: rec}
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		if lease.ResourceVersion == "" {
			err = env.Client.Create(ctx, lease)
		} else {
			err = env.Client.Update(ctx, lease)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	setRecord(limiterdv1alpha1.ReplicaPolicyStatus{Generation: 1, State: limiterdv1alpha1.ReplicaServing})

	startOperatorWith(t, env, ns, cmNS, statusNS, removeLegacy)
	exists := func(cm *corev1.ConfigMap) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}
	waitStatusName := func(p *limiterdv1alpha1.RateLimitPolicy, want string) {
		t.Helper()
		testsupport.Eventually(t, timeout, "status name "+want, func() error {
			got := &limiterdv1alpha1.RateLimitPolicy{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
				return err
			}
			if got.Status.ConfigMapName != want {
				return fmt.Errorf("policy %s: status.configMapName %q, want %q", p.Name, got.Status.ConfigMapName, want)
			}
			return nil
		})
	}

	// Nobody reports "unreported": its old ConfigMap goes once the new one is written.
	waitStatusName(unreported, limiterdv1alpha1.ConfigMapName(unreported.ID()))
	checkConfigMap(t, getConfigMap(t, env.Client, cmNS, unreported), unreported)
	if ok, err := exists(unreportedCM); ok || err != nil {
		t.Errorf("legacy ConfigMap of a policy no replica serves: exists %v (%v), want deleted", ok, err)
	}
	waitEvent(t, env.Client, unreported, corev1.EventTypeNormal, ReasonLegacyConfigMapRemoved)

	// "served" is rendered anew, and Ready, but its old ConfigMap stays while the replica of the
	// earlier version serves it from there.
	p := waitReady(t, env.Client, client.ObjectKeyFromObject(served), 1, ReasonRendered)
	checkConfigMap(t, getConfigMap(t, env.Client, cmNS, p), p)
	testsupport.Consistently(t, time.Second, "legacy ConfigMap kept while a replica of an earlier version serves it", func() error {
		ok, err := exists(servedCM)
		if err == nil && !ok {
			err = fmt.Errorf("ConfigMap %s/%s deleted", servedCM.Namespace, servedCM.Name)
		}
		return err
	})
	waitStatusName(served, servedCM.Name)

	// The replica is replaced by one that reads the new ConfigMap: the old one goes.
	setRecord(limiterdv1alpha1.ReplicaPolicyStatus{Generation: 1, State: limiterdv1alpha1.ReplicaServing,
		ConfigMap: cmNS + "/" + limiterdv1alpha1.ConfigMapName(served.ID())})
	waitStatusName(served, limiterdv1alpha1.ConfigMapName(served.ID()))
	if ok, err := exists(servedCM); ok || err != nil {
		t.Errorf("legacy ConfigMap: exists %v (%v) once every replica reads the new one, want deleted", ok, err)
	}
}

// TestLegacyConfigMapRemovedOnTheReconcilersClock: whether a replica still serves a policy from
// its legacy ConfigMap is judged at the time of the reconciler's Clock. On a clock past the
// expiry of the only replica's record, the legacy ConfigMap goes, though by the real clock the
// record is live for another hour.
func TestLegacyConfigMapRemovedOnTheReconcilersClock(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns, cmNS, statusNS := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	ctx := t.Context()
	p, legacyCM := createLegacyPolicy(t, env, ns, "expired")

	// A replica of an earlier version serves p from its legacy ConfigMap, renewed now for an hour.
	rec, err := limiterdv1alpha1.ReplicaRecord{p.ID(): {Generation: 1, State: limiterdv1alpha1.ReplicaServing}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: statusNS, Name: "limiterd-old",
			Labels:      map[string]string{limiterdv1alpha1.ReplicaLabel: "limiterd-old"},
			Annotations: map[string]string{limiterdv1alpha1.ReplicaStatusAnnotation: rec}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("limiterd-old"),
			RenewTime: &metav1.MicroTime{Time: time.Now()}, LeaseDurationSeconds: ptr.To(int32(3600))},
	}
	if err := env.Client.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}

	// No operator runs: this reconciler, whose clock is two hours ahead, is the only one to act.
	r := &RateLimitPolicyReconciler{Client: env.Client, APIReader: env.Client, ConfigMapNamespace: cmNS,
		Recorder: events.NewFakeRecorder(10), StatusNamespace: statusNS,
		Clock: clocktesting.NewFakePassiveClock(time.Now().Add(2 * time.Hour)), RemoveLegacyConfigMaps: true}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(legacyCM), &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("legacy ConfigMap: get returned %v, want not found: the replica's record has expired by the reconciler's clock", err)
	}
	got := &limiterdv1alpha1.RateLimitPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
		t.Fatal(err)
	}
	if want := limiterdv1alpha1.ConfigMapName(p.ID()); got.Status.ConfigMapName != want {
		t.Errorf("status.configMapName %q, want %q", got.Status.ConfigMapName, want)
	}
}

// TestLegacyConfigMapLeftByDefault: without RemoveLegacyConfigMaps the operator, which then may
// not delete ConfigMaps outside its namespace, never tries to. It renders a policy of an earlier
// version into limiterd's namespace, names the new ConfigMap in the status at once, leaves the
// old ConfigMap in place and says so in a warning event naming it.
func TestLegacyConfigMapLeftByDefault(t *testing.T) {
	t.Parallel()
	env := testenv.Shared(t)
	ns, cmNS, statusNS := env.Namespace(t), env.Namespace(t), env.Namespace(t)
	ctx := t.Context()
	p, legacyCM := createLegacyPolicy(t, env, ns, "left")

	// Every delete outside limiterd's namespace fails the test, as RBAC would refuse it.
	c := interceptor.NewClient(env.Client, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if obj.GetNamespace() != cmNS {
				t.Errorf("the operator deletes %T %s/%s outside its namespace %s", obj, obj.GetNamespace(), obj.GetName(), cmNS)
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
	recorder := events.NewFakeRecorder(10)
	r := &RateLimitPolicyReconciler{Client: c, APIReader: c, ConfigMapNamespace: cmNS, Recorder: recorder, StatusNamespace: statusNS}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}

	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(legacyCM), &corev1.ConfigMap{}); err != nil {
		t.Errorf("legacy ConfigMap: %v, want it left in place", err)
	}
	got := &limiterdv1alpha1.RateLimitPolicy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
		t.Fatal(err)
	}
	if want := limiterdv1alpha1.ConfigMapName(p.ID()); got.Status.ConfigMapName != want {
		t.Errorf("status.configMapName %q, want %q", got.Status.ConfigMapName, want)
	}
	checkConfigMap(t, getConfigMap(t, env.Client, cmNS, got), got)
	select {
	case e := <-recorder.Events:
		if !strings.HasPrefix(e, corev1.EventTypeWarning+" "+ReasonLegacyConfigMapLeft+" ") || !strings.Contains(e, legacyCM.Name) {
			t.Errorf("event %q, want a warning %s naming ConfigMap %s", e, ReasonLegacyConfigMapLeft, legacyCM.Name)
		}
	default:
		t.Errorf("no event, want a warning %s", ReasonLegacyConfigMapLeft)
	}

	// Once the status names the new ConfigMap, the old one is no longer looked at: no second event.
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
		t.Fatalf("second Reconcile: %v", err)
	}
	select {
	case e := <-recorder.Events:
		t.Errorf("second Reconcile recorded %q, want no event", e)
	default:
	}
}
