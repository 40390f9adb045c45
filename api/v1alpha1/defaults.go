package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Default sets the defaults of unset optional fields, as the API server does from the CRD:
// a token bucket's refillPeriod (a tier's, or a stacked tier's limit's) becomes
// DefaultRefillPeriod (1s), a quota's timeZone DefaultTimeZone (UTC), failureMode
// DefaultFailureMode (Open), tierNames DefaultTierNames (Shown), refunds DefaultRefunds
// (Disabled) and a gateway's missingKey DefaultMissingKey (Reject). It does not set the
// namespace (DecodePolicies does) and changes nothing else.
// Default is idempotent.
func (p *RateLimitPolicy) Default() {
	defaultPeriod := func(tb *TokenBucket) {
		if tb != nil && tb.RefillPeriod == nil {
			tb.RefillPeriod = &metav1.Duration{Duration: DefaultRefillPeriod}
		}
	}
	defaultZone := func(q *Quota) {
		if q != nil && q.TimeZone == "" {
			q.TimeZone = DefaultTimeZone
		}
	}
	for i := range p.Spec.Tiers {
		t := &p.Spec.Tiers[i]
		defaultPeriod(t.TokenBucket)
		defaultZone(t.Quota)
		for j := range t.Limits {
			defaultPeriod(t.Limits[j].TokenBucket)
			defaultZone(t.Limits[j].Quota)
		}
	}
	if p.Spec.FailureMode == "" {
		p.Spec.FailureMode = DefaultFailureMode
	}
	if p.Spec.TierNames == "" {
		p.Spec.TierNames = DefaultTierNames
	}
	if p.Spec.Refunds == "" {
		p.Spec.Refunds = DefaultRefunds
	}
	if g := p.Spec.Gateway; g != nil && g.MissingKey == "" {
		g.MissingKey = DefaultMissingKey
	}
}
