package replicastatus

import (
	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/source"
)

// Collect builds a replica's record from the policies it serves (set; nil before the first
// swap), the tally of their dry-run decisions (nil: none counted) and the ConfigMaps it
// rejected:
//
//   - each served policy is ReplicaServing at its generation, with its dry-run rejections;
//   - each rejected ConfigMap whose policy is known becomes ReplicaRejected at the generation it
//     claimed, with the generation still served, unless that policy is already served at the
//     claimed generation or a later one (a conflict resolved since, say).
func Collect(set *policy.Set, tally *Tally, rejections []source.Rejection) v1alpha1.ReplicaRecord {
	r := v1alpha1.ReplicaRecord{}
	if set != nil {
		for _, p := range set.All() {
			s := v1alpha1.ReplicaPolicyStatus{Generation: p.Generation, State: v1alpha1.ReplicaServing}
			if tally != nil {
				s.DryRunRejected = tally.DryRunRejected(p.ID, p.Generation)
			}
			r[p.ID] = s
		}
	}
	for _, rej := range rejections {
		if rej.PolicyID == "" {
			continue
		}
		served, ok := r[rej.PolicyID]
		if ok && rej.Generation != 0 && served.Generation >= rej.Generation {
			continue
		}
		r[rej.PolicyID] = v1alpha1.ReplicaPolicyStatus{
			Generation:        rej.Generation,
			State:             v1alpha1.ReplicaRejected,
			DryRunRejected:    served.DryRunRejected,
			ServingGeneration: served.Generation,
			Error:             cutError(rej.Err),
		}
	}
	return r
}
