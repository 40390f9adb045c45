package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/incluster"
)

// The Enforced condition of a RateLimitPolicy and its reasons: whether limiterd enforces the
// policy's observedGeneration, as the replicas' status records (see api/v1alpha1/replicastatus.go and
// docs/enforcement-status.md) say.
const (
	// ConditionEnforced says whether every live limiterd replica serves observedGeneration.
	ConditionEnforced = "Enforced"
	// ReasonEnforced (Enforced=True): every live replica serves observedGeneration.
	ReasonEnforced = "Enforced"
	// ReasonPropagating (Enforced=False): some live replicas do not serve observedGeneration yet.
	ReasonPropagating = "Propagating"
	// ReasonNoReplicas (Enforced=False): no live replica reports its status.
	ReasonNoReplicas = "NoReplicas"
	// ReasonRejectedByReplica (Enforced=False): a live replica could not parse or apply
	// observedGeneration's ConfigMap; the message names the replicas and the first one's error.
	ReasonRejectedByReplica = "RejectedByReplica"
	// ReasonNotRendered (Enforced=False): observedGeneration is not rendered into the ConfigMap
	// (see the Ready condition), so no replica can serve it.
	ReasonNotRendered = "NotRendered"
)

// maxNamedReplicas bounds how many replicas a condition message names.
const maxNamedReplicas = 10

// recheckMargin is how long after a record's expiry its policies are reconciled again.
const recheckMargin = 100 * time.Millisecond

// DefaultStatusNamespace returns the namespace where limiterd replicas publish their status
// records and the operator reads them: the operator's own namespace when it runs in a pod
// (limiterd's default is its own pod's namespace: install both in one namespace), else
// limiterdv1alpha1.DefaultReplicaStatusNamespace.
func DefaultStatusNamespace() string {
	if ns := incluster.Namespace(); ns != "" {
		return ns
	}
	return limiterdv1alpha1.DefaultReplicaStatusNamespace
}

// listReplicas returns the replicas' status records, live or not, from the status namespace.
// A record that cannot be decoded still counts as a replica that serves nothing.
func (r *RateLimitPolicyReconciler) listReplicas(ctx context.Context) ([]limiterdv1alpha1.Replica, error) {
	reader := r.leases
	if reader == nil {
		reader = r.Client
	}
	var leases coordinationv1.LeaseList
	if err := reader.List(ctx, &leases, client.InNamespace(r.StatusNamespace), client.HasLabels{limiterdv1alpha1.ReplicaLabel}); err != nil {
		return nil, fmt.Errorf("list replica status Leases in %s: %w", r.StatusNamespace, err)
	}
	replicas := make([]limiterdv1alpha1.Replica, 0, len(leases.Items))
	for i := range leases.Items {
		rep, err := limiterdv1alpha1.ReplicaFromLease(&leases.Items[i])
		if errors.Is(err, limiterdv1alpha1.ErrNotAReplicaRecord) {
			continue
		}
		if err != nil {
			logf.FromContext(ctx).Info("replica status unreadable", "lease", leases.Items[i].Name, "error", err.Error())
		}
		replicas = append(replicas, rep)
	}
	return replicas, nil
}

// setEnforcement sets the enforcement fields of status and its Enforced condition for policy p
// at its current generation, from the replicas' records at now; rendered says whether that
// generation is in the ConfigMap. It returns how soon the first live record expires (plus a
// margin), when the status must be computed again; 0 when no record is live.
func setEnforcement(p *limiterdv1alpha1.RateLimitPolicy, status *limiterdv1alpha1.RateLimitPolicyStatus,
	rendered bool, replicas []limiterdv1alpha1.Replica, now time.Time) time.Duration {
	id := p.ID()
	gen := p.Generation
	live := make([]limiterdv1alpha1.Replica, 0, len(replicas))
	for _, rep := range replicas {
		if rep.Live(now) {
			live = append(live, rep)
		}
	}
	slices.SortFunc(live, func(a, b limiterdv1alpha1.Replica) int { return strings.Compare(a.Name, b.Name) })

	var (
		recheck   time.Duration
		serving   int
		dryRun    int64
		behind    []string
		rejectors []string
		firstErr  string
	)
	for _, rep := range live {
		if until := rep.Expires.Sub(now) + recheckMargin; recheck == 0 || until < recheck {
			recheck = until
		}
		s, ok := rep.Record.Lookup(id)
		switch {
		case ok && s.State == limiterdv1alpha1.ReplicaServing && s.Generation == gen:
			serving++
			dryRun += int64(min(s.DryRunRejected, 1<<62)) // bounded
		case ok && s.State == limiterdv1alpha1.ReplicaRejected && s.Generation == gen:
			if len(rejectors) == 0 {
				firstErr = s.Error
			}
			rejectors = append(rejectors, rep.Name)
		default:
			behind = append(behind, rep.Name)
		}
	}
	status.Replicas = int32(len(live))       // replicas of one deployment
	status.EnforcedReplicas = int32(serving) // at most Replicas
	status.Enforced = fmt.Sprintf("%d/%d", serving, len(live))
	status.DryRunRejected = nil
	if slices.ContainsFunc(p.Spec.Tiers, func(t limiterdv1alpha1.Tier) bool { return t.DryRun }) {
		status.DryRunRejected = &dryRun
	}

	c := metav1.Condition{Type: ConditionEnforced, Status: metav1.ConditionFalse, ObservedGeneration: gen}
	switch {
	case !rendered:
		c.Reason = ReasonNotRendered
		c.Message = fmt.Sprintf("generation %d is not rendered for limiterd (see condition %s); %d of %d live replicas serve it",
			gen, ConditionReady, serving, len(live))
	case len(live) == 0:
		c.Reason = ReasonNoReplicas
		c.Message = "no live limiterd replica reports its status"
	case len(rejectors) > 0:
		c.Reason = ReasonRejectedByReplica
		c.Message = fmt.Sprintf("generation %d was rejected by %s %s", gen, plural(len(rejectors), "replica", "replicas"), names(rejectors))
		if firstErr != "" {
			c.Message += fmt.Sprintf(" (%s: %s)", rejectors[0], firstErr)
		}
	case serving < len(live):
		c.Reason = ReasonPropagating
		c.Message = fmt.Sprintf("%d of %d live replicas serve generation %d; waiting for %s", serving, len(live), gen, names(behind))
	default:
		c.Status = metav1.ConditionTrue
		c.Reason = ReasonEnforced
		c.Message = fmt.Sprintf("all %d live replicas serve generation %d", len(live), gen)
	}
	meta.SetStatusCondition(&status.Conditions, c)
	return recheck
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// names lists replica names, at most maxNamedReplicas of them.
func names(list []string) string {
	if len(list) <= maxNamedReplicas {
		return strings.Join(list, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(list[:maxNamedReplicas], ", "), len(list)-maxNamedReplicas)
}

// replicaEvents maps changes of the replicas' status Leases to the policies whose status they
// change: a replica appearing, disappearing or coming back changes every policy's replica
// count; a renewal changes only the policies whose entries changed (usually none).
func (r *RateLimitPolicyReconciler) replicaEvents() handler.Funcs {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) {
			r.enqueueAll(ctx, e.Object, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) {
			r.enqueueAll(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			oldLease, okOld := e.ObjectOld.(*coordinationv1.Lease)
			newLease, okNew := e.ObjectNew.(*coordinationv1.Lease)
			if !okOld || !okNew || newLease.Namespace != r.StatusNamespace {
				return
			}
			oldRep, errOld := limiterdv1alpha1.ReplicaFromLease(oldLease)
			newRep, errNew := limiterdv1alpha1.ReplicaFromLease(newLease)
			if errOld != nil || errNew != nil || !oldRep.Live(r.now()) {
				r.enqueueAll(ctx, newLease, q) // became a record, or came back after expiring
				return
			}
			var changed []limiterdv1alpha1.PolicyID
			for id := range oldRep.Record {
				if _, kept := newRep.Record[id]; !kept {
					changed = append(changed, id)
				}
			}
			for id, s := range newRep.Record {
				if old, ok := oldRep.Record[id]; !ok || old != s {
					changed = append(changed, id)
				}
			}
			for _, id := range changed {
				if !enqueuePolicy(id, q) { // a digest of the compact format names no policy
					r.enqueueAll(ctx, newLease, q)
					return
				}
			}
		},
	}
}

// enqueueAll enqueues every policy, for a change of the status Lease obj.
func (r *RateLimitPolicyReconciler) enqueueAll(ctx context.Context, obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if obj.GetNamespace() != r.StatusNamespace {
		return
	}
	var policies limiterdv1alpha1.RateLimitPolicyList
	if err := r.Client.List(ctx, &policies); err != nil {
		logf.FromContext(ctx).Error(err, "list RateLimitPolicies for a replica status change", "lease", obj.GetName())
		return
	}
	for i := range policies.Items {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: policies.Items[i].Namespace, Name: policies.Items[i].Name}})
	}
}

// enqueuePolicy enqueues the policy of a replica's record entry and reports whether it could:
// an entry whose key does not parse as a policy ID (a digest of the compact format) names no
// policy by itself.
func enqueuePolicy(id limiterdv1alpha1.PolicyID, q workqueue.TypedRateLimitingInterface[reconcile.Request]) bool {
	id, err := limiterdv1alpha1.ParsePolicyID(id.String())
	if err != nil {
		return false
	}
	q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: id.Namespace(), Name: id.Name()}})
	return true
}
