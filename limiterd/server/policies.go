package server

import (
	"net/http"
	"slices"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/adminauth"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// PolicyInfo describes a loaded policy in GET /v1/policies.
type PolicyInfo struct {
	ID          v1alpha1.PolicyID    `json:"id"`
	Generation  int64                `json:"generation"`
	DefaultTier string               `json:"defaultTier"`
	FailureMode v1alpha1.FailureMode `json:"failureMode"`
	Tiers       []v1alpha1.Tier      `json:"tiers"`
	// Overrides counts the overrides; OverrideClients and OverridePrefixes the exact keys and
	// key prefixes they name.
	Overrides        int `json:"overrides"`
	OverrideClients  int `json:"overrideClients"`
	OverridePrefixes int `json:"overridePrefixes"`
}

// PoliciesAnswer is the body of GET /v1/policies.
type PoliciesAnswer struct {
	Policies []PolicyInfo `json:"policies"`
}

// policies lists the loaded policies of the namespaces in which the caller may list
// RateLimitPolicies; a caller who may list none gets an empty list.
func (a *Admin) policies(w http.ResponseWriter, r *http.Request) {
	if !a.readOnly(w, r) {
		return
	}
	u, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	set := a.engine.Policies()
	if set == nil {
		writeError(w, http.StatusServiceUnavailable, engine.ErrNotReady.Error())
		return
	}
	visible := make(map[string]bool) // namespace → may list
	all := set.All()
	shown := all[:0]
	for _, p := range all {
		namespace := p.ID.Namespace()
		allowed, seen := visible[namespace]
		if !seen {
			if allowed, ok = a.allowed(w, r, adminauth.ListPolicies(u, namespace)); !ok {
				return
			}
			visible[namespace] = allowed
		}
		if allowed {
			shown = append(shown, p)
		}
	}
	writeJSON(w, http.StatusOK, describePolicies(shown), a.log)
}

// describePolicies lists policies, sorted by ID.
func describePolicies(all []*policy.Policy) PoliciesAnswer {
	slices.SortFunc(all, func(a, b *policy.Policy) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	answer := PoliciesAnswer{Policies: make([]PolicyInfo, 0, len(all))}
	for _, p := range all {
		spec := &p.Source.Spec
		info := PolicyInfo{
			ID:          p.ID,
			Generation:  p.Generation,
			DefaultTier: p.Default.Name,
			FailureMode: p.FailureMode,
			Tiers:       spec.Tiers,
			Overrides:   len(spec.Overrides),
		}
		for _, o := range spec.Overrides {
			info.OverrideClients += len(o.Clients)
			info.OverridePrefixes += len(o.ClientPrefixes)
		}
		answer.Policies = append(answer.Policies, info)
	}
	return answer
}
