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
// For each RateLimitPolicy the operator owns one ConfigMap in the policy's namespace, named
// ConfigMapName(policy name) and labelled PolicyLabel=PolicyLabelValue(policy name). Its data
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
// one valid policy in the ConfigMap's own namespace, matching generations.
const (
	// PolicyLabel labels a policy's ConfigMap; its value is PolicyLabelValue(policy name).
	PolicyLabel = "limiterd.dev/policy"
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

// ConfigMapName returns the name of the ConfigMap carrying the policy named policyName:
// "rlp-" + policyName, or, when that would exceed 253 characters, the name cut short and
// followed by "-" and 16 hex digits of the SHA-256 of policyName. For a valid policy name (a DNS
// subdomain) the result is a valid ConfigMap name.
func ConfigMapName(policyName string) string {
	return shorten(ConfigMapNamePrefix+policyName, policyName, maxObjectName)
}

// ConfigMapPolicyName returns the name of the policy whose ConfigMap is named configMapName,
// when that name is not shortened (see ConfigMapName): ConfigMapName(name) == configMapName.
// Otherwise, the name cannot be told from configMapName alone and ok is false.
func ConfigMapPolicyName(configMapName string) (name string, ok bool) {
	name, ok = strings.CutPrefix(configMapName, ConfigMapNamePrefix)
	if !ok || ConfigMapName(name) != configMapName {
		return "", false
	}
	return name, true
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

// ParseConfigMapData reads back the data of a policy's ConfigMap in namespace, as written by
// RenderConfigMapData: exactly the keys ConfigMapDataKey and ConfigMapGenerationKey, at most
// MaxConfigMapDataBytes, one policy document decoded as strictly as DecodePolicies does
// (defaulted and validated) whose namespace is namespace and whose generation is that of
// ConfigMapGenerationKey.
func ParseConfigMapData(namespace string, data map[string]string) (*RateLimitPolicy, error) {
	if namespace == "" {
		return nil, fmt.Errorf("parse ConfigMap data: namespace is empty")
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
	if p.Namespace != namespace {
		return nil, fmt.Errorf("parse ConfigMap data: policy %s/%s is not in the ConfigMap's namespace %q",
			p.Namespace, p.Name, namespace)
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
