package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// Errors of DecideForwarded, besides those of Decide and of policy.KeyExtractor.AppendKey.
var (
	// ErrNoGateway: the policy has no spec.gateway, so it says nothing of where a gateway's
	// request yields its client key.
	ErrNoGateway = errors.New("policy has no spec.gateway: it answers no gateway (add spec.gateway to say where a forwarded request's client key comes from)")
	// ErrNoKey: no key source of the policy's spec.gateway yielded a key, and its missingKey is
	// Reject.
	ErrNoKey = errors.New("no key: no key source of the policy's spec.gateway yielded a client key, and its missingKey is Reject")
)

// DecideForwarded decides one unit for the request a gateway asks about (a forward-auth
// request, or an Envoy ext_authz check) under the policy policyID names: the client key is the
// one the policy's spec.gateway derives from r, appended to buf (scratch space, which the
// caller may reuse once the call returns).
//
// When no key source yields a key, the policy's missingKey decides: Shared decides for the
// shared key, Reject returns ErrNoKey, and Allow returns decided false with no error: the
// request passes and nothing is charged. It returns an error, and charges nothing, when the
// request cannot be decided: ErrNotReady, ErrUnknownPolicy, ErrNoGateway, ErrNoKey, or the
// error of the key sources (a *policy.HeaderError).
//
// The decision's Result is written to *res, in place, as DecideInto writes it; *res is the zero
// Result unless decided.
func (e *Engine) DecideForwarded(ctx context.Context, policyID v1alpha1.PolicyID, r *policy.ForwardedRequest, buf []byte, res *Result) (decided bool, err error) {
	b, k, err := e.forwarded(policyID, r, buf)
	if err != nil || b == nil {
		*res = Result{}
		return false, err
	}
	e.decide(ctx, b, k, 1, res)
	return true, nil
}

// forwarded returns the policy and client key of DecideForwarded's request; a nil policy and no
// error when the request passes undecided (missingKey Allow).
func (e *Engine) forwarded(policyID v1alpha1.PolicyID, r *policy.ForwardedRequest, buf []byte) (*bound, string, error) {
	if policyID == "" { // a gateway names its policy: never "the only one loaded"
		return nil, "", fmt.Errorf("%w %q", ErrUnknownPolicy, policyID)
	}
	b, err := e.find(policyID)
	if err != nil {
		return nil, "", err
	}
	g := b.policy.Gateway
	if g == nil {
		return nil, "", fmt.Errorf("%s: %w", policyID, ErrNoGateway)
	}
	key, found, err := g.AppendKey(buf, r)
	if err != nil {
		return nil, "", err //nolint:wrapcheck // a *policy.HeaderError names the header
	}
	switch {
	case found:
		return b, string(key), nil
	case g.MissingKey == v1alpha1.MissingKeyAllow:
		return nil, "", nil
	case g.MissingKey == v1alpha1.MissingKeyShared:
		return b, v1alpha1.SharedGatewayKey, nil
	default: // Reject
		return nil, "", ErrNoKey
	}
}
