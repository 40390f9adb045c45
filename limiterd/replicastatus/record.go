// Package replicastatus is limiterd's side of the replica status (see the format in
// api/v1alpha1/replicastatus.go and docs/enforcement-status.md): it counts dry-run rejections
// per policy generation (Tally), builds the replica's record from what it serves and rejected
// (Collect), and keeps the record in the replica's Lease (Publisher).
package replicastatus

import (
	"strings"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

const (
	// DefaultNamespace is the status namespace when none is configured and limiterd does not
	// run in a pod.
	DefaultNamespace = v1alpha1.DefaultReplicaStatusNamespace
	// DefaultInterval is how often a replica renews its record.
	DefaultInterval = 5 * time.Second
	// DurationFactor is the record's lifetime in renewal intervals.
	DurationFactor = 3
	// maxErrorBytes bounds the error message of a rejected policy in a record.
	maxErrorBytes = 256
)

// LeaseDuration is the lifetime of a record renewed every interval: DurationFactor intervals,
// rounded up to whole seconds.
func LeaseDuration(interval time.Duration) time.Duration {
	d := DurationFactor * interval
	if r := d % time.Second; r != 0 {
		d += time.Second - r
	}
	return max(d, time.Second)
}

// cutError returns err's message cut to maxErrorBytes, on a UTF-8 boundary.
func cutError(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	if len(msg) <= maxErrorBytes {
		return msg
	}
	msg = strings.ToValidUTF8(msg[:maxErrorBytes-3], "")
	return msg + "..."
}
