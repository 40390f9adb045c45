package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

func TestSetEnforcement(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	p := newPolicy("shop", "api")
	p.Generation = 4
	id := p.ID()
	replica := func(name string, expiresIn time.Duration, entries limiterdv1alpha1.ReplicaRecord) limiterdv1alpha1.Replica {
		return limiterdv1alpha1.Replica{Name: name, Expires: now.Add(expiresIn), Record: entries}
	}
	serving := func(gen int64, dry uint64) limiterdv1alpha1.ReplicaRecord {
		return limiterdv1alpha1.ReplicaRecord{id: {Generation: gen, State: limiterdv1alpha1.ReplicaServing, DryRunRejected: dry}}
	}
	rejected := func(gen int64, msg string) limiterdv1alpha1.ReplicaRecord {
		return limiterdv1alpha1.ReplicaRecord{id: {Generation: gen, State: limiterdv1alpha1.ReplicaRejected, ServingGeneration: gen - 1, Error: msg}}
	}
	for _, tc := range []struct {
		name        string
		rendered    bool
		dryRun      bool
		replicas    []limiterdv1alpha1.Replica
		status      metav1.ConditionStatus
		reason      string
		message     []string // substrings
		enforced    string
		dryRejected *int64
		recheck     time.Duration
	}{
		{
			name: "no replicas", rendered: true,
			status: metav1.ConditionFalse, reason: ReasonNoReplicas, enforced: "0/0",
		},
		{
			name: "only expired replicas", rendered: true,
			replicas: []limiterdv1alpha1.Replica{replica("a", 0, serving(4, 0)), replica("b", -time.Second, serving(4, 0))},
			status:   metav1.ConditionFalse, reason: ReasonNoReplicas, enforced: "0/0",
		},
		{
			name: "all serve", rendered: true,
			replicas: []limiterdv1alpha1.Replica{replica("b", 9*time.Second, serving(4, 0)), replica("a", 3*time.Second, serving(4, 0)), replica("dead", -time.Second, serving(3, 0))},
			status:   metav1.ConditionTrue, reason: ReasonEnforced, enforced: "2/2", message: []string{"all 2 live replicas serve generation 4"},
			recheck: 3*time.Second + recheckMargin,
		},
		{
			name: "one behind", rendered: true,
			replicas: []limiterdv1alpha1.Replica{replica("a", 5*time.Second, serving(4, 0)), replica("b", 5*time.Second, serving(3, 0)), replica("c", 5*time.Second, nil)},
			status:   metav1.ConditionFalse, reason: ReasonPropagating, enforced: "1/3", message: []string{"1 of 3", "waiting for b, c"},
			recheck: 5*time.Second + recheckMargin,
		},
		{
			name: "rejected by a replica", rendered: true,
			replicas: []limiterdv1alpha1.Replica{replica("a", 5*time.Second, serving(4, 0)), replica("b", 5*time.Second, rejected(4, "parse ConfigMap data: boom")), replica("c", 5*time.Second, serving(3, 0))},
			status:   metav1.ConditionFalse, reason: ReasonRejectedByReplica, enforced: "1/3", message: []string{"rejected by replica b", "(b: parse ConfigMap data: boom)"},
			recheck: 5*time.Second + recheckMargin,
		},
		{
			name: "a rejection of an older generation is only propagation", rendered: true,
			replicas: []limiterdv1alpha1.Replica{replica("a", 5*time.Second, serving(4, 0)), replica("b", 5*time.Second, rejected(3, "old"))},
			status:   metav1.ConditionFalse, reason: ReasonPropagating, enforced: "1/2", message: []string{"waiting for b"},
			recheck: 5*time.Second + recheckMargin,
		},
		{
			name: "not rendered", rendered: false,
			replicas: []limiterdv1alpha1.Replica{replica("a", 5*time.Second, serving(3, 0))},
			status:   metav1.ConditionFalse, reason: ReasonNotRendered, enforced: "0/1", message: []string{"generation 4 is not rendered", "condition Ready"},
			recheck: 5*time.Second + recheckMargin,
		},
		{
			name: "dry-run rejections of the current generation are summed", rendered: true, dryRun: true,
			replicas: []limiterdv1alpha1.Replica{replica("a", 5*time.Second, serving(4, 3)), replica("b", 5*time.Second, serving(4, 4)), replica("c", 5*time.Second, serving(3, 100)), replica("d", -time.Second, serving(4, 1000))},
			status:   metav1.ConditionFalse, reason: ReasonPropagating, enforced: "2/3", dryRejected: int64p(7),
			recheck: 5*time.Second + recheckMargin,
		},
		{
			name: "a dry-run policy with no replica reports zero", rendered: true, dryRun: true,
			status: metav1.ConditionFalse, reason: ReasonNoReplicas, enforced: "0/0", dryRejected: int64p(0),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := p.DeepCopy()
			p.Spec.Tiers[0].DryRun = tc.dryRun
			status := &limiterdv1alpha1.RateLimitPolicyStatus{}
			recheck := setEnforcement(p, status, tc.rendered, tc.replicas, now)
			c := meta.FindStatusCondition(status.Conditions, ConditionEnforced)
			if c == nil || c.Status != tc.status || c.Reason != tc.reason || c.ObservedGeneration != 4 {
				t.Fatalf("condition %+v, want %s %s at generation 4", c, tc.status, tc.reason)
			}
			for _, m := range tc.message {
				if !strings.Contains(c.Message, m) {
					t.Errorf("message %q does not contain %q", c.Message, m)
				}
			}
			if status.Enforced != tc.enforced {
				t.Errorf("enforced %q, want %q", status.Enforced, tc.enforced)
			}
			if got := fmt.Sprintf("%d/%d", status.EnforcedReplicas, status.Replicas); got != tc.enforced {
				t.Errorf("enforcedReplicas %d, replicas %d; want %s", status.EnforcedReplicas, status.Replicas, tc.enforced)
			}
			if (status.DryRunRejected == nil) != (tc.dryRejected == nil) ||
				(status.DryRunRejected != nil && *status.DryRunRejected != *tc.dryRejected) {
				t.Errorf("dryRunRejected %v, want %v", deref(status.DryRunRejected), deref(tc.dryRejected))
			}
			if recheck != tc.recheck {
				t.Errorf("recheck after %v, want %v", recheck, tc.recheck)
			}
		})
	}
}

func TestRejectionMessageNamesAtMostTenReplicas(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	p := newPolicy("shop", "api")
	p.Generation = 2
	var replicas []limiterdv1alpha1.Replica
	for _, name := range strings.Fields("r00 r01 r02 r03 r04 r05 r06 r07 r08 r09 r10 r11") {
		replicas = append(replicas, limiterdv1alpha1.Replica{Name: name, Expires: now.Add(time.Minute), Record: limiterdv1alpha1.ReplicaRecord{
			"shop/api": {Generation: 2, State: limiterdv1alpha1.ReplicaRejected},
		}})
	}
	status := &limiterdv1alpha1.RateLimitPolicyStatus{}
	setEnforcement(p, status, true, replicas, now)
	c := meta.FindStatusCondition(status.Conditions, ConditionEnforced)
	if want := "rejected by replicas r00, r01, r02, r03, r04, r05, r06, r07, r08, r09 and 2 more"; c == nil || c.Message != "generation 2 was "+want {
		t.Errorf("condition %+v, want message ending %q", c, want)
	}
}

func int64p(v int64) *int64 { return &v }

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestStatusNamespaceAlone sets only the reconciler's StatusNamespace, to a namespace other than
// the default: the operator must read and watch the replicas' Leases there.
func TestStatusNamespaceAlone(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	startOperatorWith(t, env, ns, env.Namespace(t), ns)
	ctx := t.Context()
	p := newPolicy(ns, "api")
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)

	record, err := limiterdv1alpha1.ReplicaRecord{p.ID(): {Generation: p.Generation, State: limiterdv1alpha1.ReplicaServing}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "replica-a",
			Labels:      map[string]string{limiterdv1alpha1.ReplicaLabel: "replica-a"},
			Annotations: map[string]string{limiterdv1alpha1.ReplicaStatusAnnotation: record}},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: time.Now()}, LeaseDurationSeconds: ptr.To[int32](3600)},
	}
	if err := env.Client.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), lease) }) // the test's context is done by then
	testsupport.Eventually(t, timeout, "enforcement status", func() error {
		got := &limiterdv1alpha1.RateLimitPolicy{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
			return err
		}
		if got.Status.Enforced != "1/1" {
			return fmt.Errorf("status.enforced = %q, want 1/1 (the replica in %s)", got.Status.Enforced, ns)
		}
		return nil
	})
}

// TestEnforcementWithAThousandLongNamedPolicies: a replica serving a thousand policies whose
// names are 253 bytes long publishes a record the API server accepts, and the operator reads
// each policy's entry from it (Enforced), also after a renewal that changes an entry. Before,
// the record of about 300 such policies exceeded MaxReplicaRecordBytes: the replica published
// nothing and every policy of every tenant turned Enforced false.
func TestEnforcementWithAThousandLongNamedPolicies(t *testing.T) {
	env := testenv.Shared(t)
	ns := env.Namespace(t)
	cmNS := env.Namespace(t)
	startOperatorWith(t, env, ns, cmNS, ns)
	ctx := t.Context()
	long := func(i int) string { return fmt.Sprintf("p%04d-%s", i, strings.Repeat("x", 247)) } // 253 bytes
	p := newPolicy(ns, long(0))
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	p = waitReady(t, env.Client, client.ObjectKeyFromObject(p), 1, ReasonRendered)

	record := func(gen int64) string {
		r := limiterdv1alpha1.ReplicaRecord{}
		for i := range 1000 {
			id := limiterdv1alpha1.NewPolicyID(ns, long(i))
			r[id] = limiterdv1alpha1.ReplicaPolicyStatus{Generation: gen, State: limiterdv1alpha1.ReplicaServing,
				ConfigMap: cmNS + "/" + limiterdv1alpha1.ConfigMapName(id)}
		}
		s, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "replica-a",
			Labels:      map[string]string{limiterdv1alpha1.ReplicaLabel: "replica-a"},
			Annotations: map[string]string{limiterdv1alpha1.ReplicaStatusAnnotation: record(p.Generation)}},
		Spec: coordinationv1.LeaseSpec{RenewTime: &metav1.MicroTime{Time: time.Now()}, LeaseDurationSeconds: ptr.To[int32](3600)},
	}
	if err := env.Client.Create(ctx, lease); err != nil {
		t.Fatalf("create the replica's Lease (%d bytes of record): %v", len(lease.Annotations[limiterdv1alpha1.ReplicaStatusAnnotation]), err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), lease) }) // the test's context is done by then
	enforced := func(want string) {
		t.Helper()
		testsupport.Eventually(t, timeout, "enforcement status "+want, func() error {
			got := &limiterdv1alpha1.RateLimitPolicy{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
				return err
			}
			if got.Status.Enforced != want {
				return fmt.Errorf("status.enforced = %q, want %s", got.Status.Enforced, want)
			}
			return nil
		})
	}
	enforced("1/1")
	// A renewal that changes the entries reaches the policy too.
	lease.Annotations[limiterdv1alpha1.ReplicaStatusAnnotation] = record(p.Generation + 1)
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if err := env.Client.Update(ctx, lease); err != nil {
		t.Fatal(err)
	}
	enforced("0/1")
}
