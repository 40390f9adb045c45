package v1alpha1

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// The replica status format: how each limiterd replica tells the operator which policy
// generations it serves (docs/enforcement-status.md describes it for people; limiterd writes it
// with package limiterd/replicastatus, the operator reads it into the policies' status).
//
// Each replica keeps one coordination.k8s.io/v1 Lease in the status namespace, named after the
// replica (its pod), labelled ReplicaLabel=<that name>, with the replica's ReplicaRecord as
// JSON in the annotation ReplicaStatusAnnotation. The replica renews it (spec.renewTime) every
// interval, with spec.leaseDurationSeconds a few intervals; the record counts while
// renewTime+leaseDurationSeconds lies in the future.
const (
	// ReplicaLabel labels a replica's Lease; its value is the Lease's name.
	ReplicaLabel = "limiterd.dev/replica"
	// ReplicaStatusAnnotation holds the replica's ReplicaRecord as JSON.
	ReplicaStatusAnnotation = "limiterd.dev/status"
	// DefaultReplicaStatusNamespace is the status namespace when none is configured.
	DefaultReplicaStatusNamespace = "limiterd-system"
	// MaxReplicaRecordBytes bounds an encoded record, well within the 256 KiB the API server
	// allows for all of an object's annotations. Past it, Encode drops error messages, then
	// writes the compact format, then fails.
	MaxReplicaRecordBytes = 192 << 10
	// compactFormat is the value of the "format" field of the compact encoding.
	compactFormat = 2
)

// ReplicaState is what a replica does with a policy.
//
// +kubebuilder:object:generate=false
type ReplicaState string

const (
	// ReplicaServing means the replica serves the policy at Generation.
	ReplicaServing ReplicaState = "serving"
	// ReplicaRejected means the replica could not parse or apply the policy's ConfigMap, which
	// claimed Generation; it serves ServingGeneration (0: nothing) instead.
	ReplicaRejected ReplicaState = "rejected"
)

// ReplicaPolicyStatus is one policy's entry in a replica's record.
//
// +kubebuilder:object:generate=false
type ReplicaPolicyStatus struct {
	// Generation is the generation served (ReplicaServing) or rejected (ReplicaRejected; 0 when
	// the ConfigMap did not say which).
	Generation int64        `json:"generation"`
	State      ReplicaState `json:"state"`
	// DryRunRejected counts the decisions of the policy's dry-run tiers that would have been
	// rejected since the served generation was swapped in on the replica.
	DryRunRejected uint64 `json:"dryRunRejected,omitempty"`
	// ServingGeneration is, for a rejected policy, the last good generation the replica keeps
	// serving (0: none).
	ServingGeneration int64 `json:"servingGeneration,omitempty"`
	// Error is, for a rejected policy, why.
	Error string `json:"error,omitempty"`
	// ConfigMap is the ConfigMap ("<namespace>/<name>") the replica reads the policy from; empty
	// for a policy file, and in the records of earlier versions, which did not report it (the
	// operator keeps a policy's legacy ConfigMap while a replica serves it without saying where
	// from).
	ConfigMap string `json:"configMap,omitempty"`
}

// ReplicaRecord is a replica's status: an entry per policy. An entry is keyed by the policy's
// ID, or, in a record decoded from the compact format, by its PolicyDigest: read entries with
// Lookup.
//
// +kubebuilder:object:generate=false
type ReplicaRecord map[PolicyID]ReplicaPolicyStatus

// Lookup returns the entry of policy id, whether it is keyed by the ID or by its digest (the
// compact format). An entry of the compact format gets its ConfigMap completed from the
// policy's ConfigMapName.
func (r ReplicaRecord) Lookup(id PolicyID) (ReplicaPolicyStatus, bool) {
	if s, ok := r[id]; ok {
		return s, true
	}
	s, ok := r[PolicyDigest(id)]
	if ok && s.ConfigMap != "" {
		s.ConfigMap += "/" + ConfigMapName(id) // the compact format keeps the namespace
	}
	return s, ok
}

// PolicyDigest is the key of policy id in the compact format: 128 bits of the SHA-256 of the
// ID, in unpadded base64url (22 characters). It holds no "/", so it is never a policy ID.
func PolicyDigest(id PolicyID) PolicyID {
	sum := sha256.Sum256([]byte(id))
	return PolicyID(base64.RawURLEncoding.EncodeToString(sum[:16]))
}

// isPolicyDigest reports whether key has the shape of a PolicyDigest: 16 bytes in unpadded
// base64url. A key of any other shape could be a policy ID, or "format", once the record is
// encoded again in the format keyed by ID.
func isPolicyDigest(key PolicyID) bool {
	b, err := base64.RawURLEncoding.DecodeString(string(key))
	return err == nil && len(b) == 16
}

// compactRecord is the compact format of a record: entries keyed by PolicyDigest, with short
// field names, and a ConfigMap reduced to its namespace (a replica reads a policy only from
// the ConfigMap named ConfigMapName of its ID). Its size does not depend on the policies'
// names: about 75 bytes a policy, so some 2,600 policies fit without errors.
type compactRecord struct {
	Format   int                       `json:"format"`
	Policies map[PolicyID]compactEntry `json:"policies"`
}

// compactEntry is a ReplicaPolicyStatus in compactRecord.
type compactEntry struct {
	Generation         int64        `json:"g"`
	State              ReplicaState `json:"s"`
	DryRunRejected     uint64       `json:"d,omitempty"`
	ServingGeneration  int64        `json:"sg,omitempty"`
	Error              string       `json:"e,omitempty"`
	ConfigMapNamespace string       `json:"cn,omitempty"`
}

// Encode returns the record as the JSON of ReplicaStatusAnnotation: an object mapping each
// policy ID to its entry (keys sorted), as long as it fits in MaxReplicaRecordBytes, first
// with error messages, then without. A record that does not fit either way (thousands of
// policies, or hundreds with long names) is written in the compact format, without error
// messages if need be; if even that does not fit, Encode fails.
func (r ReplicaRecord) Encode() (string, error) {
	if r == nil {
		r = ReplicaRecord{}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encode replica status: %w", err)
	}
	if len(b) <= MaxReplicaRecordBytes {
		return string(b), nil
	}
	short := make(ReplicaRecord, len(r))
	for id, s := range r {
		s.Error = ""
		short[id] = s
	}
	if b, err = json.Marshal(short); err != nil {
		return "", fmt.Errorf("encode replica status: %w", err)
	}
	if len(b) <= MaxReplicaRecordBytes {
		return string(b), nil
	}
	for _, withErrors := range []bool{true, false} {
		if b, err = r.encodeCompact(withErrors); err != nil {
			return "", err
		}
		if len(b) <= MaxReplicaRecordBytes {
			return string(b), nil
		}
	}
	return "", fmt.Errorf("encode replica status: %d policies take %d bytes, more than %d", len(r), len(b), MaxReplicaRecordBytes)
}

// encodeCompact returns the record in the compact format, with error messages or without.
func (r ReplicaRecord) encodeCompact(withErrors bool) ([]byte, error) {
	c := compactRecord{Format: compactFormat, Policies: make(map[PolicyID]compactEntry, len(r))}
	for id, s := range r {
		e := compactEntry{Generation: s.Generation, State: s.State, DryRunRejected: s.DryRunRejected, ServingGeneration: s.ServingGeneration}
		if withErrors {
			e.Error = s.Error
		}
		if s.ConfigMap != "" {
			ns, name, ok := strings.Cut(s.ConfigMap, "/")
			if !ok || name != ConfigMapName(id) {
				return nil, fmt.Errorf("encode replica status: policy %s: ConfigMap %q is not %s/%s", id, s.ConfigMap, ns, ConfigMapName(id))
			}
			e.ConfigMapNamespace = ns
		}
		c.Policies[PolicyDigest(id)] = e
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode replica status: %w", err)
	}
	return b, nil
}

// DecodeReplicaRecord parses the JSON of ReplicaStatusAnnotation, in either format. The entries
// of the compact format are keyed by PolicyDigest (read them with Lookup).
func DecodeReplicaRecord(s string) (ReplicaRecord, error) {
	var format struct {
		Format json.RawMessage `json:"format"`
	}
	if err := json.Unmarshal([]byte(s), &format); err != nil {
		return nil, fmt.Errorf("decode replica status: %w", err)
	}
	if format.Format != nil { // "format" is no policy ID: the compact format
		return decodeCompact(s)
	}
	var r ReplicaRecord
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return nil, fmt.Errorf("decode replica status: %w", err)
	}
	for id, st := range r {
		if st.State != ReplicaServing && st.State != ReplicaRejected {
			return nil, fmt.Errorf("decode replica status: policy %s: unknown state %q", id, st.State)
		}
	}
	if r == nil {
		r = ReplicaRecord{}
	}
	return r, nil
}

func decodeCompact(s string) (ReplicaRecord, error) {
	var c compactRecord
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return nil, fmt.Errorf("decode replica status: %w", err)
	}
	if c.Format != compactFormat {
		return nil, fmt.Errorf("decode replica status: unknown format %d", c.Format)
	}
	r := make(ReplicaRecord, len(c.Policies))
	for digest, e := range c.Policies {
		if e.State != ReplicaServing && e.State != ReplicaRejected {
			return nil, fmt.Errorf("decode replica status: policy digest %s: unknown state %q", digest, e.State)
		}
		if !isPolicyDigest(digest) {
			return nil, fmt.Errorf("decode replica status: %q is no policy digest", digest)
		}
		r[digest] = ReplicaPolicyStatus{Generation: e.Generation, State: e.State, DryRunRejected: e.DryRunRejected,
			ServingGeneration: e.ServingGeneration, Error: e.Error, ConfigMap: e.ConfigMapNamespace}
	}
	return r, nil
}

// Replica is a replica's record as read from its Lease.
//
// +kubebuilder:object:generate=false
type Replica struct {
	// Name is the replica's name, its Lease's name.
	Name string
	// Expires is when the record stops counting: renewTime + leaseDurationSeconds.
	Expires time.Time
	// Record is the replica's status.
	Record ReplicaRecord
}

// ErrNotAReplicaRecord is wrapped by the error of ReplicaFromLease for a Lease that is not a
// replica's record.
var ErrNotAReplicaRecord = errors.New("lease is not a limiterd replica record")

// ReplicaFromLease reads a replica's record from its Lease. A Lease without the replica label
// (valued its name), a renew time or a positive duration is not a record; one whose annotation
// cannot be decoded is returned with an empty Record and the decoding error, so that the replica
// still counts.
func ReplicaFromLease(l *coordinationv1.Lease) (Replica, error) {
	if l.Labels[ReplicaLabel] != l.Name {
		return Replica{}, fmt.Errorf("%w: lease %s/%s: label %s is %q", ErrNotAReplicaRecord, l.Namespace, l.Name, ReplicaLabel, l.Labels[ReplicaLabel])
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 {
		return Replica{}, fmt.Errorf("%w: lease %s/%s has no renew time or duration", ErrNotAReplicaRecord, l.Namespace, l.Name)
	}
	rep := Replica{
		Name:    l.Name,
		Expires: l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second),
		Record:  ReplicaRecord{},
	}
	rec, err := DecodeReplicaRecord(l.Annotations[ReplicaStatusAnnotation])
	if err != nil {
		return rep, fmt.Errorf("lease %s/%s: %w", l.Namespace, l.Name, err)
	}
	rep.Record = rec
	return rep, nil
}

// Live reports whether the record still counts at now.
func (r Replica) Live(now time.Time) bool { return now.Before(r.Expires) }
