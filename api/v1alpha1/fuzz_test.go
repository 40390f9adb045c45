package v1alpha1

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// addPolicyFiles adds every policy file of testdata and the sample as seeds.
func addPolicyFiles(f *testing.F, add func(data []byte)) {
	for _, dir := range []string{"valid", "invalid"} {
		for _, tc := range loadTestCases(f, dir) {
			add(tc.Data)
		}
	}
	sample, err := os.ReadFile("../../config/samples/ratelimitpolicy.yaml")
	if err != nil {
		f.Fatal(err)
	}
	add(sample)
}

// FuzzDecodePolicies checks that DecodePolicies never panics and that what it accepts is
// valid, survives encoding and decoding again unchanged, and renders into a ConfigMap that
// parses back to the same policy.
func FuzzDecodePolicies(f *testing.F) {
	addPolicyFiles(f, func(data []byte) { f.Add(data) })
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := DecodePolicies(data)
		if err != nil {
			return
		}
		var stream []string
		for i := range ps {
			p := &ps[i]
			if err := Validate(p); err != nil {
				t.Fatalf("DecodePolicies returned an invalid policy: %v", err)
			}
			if p.Namespace == "" {
				t.Fatal("DecodePolicies returned a policy without namespace")
			}
			y, err := yaml.Marshal(p)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			stream = append(stream, string(y))

			data, err := RenderConfigMapData(p)
			if err != nil {
				if strings.Contains(err.Error(), "bytes, more than") {
					continue
				}
				t.Fatalf("RenderConfigMapData of a decoded policy: %v", err)
			}
			got, err := ParseConfigMapData(ConfigMapName(p.ID()), data)
			if err != nil {
				t.Fatalf("ParseConfigMapData(RenderConfigMapData(p)): %v\n%s", err, data[ConfigMapDataKey])
			}
			if !equality.Semantic.DeepEqual(p.Spec, got.Spec) || p.Name != got.Name || p.Generation != got.Generation {
				t.Fatalf("ConfigMap round trip changed the policy:\n%+v\n%+v", p.Spec, got.Spec)
			}
		}
		again, err := DecodePolicies([]byte(strings.Join(stream, "---\n")))
		if err != nil {
			t.Fatalf("decoding the encoded policies: %v", err)
		}
		if !equality.Semantic.DeepEqual(ps, again) {
			t.Fatalf("encoding and decoding changed the policies:\n%+v\n%+v", ps, again)
		}
	})
}

// FuzzParseConfigMapData checks that ParseConfigMapData never panics and that what it accepts
// is valid, the policy of the ConfigMap name asked for, and a fixed point of RenderConfigMapData.
func FuzzParseConfigMapData(f *testing.F) {
	addPolicyFiles(f, func(data []byte) {
		ps, err := DecodePolicies(data)
		if err != nil || len(ps) != 1 {
			f.Add(ConfigMapName(NewPolicyID("default", "a")), string(data), "0")
			return
		}
		ps[0].Generation = 5
		rendered, err := RenderConfigMapData(&ps[0])
		if err != nil {
			f.Fatal(err)
		}
		f.Add(ConfigMapName(ps[0].ID()), rendered[ConfigMapDataKey], rendered[ConfigMapGenerationKey])
	})
	f.Fuzz(func(t *testing.T, name, doc, generation string) {
		data := map[string]string{ConfigMapDataKey: doc, ConfigMapGenerationKey: generation}
		p, err := ParseConfigMapData(name, data)
		if err != nil {
			return
		}
		if err := Validate(p); err != nil {
			t.Fatalf("ParseConfigMapData returned an invalid policy: %v", err)
		}
		if got := ConfigMapName(p.ID()); got != name {
			t.Fatalf("policy %s of ConfigMap name %q, want %q", p.ID(), got, name)
		}
		rendered, err := RenderConfigMapData(p)
		if err != nil {
			if strings.Contains(err.Error(), "bytes, more than") {
				return
			}
			t.Fatalf("RenderConfigMapData of a parsed policy: %v", err)
		}
		q, err := ParseConfigMapData(name, rendered)
		if err != nil {
			t.Fatalf("ParseConfigMapData(RenderConfigMapData(p)): %v", err)
		}
		want := p.DeepCopy()
		want.ObjectMeta = metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Generation: p.Generation}
		want.Status = RateLimitPolicyStatus{}
		if !equality.Semantic.DeepEqual(want, q) {
			t.Fatalf("render and parse changed the policy:\n%+v\n%+v", want, q)
		}
		again, err := RenderConfigMapData(q)
		if err != nil || !equality.Semantic.DeepEqual(again, rendered) {
			t.Fatalf("rendering is not a fixed point: %v", err)
		}
	})
}

// FuzzDecodeReplicaRecord: a replica's record is read from a Lease anyone with write access to
// it may have written; decoding never panics, and what it accepts has only known states and
// encodes again: Encode, then DecodeReplicaRecord, give back the record decoded. (A record whose
// full format exceeds MaxReplicaRecordBytes is encoded in the compact format, by digest and
// without errors if need be, which is lossy by design: its round trip is not checked.)
func FuzzDecodeReplicaRecord(f *testing.F) {
	f.Add(`{"ns/a":{"generation":3,"state":"serving","dryRunRejected":7,"configMap":"limiterd-system/rlp-ns.a"}}`)
	f.Add(`{"format":2,"policies":{"AAAAAAAAAAAAAAAAAAAAAA":{"g":1,"s":"rejected","sg":1,"e":"x","cn":"limiterd-system"}}}`)
	f.Add(`{"format":2}`)
	f.Add(`{"format":2,"policies":{"format":{"g":1,"s":"serving"}}}`) // a key "format" would not decode again
	f.Add(`{"ns/a":{"generation":1,"state":"rejected","error":"<\u00e9>\ud800"}}`)
	f.Add(`{}`)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := DecodeReplicaRecord(s)
		if err != nil {
			return
		}
		for id, st := range r {
			if st.State != ReplicaServing && st.State != ReplicaRejected {
				t.Fatalf("entry %s: state %q accepted", id, st.State)
			}
			if _, ok := r.Lookup(id); !ok {
				t.Fatalf("entry %s not found by Lookup", id)
			}
		}
		if full, err := json.Marshal(r); err != nil || len(full) > MaxReplicaRecordBytes {
			return
		}
		enc, err := r.Encode()
		if err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
		again, err := DecodeReplicaRecord(enc)
		if err != nil {
			t.Fatalf("the encoding %s of a decoded record does not decode: %v", enc, err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("encode and decode changed the record:\n%+v\n%+v", r, again)
		}
	})
}
