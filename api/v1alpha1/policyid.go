package v1alpha1

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultNamespace is the namespace of a policy that names none: a policy file document without
// namespace (as with kubectl apply), and a policy a request names without '/' (RequestedPolicyID).
const DefaultNamespace = "default"

// PolicyID identifies a RateLimitPolicy: "<namespace>/<name>". It is how decision requests,
// metrics, Redis keys and the replicas' status records name a policy. Build one with NewPolicyID
// (from names already validated) or ParsePolicyID (from outside input). The zero value names no
// policy.
type PolicyID string

// NewPolicyID returns the ID of the policy name in namespace, DefaultNamespace when namespace is
// empty. It does not check the names: a valid policy (see Validate) gives an ID ParsePolicyID
// accepts.
func NewPolicyID(namespace, name string) PolicyID {
	return PolicyID(orDefaultNamespace(namespace) + "/" + name)
}

// orDefaultNamespace returns namespace, or DefaultNamespace when it is empty.
func orDefaultNamespace(namespace string) string {
	if namespace == "" {
		return DefaultNamespace
	}
	return namespace
}

// ID returns the ID of p (see NewPolicyID).
func (p *RateLimitPolicy) ID() PolicyID { return NewPolicyID(p.Namespace, p.Name) }

// RequestedPolicyID returns the ID of the policy a request names, in a decision request's
// "policy" (HTTP) or an Envoy domain (gRPC) alike: s itself when it has a '/', the policy named
// s in DefaultNamespace when it has none, and "" for "" (a request that names no policy). It
// does not check the names: the ID is looked up, and one that is not valid names no loaded
// policy.
func RequestedPolicyID(s string) PolicyID {
	if s == "" || strings.IndexByte(s, '/') >= 0 {
		return PolicyID(s)
	}
	return NewPolicyID(DefaultNamespace, s)
}

// ParsePolicyID parses "<namespace>/<name>": a namespace (a DNS label), '/', and a policy name
// (a DNS subdomain), the names Validate accepts.
func ParsePolicyID(s string) (PolicyID, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return "", fmt.Errorf("policy ID %q is not <namespace>/<name>", s)
	}
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		return "", fmt.Errorf("policy ID %q: namespace: %s", s, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return "", fmt.Errorf("policy ID %q: name: %s", s, strings.Join(msgs, "; "))
	}
	return PolicyID(s), nil
}

// Namespace returns the namespace part of id: what precedes the first '/'.
func (id PolicyID) Namespace() string {
	ns, _, _ := strings.Cut(string(id), "/")
	return ns
}

// Name returns the name part of id: what follows the first '/' ("" when there is none).
func (id PolicyID) Name() string {
	_, name, _ := strings.Cut(string(id), "/")
	return name
}

// String returns "<namespace>/<name>".
func (id PolicyID) String() string { return string(id) }
