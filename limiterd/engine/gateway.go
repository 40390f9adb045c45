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
func (e *Engine) DecideForwarded(ctx context.Context, policyID v1alpha1.PolicyID, r *policy.ForwardedRequest, buf []byte) (res Result, decided bool, err error) {
	if policyID == "" { // a gateway names its policy: never "the only one loaded"
		return Result{}, false, fmt.Errorf("%w %q", ErrUnknownPolicy, policyID)
	}
	b, err := e.find(policyID)
	if err != nil {
		return Result{}, false, err
	}
	g := b.policy.Gateway
	if g == nil {
		return Result{}, false, fmt.Errorf("%s: %w", policyID, ErrNoGateway)
	}
	key, found, err := g.AppendKey(buf, r)
	if err != nil {
		return Result{}, false, err //nolint:wrapcheck // a *policy.HeaderError names the header
	}
	k := v1alpha1.SharedGatewayKey
	switch {
	case found:
		k = string(key)
	case g.MissingKey == v1alpha1.MissingKeyAllow:
		return Result{}, false, nil
	case g.MissingKey == v1alpha1.MissingKeyShared:
	default: // Reject
		return Result{}, false, ErrNoKey
	}
	return e.decide(ctx, b, k, 1), true, nil
}
