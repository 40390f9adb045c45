package controllers

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
)

const (
	// ReasonLegacyConfigMapRemoved is the reason of the event recorded when the operator deletes
	// the ConfigMap an earlier version rendered into the policy's own namespace.
	ReasonLegacyConfigMapRemoved = "LegacyConfigMapRemoved"
	// ReasonLegacyConfigMapLeft is the reason of the warning recorded when the operator leaves
	// that ConfigMap in place, since it may not delete ConfigMaps outside its namespace
	// (RemoveLegacyConfigMaps off).
	ReasonLegacyConfigMapLeft = "LegacyConfigMapLeft"
)

// Migration from the earlier layout (docs/configmap-format.md, "Migration"): earlier versions
// rendered each policy into a ConfigMap of the policy's own namespace, named
// LegacyConfigMapName(policy name), and recorded that name in status.configMapName; limiterd
// replicas of those versions read every namespace. The operator now renders into its own
// namespace, and removes the old ConfigMap only once no live replica that publishes its status
// serves the policy from anywhere but the new ConfigMap: replicas of earlier versions do not say
// where they serve a policy from, so while one of them serves it the old ConfigMap stays, and
// the policy is never unserved during an upgrade.
//
// Deleting the old ConfigMaps needs the right to delete ConfigMaps outside the operator's
// namespace, which a compromised operator could turn against any ConfigMap of the cluster. So it
// is opt-in (RemoveLegacyConfigMaps, the chart's operator.legacyConfigMapCleanup), for the upgrade
// from an earlier version only; otherwise the operator leaves the old ConfigMaps in place.

// removeLegacyConfigMap deletes the ConfigMap legacyName of the policy's namespace, which an
// earlier version rendered, when legacyServers says no live replica still serves the policy
// from it. It reports whether the operator is done with the ConfigMap: deleted now or already
// gone, refused, or, with RemoveLegacyConfigMaps off, left in place (a warning event names it).
// The operator may delete ConfigMaps outside its namespace only where admission lets it (a
// ConfigMap labelled PolicyLabel and controlled by a RateLimitPolicy): a refusal is reported as
// an event and the ConfigMap is no longer looked after.
func (r *RateLimitPolicyReconciler) removeLegacyConfigMap(ctx context.Context, p *limiterdv1alpha1.RateLimitPolicy,
	legacyName string, replicas []limiterdv1alpha1.Replica, now time.Time) (bool, error) {
	current := r.ConfigMapNamespace + "/" + limiterdv1alpha1.ConfigMapName(p.ID())
	log := logf.FromContext(ctx).WithValues("legacyConfigMap", p.Namespace+"/"+legacyName)
	if !r.RemoveLegacyConfigMaps {
		log.Info("legacy ConfigMap left in place: removal not enabled")
		r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, ReasonLegacyConfigMapLeft, "LeaveLegacyConfigMap",
			"ConfigMap %s of an earlier version is left in place (the operator deletes ConfigMaps outside its namespace only with "+
				"--remove-legacy-configmaps); the policy is served from ConfigMap %s: delete the old one once no limiterd of an earlier version runs",
			legacyName, current)
		return true, nil
	}
	if waiting := legacyServers(p.ID(), current, replicas, now); len(waiting) > 0 {
		log.V(1).Info("legacy ConfigMap kept: replicas serve the policy from it", "replicas", names(waiting))
		return false, nil
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: legacyName}}
	err := r.Client.Delete(ctx, cm)
	switch {
	case err == nil:
		log.Info("deleted legacy ConfigMap")
		r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, ReasonLegacyConfigMapRemoved, "DeleteLegacyConfigMap",
			"deleted ConfigMap %s of an earlier version; the policy is served from ConfigMap %s", legacyName, current)
		return true, nil
	case apierrors.IsNotFound(err):
		return true, nil
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
		log.Info("legacy ConfigMap not deleted: refused", "error", err.Error())
		r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, ReasonLegacyConfigMapRemoved, "DeleteLegacyConfigMap",
			"ConfigMap %s of an earlier version was not deleted (%v); delete it if limiterd no longer needs it", legacyName, err)
		return true, nil
	default:
		return false, fmt.Errorf("delete legacy ConfigMap %s/%s: %w", p.Namespace, legacyName, err)
	}
}

// legacyServers returns the live replicas (at now) whose record has an entry for policy id that
// does not come from the ConfigMap current ("<namespace>/<name>"): replicas of earlier versions,
// which serve it from the legacy ConfigMap and leave ConfigMap empty. A replica without an entry
// for id does not serve it from the legacy ConfigMap (a current replica cannot read it), so it
// does not count.
func legacyServers(id limiterdv1alpha1.PolicyID, current string, replicas []limiterdv1alpha1.Replica, now time.Time) []string {
	var out []string
	for _, rep := range replicas {
		if !rep.Live(now) {
			continue
		}
		if s, ok := rep.Record.Lookup(id); ok && s.ConfigMap != current {
			out = append(out, rep.Name)
		}
	}
	return out
}
