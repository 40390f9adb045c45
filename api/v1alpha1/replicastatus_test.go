package v1alpha1

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestReplicaRecordRoundTrip(t *testing.T) {
	r := ReplicaRecord{
		"ns/a": {Generation: 3, State: ReplicaServing, DryRunRejected: 7},
		"ns/b": {Generation: 5, State: ReplicaRejected, ServingGeneration: 4, Error: "bad"},
	}
	s, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"ns/a":{"generation":3,"state":"serving","dryRunRejected":7},"ns/b":{"generation":5,"state":"rejected","servingGeneration":4,"error":"bad"}}`
	if s != want {
		t.Errorf("Encode = %s\nwant     %s", s, want)
	}
	got, err := DecodeReplicaRecord(s)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(r) {
		t.Errorf("Decode(Encode(r)) = %v, want %v", got, r)
	}
	if s, err := ReplicaRecord(nil).Encode(); err != nil || s != "{}" {
		t.Errorf("nil record encodes as %q, %v; want {}", s, err)
	}
}

func TestDecodeReplicaRecordRejectsMalformedRecords(t *testing.T) {
	for _, s := range []string{"", "[]", `{"ns/a":{"generation":1,"state":"maybe"}}`, `{"ns/a":{"generation":"x"}}`} {
		if _, err := DecodeReplicaRecord(s); err == nil {
			t.Errorf("Decode(%q) accepted", s)
		}
	}
}

func TestReplicaRecordEncodeDropsErrorsPastTheLimit(t *testing.T) {
	r := ReplicaRecord{}
	long := strings.Repeat("x", 256)
	for i := range 1200 {
		r[NewPolicyID(fmt.Sprintf("namespace-%04d", i), "policy")] = ReplicaPolicyStatus{Generation: 1, State: ReplicaRejected, Error: long}
	}
	s, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(s) > MaxReplicaRecordBytes || strings.Contains(s, long) {
		t.Errorf("encoded %d bytes with errors kept; want at most %d without errors", len(s), MaxReplicaRecordBytes)
	}
	for i := range 5000 {
		r[NewPolicyID(fmt.Sprintf("namespace-%04d", i), "a-much-longer-policy-name-to-fill-the-record")] = ReplicaPolicyStatus{Generation: 1, State: ReplicaServing}
	}
	if _, err := r.Encode(); err == nil {
		t.Error("a record past MaxReplicaRecordBytes without errors encoded")
	}
}

func replicaLease(name string, renew time.Time, seconds int32, annotation string) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   DefaultReplicaStatusNamespace,
			Name:        name,
			Labels:      map[string]string{ReplicaLabel: name},
			Annotations: map[string]string{ReplicaStatusAnnotation: annotation},
		},
	}
	rt := metav1.NewMicroTime(renew)
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &rt, &seconds
	return l
}

func TestReplicaFromLease(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	rep, err := ReplicaFromLease(replicaLease("limiterd-0", now, 15, `{"ns/a":{"generation":2,"state":"serving"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Name != "limiterd-0" || !rep.Expires.Equal(now.Add(15*time.Second)) || rep.Record["ns/a"].Generation != 2 {
		t.Errorf("replica %+v", rep)
	}
	if !rep.Live(now.Add(14*time.Second)) || rep.Live(now.Add(15*time.Second)) {
		t.Error("a record must be live strictly before renewTime+leaseDurationSeconds only")
	}

	// An undecodable record still counts as a replica, with nothing served.
	rep, err = ReplicaFromLease(replicaLease("limiterd-1", now, 15, "not json"))
	if err == nil || errors.Is(err, ErrNotAReplicaRecord) || rep.Name != "limiterd-1" || len(rep.Record) != 0 {
		t.Errorf("undecodable record: %+v, %v", rep, err)
	}

	for name, l := range map[string]*coordinationv1.Lease{
		"no label": func() *coordinationv1.Lease { l := replicaLease("x", now, 15, "{}"); l.Labels = nil; return l }(),
		"other label": func() *coordinationv1.Lease {
			l := replicaLease("x", now, 15, "{}")
			l.Labels[ReplicaLabel] = "y"
			return l
		}(),
		"no renew time": func() *coordinationv1.Lease { l := replicaLease("x", now, 15, "{}"); l.Spec.RenewTime = nil; return l }(),
		"zero duration": replicaLease("x", now, 0, "{}"),
	} {
		if _, err := ReplicaFromLease(l); !errors.Is(err, ErrNotAReplicaRecord) {
			t.Errorf("%s: %v, want ErrNotAReplicaRecord", name, err)
		}
	}
}

// TestReplicaRecordScalesToLongNames: a thousand policies with names of 253 bytes, in a
// namespace of 63, encode within MaxReplicaRecordBytes (in the compact format), and every entry
// reads back by its policy ID, its ConfigMap included. Before, such a record failed to encode
// from about 300 policies on.
func TestReplicaRecordScalesToLongNames(t *testing.T) {
	ns := strings.Repeat("n", 63)
	r := ReplicaRecord{}
	for i := range 1000 {
		id := NewPolicyID(ns, fmt.Sprintf("p%04d-%s", i, strings.Repeat("x", 247)))
		s := ReplicaPolicyStatus{Generation: int64(i + 1), State: ReplicaServing, DryRunRejected: uint64(i),
			ConfigMap: "limiterd-system/" + ConfigMapName(id)}
		if i%10 == 0 {
			s = ReplicaPolicyStatus{Generation: int64(i + 2), State: ReplicaRejected, ServingGeneration: int64(i + 1),
				Error: "parse ConfigMap data: " + strings.Repeat("e", 200), ConfigMap: s.ConfigMap}
		}
		if i%7 == 0 {
			s.ConfigMap = "" // a policy file
		}
		r[id] = s
	}
	enc, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if len(enc) > MaxReplicaRecordBytes {
		t.Fatalf("%d bytes, more than %d", len(enc), MaxReplicaRecordBytes)
	}
	t.Logf("1000 policies of 317-byte IDs: %d bytes", len(enc))
	got, err := DecodeReplicaRecord(enc)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(r) {
		t.Fatalf("%d entries decoded, want %d", len(got), len(r))
	}
	for id, want := range r {
		if s, ok := got.Lookup(id); !ok || s != want {
			t.Fatalf("Lookup(%s) = %+v %v, want %+v", id, s, ok, want)
		}
	}
	if _, ok := got.Lookup(NewPolicyID(ns, "absent")); ok {
		t.Error("Lookup finds a policy the record does not hold")
	}
	// A small record keeps the readable format.
	small := ReplicaRecord{"ns/a": {Generation: 1, State: ReplicaServing}}
	if s, err := small.Encode(); err != nil || !strings.HasPrefix(s, `{"ns/a":`) {
		t.Errorf("a small record encodes as %s, %v; want the format keyed by ID", s, err)
	}
	for _, s := range []string{`{"format":3,"policies":{}}`, `{"format":2,"policies":{"a/b":{"g":1,"s":"serving"}}}`,
		`{"format":2,"policies":{"x":{"g":1,"s":"maybe"}}}`, `{"format":"2"}`,
		`{"format":2,"policies":{"format":{"g":1,"s":"serving"}}}`, `{"format":2,"policies":{"AAAAAAAAAAAAAAAAAAAAA":{"g":1,"s":"serving"}}}`} {
		if _, err := DecodeReplicaRecord(s); err == nil {
			t.Errorf("Decode(%s) accepted", s)
		}
	}
}
