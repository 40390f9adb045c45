package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// The ConfigMap format: how the operator hands a RateLimitPolicy to limiterd
// (docs/configmap-format.md describes it for people).
//
// For each RateLimitPolicy the operator owns one ConfigMap in limiterd's namespace (not the
// policy's: so that limiterd reads, and the operator writes, ConfigMaps of that one namespace
// only), named ConfigMapName(policy ID), labelled PolicyLabel=PolicyLabelValue(policy name) and
// PolicyNamespaceLabel=<policy namespace>, and annotated PolicyIDAnnotation=<policy ID>. Its data
// is exactly what RenderConfigMapData returns, two keys:
//
//   - ConfigMapDataKey ("policy.yaml"): the policy as one YAML document in limiterd's policy
//     file format (see DecodePolicies), normalised: apiVersion, kind, metadata with only name,
//     namespace and generation, and the defaulted spec; never status or other metadata. It is
//     deterministic: the same policy renders to the same bytes.
//   - ConfigMapGenerationKey ("generation"): the policy's metadata.generation in decimal, the
//     same as in the document, so that limiterd can report which generation it serves.
//
// limiterd reads it back with ParseConfigMapData, which accepts exactly this: no other keys,
// one valid policy whose ConfigMapName is the ConfigMap's name, matching generations.
const (
	// PolicyLabel labels a policy's ConfigMap; its value is PolicyLabelValue(policy name).
	PolicyLabel = "limiterd.dev/policy"
	// PolicyNamespaceLabel labels a policy's ConfigMap with the policy's namespace, so that a
	// limiterd serving one namespace selects its policies' ConfigMaps.
	PolicyNamespaceLabel = "limiterd.dev/policy-namespace"
	// PolicyIDAnnotation holds the ID ("<namespace>/<name>") of the policy a ConfigMap carries;
	// the operator finds the policy of a ConfigMap by it (labels cannot hold a long name).
	PolicyIDAnnotation = "limiterd.dev/policy-id"
	// ConfigMapDataKey is the data key holding the rendered policy document.
	ConfigMapDataKey = "policy.yaml"
	// ConfigMapGenerationKey is the data key holding the policy's generation, in decimal.
	ConfigMapGenerationKey = "generation"

	// MaxConfigMapDataBytes is the most bytes (keys plus values) RenderConfigMapData renders and
	// ParseConfigMapData reads. The API server rejects a ConfigMap whose data exceed 1 MiB; the
	// 64 KiB left over is headroom for the keys this format may add and keeps the whole object
	// (with its metadata and managed fields) far below etcd's request size limit (1.5 MiB).
	MaxConfigMapDataBytes = 1<<20 - 64<<10

	// ConfigMapNamePrefix starts the name of every policy's ConfigMap (see ConfigMapName).
	ConfigMapNamePrefix = "rlp-"

	maxObjectName = 253 // a DNS subdomain
	maxLabelValue = 63
	hashLength    = 16 // hex digits of SHA-256 appended to shortened names
)

// ConfigMapName returns the name of the ConfigMap carrying the policy id in limiterd's
// namespace: "rlp-<namespace>.<name>", or, when that would exceed 253 characters, that cut short
// and followed by "-" and 16 hex digits of the SHA-256 of id. A namespace has no '.' and is at
// most 63 characters, so the name always starts with "rlp-<namespace>.": policies of different
// namespaces never share a name. Within a namespace two names differ unless one is cut short and
// matches the other in its first 236 characters and its 64-bit hash; the operator then refuses
// to write a ConfigMap annotated with another policy's ID. For a valid ID the result is a valid
// ConfigMap name.
func ConfigMapName(id PolicyID) string {
	return shorten(ConfigMapNamePrefix+id.Namespace()+"."+id.Name(), id.String(), maxObjectName)
}

// LegacyConfigMapName returns the name earlier versions gave the ConfigMap of the policy named
// policyName, in the policy's own namespace: "rlp-<policy name>", shortened as ConfigMapName
// does. The operator uses it only to delete those ConfigMaps once limiterd reads the new ones
// (docs/configmap-format.md, "Migration").
func LegacyConfigMapName(policyName string) string {
	return shorten(ConfigMapNamePrefix+policyName, policyName, maxObjectName)
}

// PolicyLabelValue returns the value of PolicyLabel for the policy named policyName: the name
// itself, or, when it is longer than a label value may be (63 characters), the name cut short
// and followed by "-" and 16 hex digits of its SHA-256. The full name is in the ConfigMap's data.
func PolicyLabelValue(policyName string) string {
	return shorten(policyName, policyName, maxLabelValue)
}

// shorten returns s when it has at most limit bytes, else s cut to fit, without trailing '-'
// or '.', then "-" and a hash of name.
func shorten(s, name string, limit int) string {
	if len(s) <= limit {
		return s
	}
	sum := sha256.Sum256([]byte(name))
	return strings.TrimRight(s[:limit-1-hashLength], "-.") + "-" + hex.EncodeToString(sum[:])[:hashLength]
}

// renderedPolicy is the normalised form of a policy written into a ConfigMap.
type renderedPolicy struct {
	APIVersion string              `json:"apiVersion"`
	Kind       string              `json:"kind"`
	Metadata   renderedMetadata    `json:"metadata"`
	Spec       RateLimitPolicySpec `json:"spec"`
}

type renderedMetadata struct {
	Name       string `json:"name"`
	Namespace  string `json:"namespace"`
	Generation int64  `json:"generation,omitempty"`
}

// RenderConfigMapData returns the data of the ConfigMap that carries p to limiterd (see the
// format above): the defaulted, validated policy reduced to name, namespace (DefaultNamespace
// if empty), generation and spec, as YAML, and its generation. It fails if p is invalid or the
// data would exceed MaxConfigMapDataBytes. It does not modify p; equal inputs give equal output.
func RenderConfigMapData(p *RateLimitPolicy) (map[string]string, error) {
	if p == nil {
		return nil, fmt.Errorf("render ConfigMap data: RateLimitPolicy is nil")
	}
	n := &RateLimitPolicy{Spec: *p.Spec.DeepCopy()}
	n.Name, n.Namespace, n.Generation = p.Name, orDefaultNamespace(p.Namespace), p.Generation
	n.Default()
	if err := Validate(n); err != nil {
		return nil, fmt.Errorf("render ConfigMap data of RateLimitPolicy %s/%s: %w", n.Namespace, n.Name, err)
	}
	// Unset means the default: a policy that leaves refunds off and tier names shown renders as
	// before those fields existed, so that a limiterd of an earlier version (which decodes
	// strictly) still serves it during an upgrade.
	if n.Spec.Refunds == DefaultRefunds {
		n.Spec.Refunds = ""
	}
	if n.Spec.TierNames == DefaultTierNames {
		n.Spec.TierNames = ""
	}
	doc, err := yaml.Marshal(renderedPolicy{
		APIVersion: GroupVersion.String(),
		Kind:       Kind,
		Metadata:   renderedMetadata{Name: n.Name, Namespace: n.Namespace, Generation: n.Generation},
		Spec:       n.Spec,
	})
	if err != nil {
		return nil, fmt.Errorf("render ConfigMap data of RateLimitPolicy %s/%s: %w", n.Namespace, n.Name, err)
	}
	data := map[string]string{
		ConfigMapDataKey:       string(doc),
		ConfigMapGenerationKey: strconv.FormatInt(n.Generation, 10),
	}
	if size := dataSize(data); size > MaxConfigMapDataBytes {
		return nil, fmt.Errorf("render ConfigMap data of RateLimitPolicy %s/%s: %d bytes, more than %d",
			n.Namespace, n.Name, size, MaxConfigMapDataBytes)
	}
	return data, nil
}

// ParseConfigMapData reads back the data of the ConfigMap named name, as written by
// RenderConfigMapData: exactly the keys ConfigMapDataKey and ConfigMapGenerationKey, at most
// MaxConfigMapDataBytes, one policy document decoded as strictly as DecodePolicies does
// (defaulted and validated) whose ConfigMapName is name and whose generation is that of
// ConfigMapGenerationKey. The name binds the ConfigMap to one policy: a ConfigMap cannot carry
// a policy of another name or namespace.
func ParseConfigMapData(name string, data map[string]string) (*RateLimitPolicy, error) {
	if name == "" {
		return nil, fmt.Errorf("parse ConfigMap data: ConfigMap name is empty")
	}
	if size := dataSize(data); size > MaxConfigMapDataBytes {
		return nil, fmt.Errorf("parse ConfigMap data: %d bytes, more than %d", size, MaxConfigMapDataBytes)
	}
	var unknown []string
	for k := range data {
		if k != ConfigMapDataKey && k != ConfigMapGenerationKey {
			unknown = append(unknown, strconv.Quote(k))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("parse ConfigMap data: unknown keys %s", strings.Join(unknown, ", "))
	}
	doc, ok := data[ConfigMapDataKey]
	if !ok {
		return nil, fmt.Errorf("parse ConfigMap data: key %q is missing", ConfigMapDataKey)
	}
	genText, ok := data[ConfigMapGenerationKey]
	if !ok {
		return nil, fmt.Errorf("parse ConfigMap data: key %q is missing", ConfigMapGenerationKey)
	}
	gen, err := strconv.ParseInt(genText, 10, 64)
	if err != nil || gen < 0 || strconv.FormatInt(gen, 10) != genText {
		return nil, fmt.Errorf("parse ConfigMap data: key %q: %q is not a generation", ConfigMapGenerationKey, genText)
	}
	policies, err := DecodePolicies([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("parse ConfigMap data: key %q: %w", ConfigMapDataKey, err)
	}
	if len(policies) != 1 {
		return nil, fmt.Errorf("parse ConfigMap data: key %q holds %d policies, want 1", ConfigMapDataKey, len(policies))
	}
	p := &policies[0]
	if want := ConfigMapName(p.ID()); name != want {
		return nil, fmt.Errorf("parse ConfigMap data: policy %s belongs in ConfigMap %s, not %s", p.ID(), want, name)
	}
	if p.Generation != gen {
		return nil, fmt.Errorf("parse ConfigMap data: policy %s/%s has generation %d, key %q says %d",
			p.Namespace, p.Name, p.Generation, ConfigMapGenerationKey, gen)
	}
	return p, nil
}

func dataSize(data map[string]string) int {
	n := 0
	for k, v := range data {
		n += len(k) + len(v)
	}
	return n
}
