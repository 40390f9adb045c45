package engine

import "github.com/limiterd/limiterd/api/v1alpha1"

// TopClientsSize returns the entries and key bytes of a policy's record of heaviest clients.
func TopClientsSize(e *Engine, id v1alpha1.PolicyID) (entries, keyBytes int) {
	b, err := e.find(id)
	if err != nil || b.top == nil {
		return 0, 0
	}
	return b.top.Size()
}
