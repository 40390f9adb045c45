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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
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
	// ReasonConfigMapConflict (Ready=False): a ConfigMap of the policy's ConfigMap name is
	// controlled by another object, so the operator leaves it alone.
	ReasonConfigMapConflict = "ConfigMapConflict"
	// ReasonRestored is the reason of the event recorded when the operator puts back a
	// ConfigMap that was edited or deleted after it had carried the current generation.
	ReasonRestored = "Restored"
)

// EventReporter is the name the operator's events are reported by (reportingController).
const EventReporter = "limiterd-operator"

// The operator's permissions, turned into config/rbac/role.yaml by `make manifests`.
// +kubebuilder:rbac:groups=limiterd.dev,resources=ratelimitpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=limiterd.dev,resources=ratelimitpolicies/status,verbs=get;update;patch
// Owner references that block owner deletion need this where OwnerReferencesPermissionEnforcement is on:
// +kubebuilder:rbac:groups=limiterd.dev,resources=ratelimitpolicies/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=limiterd-system,resources=leases,verbs=get;list;watch;create;update;patch;delete

// RateLimitPolicyReconciler renders each RateLimitPolicy into a ConfigMap of its namespace,
// named ConfigMapName(policy name), labelled PolicyLabel=PolicyLabelValue(policy name) and
// controlled by the policy, from which limiterd reads it. It reports the outcome in the policy's status.
type RateLimitPolicyReconciler struct {
	// Client reads from the manager's cache (ConfigMaps restricted by CacheByObject) and writes.
	Client client.Client
	// APIReader reads from the API server, for ConfigMaps the cache does not hold.
	APIReader client.Reader
	// Scheme maps the policy type to its group, version and kind for owner references.
	Scheme *runtime.Scheme
	// Recorder records the events users need to see.
	Recorder events.EventRecorder
	// StatusNamespace is where limiterd replicas publish their status Leases (see enforcement.go).
	// SetupWithManager watches the replicas' Leases there, and there only.
	StatusNamespace string
	// Clock tells the time replica records are judged live at (nil: the real clock).
	Clock clock.PassiveClock

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

// NewRateLimitPolicyReconciler returns a reconciler using mgr's client, API reader, scheme and
// an event recorder named EventReporter.
func NewRateLimitPolicyReconciler(mgr ctrl.Manager) *RateLimitPolicyReconciler {
	return &RateLimitPolicyReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Scheme:    mgr.GetScheme(),
		Recorder:  mgr.GetEventRecorder(EventReporter),

		StatusNamespace: DefaultStatusNamespace(),
	}
}

// CacheByObject restricts the manager's ConfigMap cache to the ConfigMaps the operator writes
// (those labelled PolicyLabel), rather than every ConfigMap of the cluster. Pass it as
// cache.Options.ByObject. (The replicas' Leases have a cache of their own, in StatusNamespace:
// see SetupWithManager.)
func CacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {Label: labelExists(limiterdv1alpha1.PolicyLabel)},
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
// generation changes (not on status or metadata changes), ConfigMaps they control whenever
// those change, and replicas' status Leases when what they report of the policy changes.
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
		Owns(&corev1.ConfigMap{}).
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
			return ctrl.Result{}, nil // deleted: its ConfigMap goes with it (owner reference)
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
		changed, err := r.applyConfigMap(ctx, &policy, data)
		var owned *controllerutil.AlreadyOwnedError
		switch {
		case errors.As(err, &owned):
			ready = condition(&policy, metav1.ConditionFalse, ReasonConfigMapConflict, fmt.Sprintf(
				"ConfigMap %s is controlled by %s %s; delete it or rename the policy", owned.Object.GetName(), owned.Owner.Kind, owned.Owner.Name))
		case err != nil:
			return ctrl.Result{}, err
		default:
			status.ConfigMapName = limiterdv1alpha1.ConfigMapName(policy.Name)
			if changed {
				log.Info("wrote ConfigMap", "configMap", status.ConfigMapName, "generation", policy.Generation)
			}
			if changed && wasCurrent {
				// The ConfigMap had carried this generation: someone edited or deleted it.
				r.Recorder.Eventf(&policy, nil, corev1.EventTypeNormal, ReasonRestored, "RestoreConfigMap",
					"ConfigMap %s was changed or deleted; restored generation %d", status.ConfigMapName, policy.Generation)
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
		"generation %d is rendered into ConfigMap %s", p.Generation, limiterdv1alpha1.ConfigMapName(p.Name)))
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

// applyConfigMap creates or updates the policy's ConfigMap to carry data, and reports whether it
// wrote. Labels and annotations of others are kept; binaryData is removed.
func (r *RateLimitPolicyReconciler) applyConfigMap(ctx context.Context, p *limiterdv1alpha1.RateLimitPolicy, data map[string]string) (bool, error) {
	key := client.ObjectKey{Namespace: p.Namespace, Name: limiterdv1alpha1.ConfigMapName(p.Name)}
	current := &corev1.ConfigMap{}
	err := r.Client.Get(ctx, key, current)
	if apierrors.IsNotFound(err) {
		// The cache holds labelled ConfigMaps only: one whose label was removed still exists.
		err = r.APIReader.Get(ctx, key, current)
	}
	switch {
	case apierrors.IsNotFound(err):
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		if err := r.setDesired(p, cm, data); err != nil {
			return false, err
		}
		if err := r.Client.Create(ctx, cm); err != nil {
			return false, fmt.Errorf("create ConfigMap %s: %w", key, err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get ConfigMap %s: %w", key, err)
	}

	desired := current.DeepCopy()
	if err := r.setDesired(p, desired, data); err != nil {
		return false, err
	}
	if equality.Semantic.DeepEqual(current, desired) {
		return false, nil
	}
	if err := r.Client.Update(ctx, desired); err != nil {
		return false, fmt.Errorf("update ConfigMap %s: %w", key, err)
	}
	return true, nil
}

// setDesired makes cm carry data, the policy label and the policy's controller reference.
func (r *RateLimitPolicyReconciler) setDesired(p *limiterdv1alpha1.RateLimitPolicy, cm *corev1.ConfigMap, data map[string]string) error {
	if err := controllerutil.SetControllerReference(p, cm, r.Scheme); err != nil {
		return fmt.Errorf("own ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels[limiterdv1alpha1.PolicyLabel] = limiterdv1alpha1.PolicyLabelValue(p.Name)
	cm.Data = data
	cm.BinaryData = nil
	return nil
}
