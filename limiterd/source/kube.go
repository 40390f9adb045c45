package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// ConfigMapOriginPrefix starts the origin of a policy ConfigMap's contribution:
// "configmap:<namespace>/<name>".
const ConfigMapOriginPrefix = "configmap:"

// ErrNotSynced is returned by the readiness check of a Kube source before its first sync.
var ErrNotSynced = errors.New("policy ConfigMaps are not synced yet")

// KubeOptions configure a Kube source.
type KubeOptions struct {
	// ConfigMapNamespace is the one namespace whose policy ConfigMaps are watched: where the
	// operator renders them, limiterd's own. Required.
	ConfigMapNamespace string
	// PolicyNamespace, if set, limits the policies served to those of that namespace: the watch
	// selects their ConfigMaps by v1alpha1.PolicyNamespaceLabel, and a ConfigMap carrying a
	// policy of another namespace is rejected.
	PolicyNamespace string
	// Logger defaults to slog.Default.
	Logger *slog.Logger
	// OnChange, if set, is called after each ConfigMap event was handled: its policy applied,
	// rejected or removed. It must not block.
	OnChange func()
}

// Rejection is a policy ConfigMap whose current content limiterd could not apply: unparsable
// (see v1alpha1.ParseConfigMapData), invalid, or defining a policy another origin serves. The
// pipeline keeps serving the last good version of its policy, if any.
type Rejection struct {
	// ConfigMap is "<namespace>/<name>".
	ConfigMap string
	// PolicyID is the policy the ConfigMap carries, as far as it can be told from a ConfigMap
	// that could not be parsed; "" when it cannot.
	PolicyID v1alpha1.PolicyID
	// Generation is the generation the ConfigMap claims (its "generation" key), 0 when unknown.
	Generation int64
	// Err says why it was rejected.
	Err error
}

// Kube feeds a Pipeline from the policy ConfigMaps the operator renders into one namespace
// (those labelled v1alpha1.PolicyLabel, in the format of v1alpha1.ParseConfigMapData), watched
// through a client-go informer of that namespace only, so that limiterd needs no right on the
// ConfigMaps of any other namespace. Each ConfigMap is one origin,
// ConfigMapOriginPrefix+"<namespace>/<name>", contributing one policy, "<namespace>/<policy
// name>" (the policy's namespace, which the ConfigMap's is not):
//
//   - added or changed: its policy is applied; content that cannot be parsed or applied is
//     rejected (logged and counted by the pipeline, and listed by Rejections), and the last good
//     version of that policy keeps serving;
//   - deleted (or its label removed): its policy is removed, and then answers "unknown policy".
//
// A ConfigMap must be named v1alpha1.ConfigMapName(policy ID), as the operator names it, so
// that each policy has exactly one ConfigMap.
//
// While the API server cannot be reached the pipeline keeps what it has; the informer retries
// and catches up (relisting) once it is back.
type Kube struct {
	client   kubernetes.Interface
	pipeline *Pipeline
	opts     KubeOptions
	synced   atomic.Bool

	mu       sync.Mutex
	rejected map[string]Rejection         // by origin
	sources  map[v1alpha1.PolicyID]string // policy ID -> the ConfigMap "<namespace>/<name>" it is served from
}

// NewKube returns a source reading policy ConfigMaps through client into pipeline. Run starts it.
func NewKube(client kubernetes.Interface, pipeline *Pipeline, opts KubeOptions) *Kube {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Kube{client: client, pipeline: pipeline, opts: opts,
		rejected: make(map[string]Rejection), sources: make(map[v1alpha1.PolicyID]string)}
}

// selector returns the label selector of the watched ConfigMaps.
func (k *Kube) selector() string {
	if k.opts.PolicyNamespace == "" {
		return v1alpha1.PolicyLabel
	}
	return v1alpha1.PolicyLabel + "," + v1alpha1.PolicyNamespaceLabel + "=" + k.opts.PolicyNamespace
}

// Run watches the policy ConfigMaps until ctx is done. Once the informer's first list has been
// handled it calls the pipeline's Synced, so that limiterd becomes ready even when there is no
// policy, and Synced reports true. It returns an error only if the watch cannot be set up.
func (k *Kube) Run(ctx context.Context) error {
	if k.opts.ConfigMapNamespace == "" {
		return errors.New("watch policy ConfigMaps: no namespace given")
	}
	selector := k.selector()
	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
		informers.WithNamespace(k.opts.ConfigMapNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }),
		informers.WithTransform(stripManagedFields),
	)
	informer := factory.Core().V1().ConfigMaps().Informer()
	if err := informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		k.opts.Logger.Warn("policy ConfigMap watch failed", "namespace", k.opts.ConfigMapNamespace, "error", err)
	}); err != nil {
		return fmt.Errorf("watch policy ConfigMaps: %w", err)
	}
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    k.onAdd,
		UpdateFunc: k.onUpdate,
		DeleteFunc: k.onDelete,
	})
	if err != nil {
		return fmt.Errorf("watch policy ConfigMaps: %w", err)
	}
	defer factory.Shutdown()
	factory.Start(ctx.Done())
	k.opts.Logger.Info("policy ConfigMaps watched", "namespace", k.opts.ConfigMapNamespace, "selector", selector)
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil // ctx is done
	}
	k.pipeline.Synced()
	k.synced.Store(true)
	k.opts.Logger.Info("policy ConfigMaps synced", "namespace", k.opts.ConfigMapNamespace)
	<-ctx.Done()
	return nil
}

// Synced reports whether the informer's first list has been handled.
func (k *Kube) Synced() bool { return k.synced.Load() }

// Ready is a readiness check: nil once Synced, ErrNotSynced before.
func (k *Kube) Ready(context.Context) error {
	if !k.Synced() {
		return ErrNotSynced
	}
	return nil
}

// Rejections returns the ConfigMaps whose current content was rejected, sorted by ConfigMap.
func (k *Kube) Rejections() []Rejection {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Rejection, 0, len(k.rejected))
	for _, r := range k.rejected {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Rejection) int { return strings.Compare(a.ConfigMap, b.ConfigMap) })
	return out
}

// ConfigMapOf returns the ConfigMap ("<namespace>/<name>") the policy of ID id is served from,
// "" when no ConfigMap serves it.
func (k *Kube) ConfigMapOf(id v1alpha1.PolicyID) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sources[id]
}

func (k *Kube) onAdd(obj any) {
	if cm, ok := obj.(*corev1.ConfigMap); ok {
		k.upsert(cm)
	}
}

// onUpdate handles a change; an update of the same version (a resync) changes nothing.
func (k *Kube) onUpdate(oldObj, newObj any) {
	old, okOld := oldObj.(*corev1.ConfigMap)
	cm, ok := newObj.(*corev1.ConfigMap)
	if ok && (!okOld || old.ResourceVersion != cm.ResourceVersion) {
		k.upsert(cm)
	}
}

// onDelete handles a deletion, also one the informer learnt of only by relisting.
func (k *Kube) onDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if cm, ok := obj.(*corev1.ConfigMap); ok {
		k.remove(cm.Namespace, cm.Name)
	}
}

func (k *Kube) upsert(cm *corev1.ConfigMap) {
	key := cm.Namespace + "/" + cm.Name
	origin := ConfigMapOriginPrefix + key
	p, err := k.parseConfigMap(cm)
	if err != nil {
		err = fmt.Errorf("ConfigMap %s: %w", key, err)
		k.reject(cm, origin, err)
		k.pipeline.Fail(origin, err)
		k.changed()
		return
	}
	if err := k.pipeline.Apply(origin, []*v1alpha1.RateLimitPolicy{p}); err != nil {
		k.reject(cm, origin, fmt.Errorf("ConfigMap %s: %w", key, err))
		k.changed()
		return
	}
	k.mu.Lock()
	delete(k.rejected, origin)
	k.forgetLocked(key)
	k.sources[p.ID()] = key
	k.mu.Unlock()
	k.changed()
}

func (k *Kube) remove(namespace, name string) {
	key := namespace + "/" + name
	origin := ConfigMapOriginPrefix + key
	k.mu.Lock()
	delete(k.rejected, origin)
	k.forgetLocked(key)
	k.mu.Unlock()
	k.pipeline.Remove(origin)
	k.changed()
}

// forgetLocked drops the policies served from the ConfigMap key from k.sources.
func (k *Kube) forgetLocked(key string) {
	for id, cm := range k.sources {
		if cm == key {
			delete(k.sources, id)
		}
	}
}

func (k *Kube) reject(cm *corev1.ConfigMap, origin string, err error) {
	r := Rejection{ConfigMap: cm.Namespace + "/" + cm.Name, Err: err}
	r.PolicyID, r.Generation = claimedPolicy(cm)
	if served := k.pipeline.Policies(origin); len(served) == 1 {
		r.PolicyID = served[0]
	}
	k.mu.Lock()
	k.rejected[origin] = r
	k.mu.Unlock()
}

func (k *Kube) changed() {
	if k.opts.OnChange != nil {
		k.opts.OnChange()
	}
}

// parseConfigMap reads the policy of a policy ConfigMap: one whose name is its ConfigMapName, of
// the namespace served.
func (k *Kube) parseConfigMap(cm *corev1.ConfigMap) (*v1alpha1.RateLimitPolicy, error) {
	if len(cm.BinaryData) > 0 {
		keys := make([]string, 0, len(cm.BinaryData))
		for k := range cm.BinaryData {
			keys = append(keys, strconv.Quote(k))
		}
		slices.Sort(keys)
		return nil, fmt.Errorf("parse ConfigMap data: unknown binaryData keys %s", strings.Join(keys, ", "))
	}
	p, err := v1alpha1.ParseConfigMapData(cm.Name, cm.Data)
	if err != nil {
		return nil, err
	}
	if ns := k.opts.PolicyNamespace; ns != "" && p.Namespace != ns {
		return nil, fmt.Errorf("policy %s is not of namespace %s, the one served", p.ID(), ns)
	}
	return p, nil
}

// claimedPolicy tells, as well as it can, which policy and generation a ConfigMap that could not
// be parsed was meant to carry: the policy of the document's metadata when the ConfigMap bears
// its name, else the policy of the ConfigMap's v1alpha1.PolicyIDAnnotation when the ConfigMap
// bears its name (the zero PolicyID when neither does); the generation from the "generation"
// key, else from the document.
func claimedPolicy(cm *corev1.ConfigMap) (id v1alpha1.PolicyID, generation int64) {
	var doc struct {
		Metadata struct {
			Name       string `json:"name"`
			Namespace  string `json:"namespace"`
			Generation int64  `json:"generation"`
		} `json:"metadata"`
	}
	decoded := yaml.Unmarshal([]byte(cm.Data[v1alpha1.ConfigMapDataKey]), &doc) == nil
	annotated, annotErr := v1alpha1.ParsePolicyID(cm.Annotations[v1alpha1.PolicyIDAnnotation])
	switch {
	case decoded && doc.Metadata.Name != "" &&
		v1alpha1.ConfigMapName(v1alpha1.NewPolicyID(doc.Metadata.Namespace, doc.Metadata.Name)) == cm.Name:
		id = v1alpha1.NewPolicyID(doc.Metadata.Namespace, doc.Metadata.Name)
	case annotErr == nil && v1alpha1.ConfigMapName(annotated) == cm.Name:
		id = annotated
	}
	if g, err := strconv.ParseInt(cm.Data[v1alpha1.ConfigMapGenerationKey], 10, 64); err == nil && g > 0 {
		generation = g
	} else if decoded && doc.Metadata.Generation > 0 {
		generation = doc.Metadata.Generation
	}
	return id, generation
}

// stripManagedFields drops what limiterd never reads from cached ConfigMaps.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
