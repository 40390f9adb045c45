// Package controllers holds the limiterd operator's controllers.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	limiterdv1alpha1 "github.com/limiterd/limiterd/api/v1alpha1"
)

// The Ready condition of a RateLimitPolicy and its reasons. Events about a policy carry the
// reason of the condition they report, or ReasonRestored.
const (
	// ConditionReady says whether the policy's current generation is rendered into its ConfigMap.
	ConditionReady = "Ready"
	// ReasonRendered (Ready=True): the ConfigMap carries the current generation.
	ReasonRendered = "Rendered"
	// ReasonInvalid (Ready=False): the policy breaks the rules of a RateLimitPolicy; the
	// ConfigMap, if any, keeps the last valid generation.
	ReasonInvalid = "Invalid"
	// ReasonTooLarge (Ready=False): the rendered policy exceeds MaxConfigMapDataBytes; the
	// ConfigMap, if any, keeps the last generation that fitted.
	ReasonTooLarge = "TooLarge"
	// ReasonConfigMapConflict (Ready=False): a ConfigMap of the policy's ConfigMap name carries
	// another policy, or no policy (its PolicyIDAnnotation), so the operator leaves it alone.
	ReasonConfigMapConflict = "ConfigMapConflict"
	// ReasonRestored is the reason of the event recorded when the operator puts back a
	// ConfigMap that was edited or deleted after it had carried the current generation.
	ReasonRestored = "Restored"
)

// EventReporter is the name the operator's events are reported by (reportingController).
const EventReporter = "limiterd-operator"

// The operator's permissions, turned into config/rbac/role.yaml by `make manifests`. Cluster-wide
// it reads policies, writes their status and records events about them; ConfigMaps it reads and
// writes in its own namespace only (ConfigMapNamespace; the generated Role names limiterd-system,
// and the chart grants the same rules in its release namespace), and it has no right on any other
// namespace's ConfigMaps. Removing the ConfigMaps earlier versions rendered into the policies'
// namespaces (RemoveLegacyConfigMaps) needs a cluster-wide delete that is deliberately not a
// marker: the chart grants it, narrowed by admission, only for that one-time upgrade step
// (operator.legacyConfigMapCleanup).
// +kubebuilder:rbac:groups=limiterd.dev,resources=ratelimitpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=limiterd.dev,resources=ratelimitpolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",namespace=limiterd-system,resources=configmaps,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=limiterd-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// The metrics endpoint (main.go) authenticates its callers by TokenReview and authorizes them by
// SubjectAccessReview.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// RateLimitPolicyReconciler renders each RateLimitPolicy into a ConfigMap of ConfigMapNamespace
// (limiterd's namespace), named ConfigMapName(policy ID), labelled with the policy's name and
// namespace and annotated with its ID (the format of api/v1alpha1/configmap.go), from which
// limiterd reads it. It reports the outcome in the policy's status. Owner references cannot
// cross namespaces, so it deletes the ConfigMap itself once the policy is gone: the ConfigMaps
// it watches map to their policies by annotation, and a policy not found has its ConfigMap
// deleted (also one deleted while the operator was down, at the first sync). With
// RemoveLegacyConfigMaps it also removes the ConfigMap an earlier version rendered into the
// policy's namespace, once no live limiterd replica serves the policy from it
// (removeLegacyConfigMap).
type RateLimitPolicyReconciler struct {
	// Client reads from the manager's cache (ConfigMaps restricted by CacheByObject) and writes.
	Client client.Client
	// ConfigMapNamespace is where the policies' ConfigMaps are written: limiterd's namespace.
	ConfigMapNamespace string
	// APIReader reads from the API server, for ConfigMaps the cache does not hold.
	APIReader client.Reader
	// Recorder records the events users need to see.
	Recorder events.EventRecorder
	// StatusNamespace is where limiterd replicas publish their status Leases (see enforcement.go).
	// SetupWithManager watches the replicas' Leases there, and there only.
	StatusNamespace string
	// Clock tells the time replica records are judged live at (nil: the real clock).
	Clock clock.PassiveClock
	// RemoveLegacyConfigMaps lets the reconciler delete the ConfigMap an earlier version
	// rendered into a policy's own namespace (removeLegacyConfigMap): a one-time upgrade step
	// that needs the right to delete ConfigMaps outside ConfigMapNamespace, which the operator
	// holds only when it is switched on (main.go's --remove-legacy-configmaps). Off (the zero
	// value), such a ConfigMap is left in place and reported by an event.
	RemoveLegacyConfigMaps bool

	// leases reads the replicas' status Leases from the cache SetupWithManager starts (nil:
	// through Client).
	leases client.Reader
}

// now returns the time of r's clock.
func (r *RateLimitPolicyReconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

// NewRateLimitPolicyReconciler returns a reconciler writing ConfigMaps into configMapNamespace,
// using mgr's client, API reader and an event recorder named EventReporter. mgr's cache
// must hold the ConfigMaps of configMapNamespace (CacheByObject).
func NewRateLimitPolicyReconciler(mgr ctrl.Manager, configMapNamespace string) *RateLimitPolicyReconciler {
	return &RateLimitPolicyReconciler{
		Client:             mgr.GetClient(),
		ConfigMapNamespace: configMapNamespace,
		APIReader:          mgr.GetAPIReader(),
		Recorder:           mgr.GetEventRecorder(EventReporter),

		StatusNamespace: DefaultStatusNamespace(),
	}
}

// CacheByObject restricts the manager's ConfigMap cache to the ConfigMaps the operator writes
// (those labelled PolicyLabel in configMapNamespace), rather than every ConfigMap of the
// cluster. Pass it as cache.Options.ByObject. (The replicas' Leases have a cache of their own,
// in StatusNamespace: see SetupWithManager.)
func CacheByObject(configMapNamespace string) map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {
			Label:      labelExists(limiterdv1alpha1.PolicyLabel),
			Namespaces: map[string]cache.Config{configMapNamespace: {}},
		},
	}
}

// labelExists selects the objects that have the label key.
func labelExists(key string) labels.Selector {
	req, err := labels.NewRequirement(key, selection.Exists, nil)
	if err != nil {
		panic(fmt.Sprintf("selector of label %s: %v", key, err)) // a constant: cannot fail
	}
	return labels.NewSelector().Add(*req)
}

// SetupWithManager registers the reconciler with mgr. Policies are reconciled when their
// generation changes (not on status or metadata changes), when the ConfigMaps annotated with
// their ID change, and when what replicas' status Leases report of them changes.
//
// The Leases are watched through a cache of their own, holding the Leases labelled
// ReplicaLabel in StatusNamespace only (the operator may read Leases there only), so that the
// manager's cache needs no configuration for them.
func (r *RateLimitPolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	leases, err := cluster.New(mgr.GetConfig(), func(o *cluster.Options) {
		o.Scheme, o.HTTPClient = mgr.GetScheme(), mgr.GetHTTPClient()
		o.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return mgr.GetRESTMapper(), nil }
		o.Cache.DefaultNamespaces = map[string]cache.Config{r.StatusNamespace: {}}
		o.Cache.DefaultLabelSelector = labelExists(limiterdv1alpha1.ReplicaLabel)
	})
	if err != nil {
		return fmt.Errorf("set up the cache of replica status Leases in %s: %w", r.StatusNamespace, err)
	}
	if err := mgr.Add(leases); err != nil {
		return fmt.Errorf("set up the cache of replica status Leases in %s: %w", r.StatusNamespace, err)
	}
	r.leases = leases.GetCache()
	err = ctrl.NewControllerManagedBy(mgr).
		Named("ratelimitpolicy").
		For(&limiterdv1alpha1.RateLimitPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.configMapPolicy)).
		WatchesRawSource(source.Kind[client.Object](leases.GetCache(), &coordinationv1.Lease{}, r.replicaEvents())).
		Complete(r)
	if err != nil {
		return fmt.Errorf("set up RateLimitPolicy controller: %w", err)
	}
	return nil
}

// Reconcile brings the ConfigMap and the status of one policy up to date. It writes only what
// differs: a resync of an up-to-date policy writes nothing.
func (r *RateLimitPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)

	var policy limiterdv1alpha1.RateLimitPolicy
	if err := r.Client.Get(ctx, req.NamespacedName, &policy); err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted (or never there, for a ConfigMap left behind): its ConfigMap goes.
			return ctrl.Result{}, r.deleteConfigMap(ctx, limiterdv1alpha1.NewPolicyID(req.Namespace, req.Name))
		}
		return ctrl.Result{}, fmt.Errorf("get RateLimitPolicy %s: %w", req.NamespacedName, err)
	}
	if !policy.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	// Read before the ConfigMap is written, so that the status reports what the replicas said
	// of the ConfigMap as it was (a rejection, say), not what they may say of the new one.
	replicas, err := r.listReplicas(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}

	data, ready := renderConfigMap(&policy, limiterdv1alpha1.MaxConfigMapDataBytes)
	status := policy.Status.DeepCopy()
	if data != nil {
		wasCurrent := isCurrent(&policy)
		name := limiterdv1alpha1.ConfigMapName(policy.ID())
		changed, err := r.applyConfigMap(ctx, &policy, data)
		var conflict *conflictError
		switch {
		case errors.As(err, &conflict):
			ready = condition(&policy, metav1.ConditionFalse, ReasonConfigMapConflict, conflict.Error()+"; delete it or rename the policy")
		case err != nil:
			return ctrl.Result{}, err
		default:
			if changed {
				log.Info("wrote ConfigMap", "configMap", r.ConfigMapNamespace+"/"+name, "generation", policy.Generation)
			}
			if changed && wasCurrent && status.ConfigMapName == name {
				// The ConfigMap had carried this generation: someone edited or deleted it.
				r.Recorder.Eventf(&policy, nil, corev1.EventTypeNormal, ReasonRestored, "RestoreConfigMap",
					"ConfigMap %s/%s was changed or deleted; restored generation %d", r.ConfigMapNamespace, name, policy.Generation)
			}
			// status.configMapName names the legacy ConfigMap until it is removed (or left).
			if status.ConfigMapName == "" || status.ConfigMapName == name {
				status.ConfigMapName = name
			} else if removed, err := r.removeLegacyConfigMap(ctx, &policy, status.ConfigMapName, replicas, r.now()); err != nil {
				return ctrl.Result{}, err
			} else if removed {
				status.ConfigMapName = name
			}
		}
	}

	previous := meta.FindStatusCondition(policy.Status.Conditions, ConditionReady)
	status.ObservedGeneration = policy.Generation
	status.TierCount = int32(len(policy.Spec.Tiers)) // at most MaxTiers
	meta.SetStatusCondition(&status.Conditions, ready)
	// Look again when the first live replica record expires.
	result := ctrl.Result{RequeueAfter: setEnforcement(&policy, status, ready.Status == metav1.ConditionTrue, replicas, r.now())}
	if equality.Semantic.DeepEqual(*status, policy.Status) {
		return result, nil
	}
	if ready.Status != metav1.ConditionTrue && !sameCondition(previous, &ready) {
		log.Info("policy not rendered", "reason", ready.Reason, "message", ready.Message, "generation", policy.Generation)
		r.Recorder.Eventf(&policy, nil, corev1.EventTypeWarning, ready.Reason, "Render", "%s", ready.Message)
	}
	patch := client.MergeFrom(policy.DeepCopy())
	policy.Status = *status
	if err := r.Client.Status().Patch(ctx, &policy, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("patch status of RateLimitPolicy %s: %w", req.NamespacedName, err)
	}
	return result, nil
}

// renderConfigMap renders a policy: the data of its ConfigMap, nil when nothing may be
// written, and the Ready condition to report. maxBytes bounds the data (keys and values, in
// bytes). It neither modifies p nor performs I/O.
func renderConfigMap(p *limiterdv1alpha1.RateLimitPolicy, maxBytes int) (map[string]string, metav1.Condition) {
	defaulted := p.DeepCopy()
	defaulted.Default() // an older CRD may not have defaulted every field
	if err := limiterdv1alpha1.Validate(defaulted); err != nil {
		return nil, condition(p, metav1.ConditionFalse, ReasonInvalid, err.Error())
	}
	data, err := limiterdv1alpha1.RenderConfigMapData(defaulted)
	if err != nil {
		// RenderConfigMapData fails on an invalid policy (ruled out above), on data larger than
		// MaxConfigMapDataBytes, and on a YAML encoding error, which a valid policy cannot cause.
		return nil, condition(p, metav1.ConditionFalse, ReasonTooLarge, err.Error()+"; split the policy")
	}
	if n := dataBytes(data); n > maxBytes {
		return nil, condition(p, metav1.ConditionFalse, ReasonTooLarge, fmt.Sprintf(
			"render ConfigMap data: %d bytes, more than %d; split the policy", n, maxBytes))
	}
	return data, condition(p, metav1.ConditionTrue, ReasonRendered, fmt.Sprintf(
		"generation %d is rendered into ConfigMap %s", p.Generation, limiterdv1alpha1.ConfigMapName(p.ID())))
}

func condition(p *limiterdv1alpha1.RateLimitPolicy, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	const maxMessage = 32768 // metav1.Condition's bound
	if len(message) > maxMessage {
		message = message[:maxMessage-3] + "..."
	}
	return metav1.Condition{
		Type:               ConditionReady,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: p.Generation,
	}
}

// dataBytes is the size a ConfigMap's data counts against its limit: keys and values.
func dataBytes(data map[string]string) int {
	n := 0
	for k, v := range data {
		n += len(k) + len(v)
	}
	return n
}

// isCurrent reports whether the status says the policy's current generation is rendered.
func isCurrent(p *limiterdv1alpha1.RateLimitPolicy) bool {
	c := meta.FindStatusCondition(p.Status.Conditions, ConditionReady)
	return p.Status.ObservedGeneration == p.Generation && c != nil &&
		c.Status == metav1.ConditionTrue && c.ObservedGeneration == p.Generation
}

func sameCondition(a, b *metav1.Condition) bool {
	return a != nil && b != nil && a.Status == b.Status && a.Reason == b.Reason &&
		a.Message == b.Message && a.ObservedGeneration == b.ObservedGeneration
}

// conflictError says that the ConfigMap of a policy's name carries another policy, or is not
// the operator's.
type conflictError struct {
	configMap string // "<namespace>/<name>"
	owner     string // the PolicyIDAnnotation found; "" when there is none
}

func (e *conflictError) Error() string {
	if e.owner == "" {
		return fmt.Sprintf("ConfigMap %s exists without annotation %s: it is not the operator's", e.configMap, limiterdv1alpha1.PolicyIDAnnotation)
	}
	return fmt.Sprintf("ConfigMap %s carries policy %s", e.configMap, e.owner)
}

// applyConfigMap creates or updates the policy's ConfigMap to carry data, and reports whether it
// wrote. Labels and annotations of others are kept; binaryData is removed. Only a ConfigMap
// annotated with the policy's own ID is updated: one annotated with another policy's ID, or
// without the annotation (someone else's ConfigMap that happens to have the name), is left
// alone (a *conflictError).
func (r *RateLimitPolicyReconciler) applyConfigMap(ctx context.Context, p *limiterdv1alpha1.RateLimitPolicy, data map[string]string) (bool, error) {
	key := client.ObjectKey{Namespace: r.ConfigMapNamespace, Name: limiterdv1alpha1.ConfigMapName(p.ID())}
	current := &corev1.ConfigMap{}
	err := r.Client.Get(ctx, key, current)
	if apierrors.IsNotFound(err) {
		// The cache holds labelled ConfigMaps only: one whose label was removed still exists.
		err = r.APIReader.Get(ctx, key, current)
	}
	switch {
	case apierrors.IsNotFound(err):
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		setDesired(p, cm, data)
		if err := r.Client.Create(ctx, cm); err != nil {
			return false, fmt.Errorf("create ConfigMap %s: %w", key, err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get ConfigMap %s: %w", key, err)
	}
	if owner := current.Annotations[limiterdv1alpha1.PolicyIDAnnotation]; owner != p.ID().String() {
		return false, &conflictError{configMap: key.String(), owner: owner}
	}

	desired := current.DeepCopy()
	setDesired(p, desired, data)
	if equality.Semantic.DeepEqual(current, desired) {
		return false, nil
	}
	if err := r.Client.Update(ctx, desired); err != nil {
		return false, fmt.Errorf("update ConfigMap %s: %w", key, err)
	}
	return true, nil
}

// setDesired makes cm carry data, the policy labels and the policy ID annotation.
func setDesired(p *limiterdv1alpha1.RateLimitPolicy, cm *corev1.ConfigMap, data map[string]string) {
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels[limiterdv1alpha1.PolicyLabel] = limiterdv1alpha1.PolicyLabelValue(p.Name)
	cm.Labels[limiterdv1alpha1.PolicyNamespaceLabel] = p.ID().Namespace()
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[limiterdv1alpha1.PolicyIDAnnotation] = p.ID().String()
	cm.Data = data
	cm.BinaryData = nil
}

// deleteConfigMap deletes the ConfigMap of the policy id, which no longer exists, if the cache
// holds one annotated with that ID.
func (r *RateLimitPolicyReconciler) deleteConfigMap(ctx context.Context, id limiterdv1alpha1.PolicyID) error {
	cm := &corev1.ConfigMap{}
	key := client.ObjectKey{Namespace: r.ConfigMapNamespace, Name: limiterdv1alpha1.ConfigMapName(id)}
	if err := r.Client.Get(ctx, key, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("get ConfigMap %s of deleted policy %s: %w", key, id, err)
	}
	if cm.Annotations[limiterdv1alpha1.PolicyIDAnnotation] != id.String() {
		return nil
	}
	err := r.Client.Delete(ctx, cm, client.Preconditions{UID: &cm.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ConfigMap %s of deleted policy %s: %w", key, id, err)
	}
	logf.FromContext(ctx).Info("deleted ConfigMap of deleted policy", "configMap", key.String(), "policy", id.String())
	return nil
}

// configMapPolicy maps a policy ConfigMap to its policy, by its PolicyIDAnnotation; nothing for
// a ConfigMap without a valid one.
func (r *RateLimitPolicyReconciler) configMapPolicy(_ context.Context, obj client.Object) []reconcile.Request {
	if obj.GetNamespace() != r.ConfigMapNamespace {
		return nil
	}
	id, err := limiterdv1alpha1.ParsePolicyID(obj.GetAnnotations()[limiterdv1alpha1.PolicyIDAnnotation])
	if err != nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: id.Namespace(), Name: id.Name()}}}
}
