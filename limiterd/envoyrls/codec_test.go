package envoyrls

import (
	"bytes"
	"errors"
	"runtime"
	"sync"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/limiterd/limiterd/limiterd/server"
)

// Wire-format builders for requests that proto.Marshal would refuse (strings that are not
// UTF-8) or that are too large to build as messages cheaply.

// wireEntry is an Entry message.
func wireEntry(key, value string) []byte {
	var b []byte
	b = protowire.AppendTag(b, entryKey, protowire.BytesType)
	b = protowire.AppendString(b, key)
	b = protowire.AppendTag(b, entryValue, protowire.BytesType)
	return protowire.AppendString(b, value)
}

// wireDescriptor is a RateLimitDescriptor of the entries given as key, value pairs.
func wireDescriptor(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = protowire.AppendTag(b, descriptorEntries, protowire.BytesType)
		b = protowire.AppendBytes(b, wireEntry(kv[i], kv[i+1]))
	}
	return b
}

// wireRequest is a RateLimitRequest of domain and the descriptors (wireDescriptor's).
func wireRequest(domain string, descriptors ...[]byte) []byte {
	var b []byte
	b = protowire.AppendTag(b, requestDomain, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for _, d := range descriptors {
		b = protowire.AppendTag(b, requestDescriptors, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	return b
}

// decodeBoth decodes b with proto.Unmarshal and DecodeRateLimitRequest.
func decodeBoth(b []byte) (want, got *rlsv3.RateLimitRequest, protoErr, err error) {
	want, got = &rlsv3.RateLimitRequest{}, &rlsv3.RateLimitRequest{}
	protoErr = proto.Unmarshal(b, want)
	err = DecodeRateLimitRequest(b, got)
	return want, got, protoErr, err
}

func TestDecodeRateLimitRequestMatchesProto(t *testing.T) {
	full := &rlsv3.RateLimitRequest{
		Domain:     "default/api",
		HitsAddend: 7,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/é"}}},
			{
				Entries:        []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: ""}},
				Limit:          &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(3)},
				HitsAddend:     wrapperspb.UInt64(0),
				IsNegativeHits: true,
			},
			{},
			{HitsAddend: wrapperspb.UInt64(1 << 40)},
		},
	}
	marshalled, err := proto.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	// Unknown fields at every level, a known field with another wire type, repeated scalars
	// (the last wins) and a repeated message field (merged).
	unknown := protowire.AppendTag(nil, 99, protowire.Fixed32Type)
	unknown = protowire.AppendFixed32(unknown, 1)
	group := protowire.AppendTag(nil, 50, protowire.StartGroupType)
	group = append(group, unknown...)
	group = protowire.AppendTag(group, 50, protowire.EndGroupType)
	entry := append(wireEntry("a", "b"), unknown...)
	entry = protowire.AppendTag(entry, entryKey, protowire.VarintType) // wrong type: unknown
	entry = protowire.AppendVarint(entry, 3)
	entry = protowire.AppendTag(entry, entryKey, protowire.BytesType)
	entry = protowire.AppendString(entry, "c") // last wins
	desc := protowire.AppendTag(nil, descriptorEntries, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	desc = append(desc, group...)
	hits := protowire.AppendTag(nil, wrapperValue, protowire.VarintType)
	hits = protowire.AppendVarint(hits, 9)
	desc = protowire.AppendTag(desc, descriptorHits, protowire.BytesType)
	desc = protowire.AppendBytes(desc, hits)
	desc = protowire.AppendTag(desc, descriptorHits, protowire.BytesType)
	desc = protowire.AppendBytes(desc, unknown) // merged: keeps 9, adds an unknown field
	desc = protowire.AppendTag(desc, descriptorNegative, protowire.VarintType)
	desc = protowire.AppendVarint(desc, 2)
	odd := wireRequest("x", desc)
	odd = append(odd, unknown...)
	odd = protowire.AppendTag(odd, requestHitsAddend, protowire.VarintType)
	odd = protowire.AppendVarint(odd, 1<<33+5) // truncated to uint32
	odd = protowire.AppendTag(odd, requestDomain, protowire.BytesType)
	odd = protowire.AppendString(odd, "default/other")

	for name, b := range map[string][]byte{"full": marshalled, "odd": odd, "empty": nil} {
		t.Run(name, func(t *testing.T) {
			want, got, protoErr, err := decodeBoth(b)
			if protoErr != nil || err != nil {
				t.Fatalf("proto.Unmarshal: %v; DecodeRateLimitRequest: %v", protoErr, err)
			}
			if !proto.Equal(want, got) {
				t.Errorf("DecodeRateLimitRequest = %v, proto.Unmarshal = %v", got, want)
			}
		})
	}
}

func TestDecodeRateLimitRequestKeepsInvalidUTF8(t *testing.T) {
	b := wireRequest("default/\xffapi", wireDescriptor("client", "alice\xff", "k\x80", "v"), wireDescriptor("client", "\xc3"))
	if err := proto.Unmarshal(b, &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("proto.Unmarshal accepted strings that are not UTF-8: the test proves nothing")
	}
	var got rlsv3.RateLimitRequest
	if err := DecodeRateLimitRequest(b, &got); err != nil {
		t.Fatalf("DecodeRateLimitRequest: %v", err)
	}
	d := got.GetDescriptors()
	if got.GetDomain() != "default/\xffapi" || len(d) != 2 || len(d[0].GetEntries()) != 2 || len(d[1].GetEntries()) != 1 ||
		d[0].GetEntries()[0].GetValue() != "alice\xff" || d[0].GetEntries()[1].GetKey() != "k\x80" || d[1].GetEntries()[0].GetValue() != "\xc3" {
		t.Errorf("decoded %q", got.String())
	}
	// The strings are copies: b can be reused.
	for i := range b {
		b[i] = 0
	}
	if d[0].GetEntries()[0].GetValue() != "alice\xff" {
		t.Errorf("a decoded string changed with the buffer: %q", d[0].GetEntries()[0].GetValue())
	}
}

func TestDecodeRateLimitRequestRefusesMalformed(t *testing.T) {
	valid := wireRequest("d", wireDescriptor("k", "v"))
	for name, b := range map[string][]byte{
		"truncated":        valid[:len(valid)-1],
		"length past end":  append(protowire.AppendTag(nil, requestDescriptors, protowire.BytesType), 5, 0),
		"field number 0":   {0x02, 0x00},
		"end group":        protowire.AppendTag(nil, 7, protowire.EndGroupType),
		"open group":       protowire.AppendTag(nil, 7, protowire.StartGroupType),
		"reserved type":    {0x0e},
		"bad nested entry": wireRequest("d", []byte{0x0a, 0x02, 0x0a, 0x05}),
		"overlong varint":  append(protowire.AppendTag(nil, requestHitsAddend, protowire.VarintType), bytes.Repeat([]byte{0xff}, 10)...),
	} {
		t.Run(name, func(t *testing.T) {
			_, _, protoErr, err := decodeBoth(b)
			if protoErr == nil {
				t.Fatalf("proto.Unmarshal accepted %x", b)
			}
			if err == nil {
				t.Errorf("DecodeRateLimitRequest accepted %x, which proto.Unmarshal refuses: %v", b, protoErr)
			}
		})
	}
}

// manyDescriptors returns a request of n descriptors of one entry each.
func manyDescriptors(n int) []byte {
	d := wireDescriptor("client", "a")
	ds := make([][]byte, n)
	for i := range ds {
		ds[i] = d
	}
	return wireRequest("default/api", ds...)
}

func TestDecodeRateLimitRequestBounds(t *testing.T) {
	var req rlsv3.RateLimitRequest
	if err := DecodeRateLimitRequest(manyDescriptors(MaxDescriptors), &req); err != nil || len(req.GetDescriptors()) != MaxDescriptors {
		t.Fatalf("%d descriptors: %d decoded, %v", MaxDescriptors, len(req.GetDescriptors()), err)
	}
	if err := DecodeRateLimitRequest(manyDescriptors(MaxDescriptors+1), &req); !errors.Is(err, ErrTooManyDescriptors) {
		t.Errorf("%d descriptors: %v, want ErrTooManyDescriptors", MaxDescriptors+1, err)
	}
	kv := make([]string, 0, 2*(MaxDescriptorEntries+1))
	for range MaxDescriptorEntries {
		kv = append(kv, "k", "v")
	}
	if err := DecodeRateLimitRequest(wireRequest("d", wireDescriptor(kv...)), &req); err != nil || len(req.GetDescriptors()[0].GetEntries()) != MaxDescriptorEntries {
		t.Fatalf("%d entries: %v", MaxDescriptorEntries, err)
	}
	kv = append(kv, "k", "v")
	if err := DecodeRateLimitRequest(wireRequest("d", wireDescriptor("a", "b"), wireDescriptor(kv...)), &req); !errors.Is(err, ErrTooManyEntries) {
		t.Errorf("%d entries: %v, want ErrTooManyEntries", MaxDescriptorEntries+1, err)
	}
	if MaxRequestBytes != server.MaxBodyBytes {
		t.Errorf("MaxRequestBytes = %d, want the HTTP request body's bound %d", MaxRequestBytes, server.MaxBodyBytes)
	}
}

// maximalRefusedRequest returns a request of MaxRequestBytes holding as many descriptors as
// fit, each of one empty entry: 16,384 descriptors, which the codec must refuse.
func maximalRefusedRequest() []byte {
	one := protowire.AppendTag(nil, requestDescriptors, protowire.BytesType)
	one = protowire.AppendBytes(one, []byte{0x0a, 0x00}) // a descriptor of one empty entry
	return bytes.Repeat(one, MaxRequestBytes/len(one))
}

// allocated returns the bytes that f allocates (in the whole process).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// leastAllocated returns the fewest bytes that f allocates (in the whole process) over a few
// calls: the process's other goroutines (a server of an earlier test closing its connections)
// may allocate during any one call, never during all of them.
func leastAllocated(f func()) uint64 {
	least := allocated(f)
	for range 4 {
		least = min(least, allocated(f))
	}
	return least
}

func TestDecodeRateLimitRequestRefusesBeforeAllocating(t *testing.T) {
	b := maximalRefusedRequest()
	var err error
	n := leastAllocated(func() { err = DecodeRateLimitRequest(b, &rlsv3.RateLimitRequest{}) })
	if !errors.Is(err, ErrTooManyDescriptors) {
		t.Fatalf("DecodeRateLimitRequest: %v, want ErrTooManyDescriptors", err)
	}
	// proto.Unmarshal allocates each of the ~16,000 descriptors and entries (about 1 MiB);
	// the codec refuses at the first descriptor past the bound, having allocated nothing.
	if n > 4<<10 {
		t.Errorf("refusing %d bytes of descriptors allocated %d bytes", len(b), n)
	}
	t.Logf("refusing a %d-byte request of %d descriptors allocated %d bytes", len(b), len(b)/4, n)
	var protoErr error
	n = allocated(func() { protoErr = proto.Unmarshal(b, &rlsv3.RateLimitRequest{}) })
	t.Logf("proto.Unmarshal of it: %d bytes allocated (%v)", n, protoErr)
}

func TestCodecDelegatesOtherMessages(t *testing.T) {
	want := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
	data, err := Codec{}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got rlsv3.RateLimitResponse
	if err := (Codec{}).Unmarshal(data, &got); err != nil || !proto.Equal(want, &got) {
		t.Fatalf("round trip: %v %v", &got, err)
	}
	// A request split over several buffers.
	b := wireRequest("default/api", wireDescriptor("client", "a\xff"))
	split := mem.BufferSlice{mem.SliceBuffer(b[:3]), mem.SliceBuffer(b[3:])}
	var req rlsv3.RateLimitRequest
	if err := (Codec{}).Unmarshal(split, &req); err != nil || req.GetDescriptors()[0].GetEntries()[0].GetValue() != "a\xff" {
		t.Fatalf("split request: %v %v", req.String(), err)
	}
	if Codec.Name(Codec{}) != "proto" {
		t.Errorf("Name() = %q", Codec{}.Name())
	}
}

// FuzzDecodeRateLimitRequest compares DecodeRateLimitRequest with proto.Unmarshal into the
// same schema with bytes for strings (bytesRequest), which accepts what the decoder must
// accept: the same message, or a refusal past a bound. On what proto.Unmarshal into the
// generated type accepts (valid UTF-8), the results must be equal too.
func FuzzDecodeRateLimitRequest(f *testing.F) {
	f.Add(wireRequest("default/api", wireDescriptor("remote_address", "10.0.0.1")))
	f.Add(wireRequest("default/\xffapi", wireDescriptor("client", "alice\xff", "k\x80", "v")))
	f.Add(manyDescriptors(3))
	f.Fuzz(func(t *testing.T, b []byte) {
		want, got, protoErr, err := decodeBoth(b)
		if protoErr == nil && err == nil && !proto.Equal(want, got) {
			t.Fatalf("DecodeRateLimitRequest = %v, proto.Unmarshal = %v", got, want)
		}
		asBytes := dynamicpb.NewMessage(bytesRequest())
		bytesErr := proto.Unmarshal(b, asBytes)
		switch {
		case bytesErr == nil && err == nil:
			if want := fromBytesRequest(t, asBytes); !proto.Equal(want, got) {
				t.Fatalf("DecodeRateLimitRequest = %v, proto.Unmarshal (bytes) = %v", got, want)
			}
		case bytesErr == nil:
			if !errors.Is(err, ErrTooManyDescriptors) && !errors.Is(err, ErrTooManyEntries) {
				t.Fatalf("DecodeRateLimitRequest refused what proto.Unmarshal accepts: %v", err)
			}
			if !overBounds(fromBytesRequest(t, asBytes)) {
				t.Fatalf("DecodeRateLimitRequest refused a request within its bounds: %v", err)
			}
		case err == nil:
			t.Fatalf("DecodeRateLimitRequest accepted what proto.Unmarshal refuses (%v): %v", bytesErr, got)
		}
	})
}

func overBounds(req *rlsv3.RateLimitRequest) bool {
	if len(req.GetDescriptors()) > MaxDescriptors {
		return true
	}
	for _, d := range req.GetDescriptors() {
		if len(d.GetEntries()) > MaxDescriptorEntries {
			return true
		}
	}
	return false
}

// bytesRequest returns the descriptor of RateLimitRequest with its strings (domain, entry
// keys and values) declared bytes, which proto.Unmarshal does not check for UTF-8.
var bytesRequest = sync.OnceValue(func() protoreflect.MessageDescriptor {
	field := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type, msg string, repeated bool) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{
			Name: proto.String(name), Number: proto.Int32(num), Type: typ.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
		}
		if repeated {
			f.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
		}
		if msg != "" {
			f.TypeName = proto.String(".t." + msg)
		}
		return f
	}
	const (
		bytesT   = descriptorpb.FieldDescriptorProto_TYPE_BYTES
		messageT = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE
		uint32T  = descriptorpb.FieldDescriptorProto_TYPE_UINT32
		uint64T  = descriptorpb.FieldDescriptorProto_TYPE_UINT64
	)
	message := func(name string, fields ...*descriptorpb.FieldDescriptorProto) *descriptorpb.DescriptorProto {
		return &descriptorpb.DescriptorProto{Name: proto.String(name), Field: fields}
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("t.proto"), Package: proto.String("t"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			message("Request", field("domain", 1, bytesT, "", false), field("descriptors", 2, messageT, "Descriptor", true), field("hits_addend", 3, uint32T, "", false)),
			message("Descriptor", field("entries", 1, messageT, "Entry", true), field("limit", 2, messageT, "Override", false),
				field("hits_addend", 3, messageT, "UInt64", false), field("is_negative_hits", 4, descriptorpb.FieldDescriptorProto_TYPE_BOOL, "", false)),
			message("Entry", field("key", 1, bytesT, "", false), field("value", 2, bytesT, "", false)),
			message("Override", field("requests_per_unit", 1, uint32T, "", false), field("unit", 2, descriptorpb.FieldDescriptorProto_TYPE_INT32, "", false),
				field("unit_multiplier", 3, messageT, "UInt32", false)),
			message("UInt64", field("value", 1, uint64T, "", false)),
			message("UInt32", field("value", 1, uint32T, "", false)),
		},
	}, nil)
	if err != nil {
		panic(err)
	}
	return fd.Messages().ByName("Request")
})

// fromBytesRequest converts a bytesRequest message into a RateLimitRequest.
func fromBytesRequest(t *testing.T, m *dynamicpb.Message) *rlsv3.RateLimitRequest {
	t.Helper()
	get := func(m protoreflect.Message, name protoreflect.Name) protoreflect.Value {
		return m.Get(m.Descriptor().Fields().ByName(name))
	}
	has := func(m protoreflect.Message, name protoreflect.Name) bool {
		return m.Has(m.Descriptor().Fields().ByName(name))
	}
	// convert moves a message without strings through the wire format.
	convert := func(from protoreflect.Message, to proto.Message) {
		b, err := proto.Marshal(from.Interface())
		if err == nil {
			err = proto.Unmarshal(b, to)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	req := &rlsv3.RateLimitRequest{
		Domain:     string(get(m, "domain").Bytes()),
		HitsAddend: uint32(get(m, "hits_addend").Uint()),
	}
	req.ProtoReflect().SetUnknown(shortTags(t, m.GetUnknown()))
	descriptors := get(m, "descriptors").List()
	for i := range descriptors.Len() {
		dm := descriptors.Get(i).Message()
		d := &ratelimitv3.RateLimitDescriptor{IsNegativeHits: get(dm, "is_negative_hits").Bool()}
		d.ProtoReflect().SetUnknown(shortTags(t, dm.GetUnknown()))
		entries := get(dm, "entries").List()
		for j := range entries.Len() {
			em := entries.Get(j).Message()
			e := &ratelimitv3.RateLimitDescriptor_Entry{Key: string(get(em, "key").Bytes()), Value: string(get(em, "value").Bytes())}
			e.ProtoReflect().SetUnknown(shortTags(t, em.GetUnknown()))
			d.Entries = append(d.Entries, e)
		}
		if has(dm, "limit") {
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{}
			convert(get(dm, "limit").Message(), d.Limit)
		}
		if has(dm, "hits_addend") {
			d.HitsAddend = &wrapperspb.UInt64Value{}
			convert(get(dm, "hits_addend").Message(), d.HitsAddend)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

// shortTags rewrites the tags of unknown fields in their shortest form, as proto.Unmarshal
// keeps them for a generated type (for a dynamicpb message it keeps them as sent).
func shortTags(t *testing.T, b []byte) []byte {
	t.Helper()
	var out []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[max(n, 0):])
		if n < 0 || m < 0 {
			t.Fatalf("unknown fields %x", b)
		}
		out = append(protowire.AppendTag(out, num, typ), b[n:n+m]...)
		b = b[n+m:]
	}
	return out
}
