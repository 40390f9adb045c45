package envoyrls

import (
	"errors"
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// Bounds of one request, which the Codec holds as it decodes.
const (
	// MaxDescriptors is the most descriptors of one request: as many as the items of an HTTP
	// batch (v1alpha1.MaxBatchItems).
	MaxDescriptors = v1alpha1.MaxBatchItems
	// MaxDescriptorEntries is the most entries of one descriptor. Envoy writes one entry per
	// action of a rate limit, and a configuration has a handful.
	MaxDescriptorEntries = 64
	// MaxRequestBytes is the largest request message the gRPC server receives: the bound of
	// one HTTP request's body (server.MaxBodyBytes, 64 KiB). Envoy sends a few descriptors of
	// a few short entries per request (one per rate limit action of the route), a few hundred
	// bytes; 64 KiB still holds MaxDescriptors descriptors of one short entry. It is also the
	// largest answer the server sends, which bounds a call's answer to what its request can
	// ask: the answer to MaxDescriptors descriptors of a tier without headers fits. With
	// MaxCallsInFlight it bounds what the calls in flight hold.
	MaxRequestBytes = 64 << 10
	// MaxCheckHeaders is the most header fields of one ext_authz check (an
	// envoy.service.auth.v3.CheckRequest, served beside this service): the entries of its
	// attributes.request.http headers and header_map together. Envoy refuses a request of more
	// than 100 header fields unless its max_request_headers_count is raised. grpc-go decodes a
	// check with proto.Unmarshal, and a message of MaxRequestBytes packed with the most
	// distinct one-byte headers (7,426) held about 700 KiB decoded; a check of MaxCheckHeaders
	// holds at most what its bytes do, a few times over.
	MaxCheckHeaders = 512
)

// Errors of a request the Codec refuses as it decodes. grpc-go answers a request its codec
// cannot decode with the status Internal, whose message holds the error's text; a service
// registered with Register (RegisterAuthorization) answers these bounds with InvalidArgument.
var (
	// ErrTooManyDescriptors is the error of a request with more than MaxDescriptors descriptors.
	ErrTooManyDescriptors = fmt.Errorf("envoyrls: the request has more than %d descriptors", MaxDescriptors)
	// ErrTooManyEntries is the error of a descriptor with more than MaxDescriptorEntries entries.
	ErrTooManyEntries = fmt.Errorf("envoyrls: a descriptor has more than %d entries", MaxDescriptorEntries)
	// ErrTooManyCheckHeaders is the error of an ext_authz check with more than
	// MaxCheckHeaders header fields.
	ErrTooManyCheckHeaders = fmt.Errorf("envoyrls: the ext_authz check has more than %d header fields", MaxCheckHeaders)
	// errMalformed is the error of bytes that are not a RateLimitRequest in the wire format.
	errMalformed = errors.New("envoyrls: malformed RateLimitRequest")
)

// Codec is the gRPC codec of the rate-limit server (grpc.ForceServerCodecV2(Codec{})). It
// decodes a RateLimitRequest itself and hands every other message (responses, the health
// service's) to grpc-go's proto codec. The zero value is ready to use.
//
// Its RateLimitRequest decoding differs from proto.Unmarshal in two ways only. Strings (the
// domain, the keys and values of entries) are kept as they were sent, valid UTF-8 or not:
// Envoy copies header values into descriptor entries, and an HTTP header value may hold bytes
// that are not UTF-8 (obs-text), which proto.Unmarshal refuses, failing the whole request (and
// Envoy, with failure_mode_deny false, admits it). And it holds MaxDescriptors and
// MaxDescriptorEntries before it allocates anything: a first pass over the message counts the
// descriptors and the entries of each, and refuses a request past either bound with
// ErrTooManyDescriptors or ErrTooManyEntries, so that a request of MaxRequestBytes of empty
// descriptors costs the server its bytes and no more. Everything else is decoded as
// proto.Unmarshal does: the last of repeated scalars wins, repeated message fields merge,
// unknown fields (and known fields of another wire type) are kept as unknown fields.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// Name returns "proto": the codec reads and writes the protobuf wire format.
func (Codec) Name() string { return grpcproto.Name }

// Marshal encodes v with grpc-go's proto codec.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	out, err := protoCodec().Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: marshal %T: %w", v, err)
	}
	return out, nil
}

// Unmarshal decodes data into v: a *rlsv3.RateLimitRequest with DecodeRateLimitRequest, any
// other message with grpc-go's proto codec, an ext_authz *authv3.CheckRequest once
// CheckHeaders has found it within MaxCheckHeaders.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	// Register's messages: a refusal past a bound is recorded in the message, and not returned,
	// for the method's handler to answer InvalidArgument (grpc-go answers an error of the codec
	// with Internal at once).
	switch b := v.(type) {
	case *boundedRequest:
		err := c.Unmarshal(data, b.RateLimitRequest)
		if errors.Is(err, ErrTooManyDescriptors) || errors.Is(err, ErrTooManyEntries) {
			b.err, err = err, nil
		}
		return err
	case *boundedCheck:
		err := c.Unmarshal(data, b.CheckRequest)
		if errors.Is(err, ErrTooManyCheckHeaders) {
			b.err, err = err, nil
		}
		return err
	}
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		if _, check := v.(*authv3.CheckRequest); check {
			var (
				n   int
				err error
			)
			if len(data) == 1 {
				n, err = CheckHeaders(data[0].ReadOnlyData())
			} else {
				buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
				n, err = CheckHeaders(buf.ReadOnlyData())
				buf.Free()
			}
			if err == nil && n > MaxCheckHeaders {
				err = ErrTooManyCheckHeaders
			}
			if err != nil {
				return err
			}
		}
		if err := protoCodec().Unmarshal(data, v); err != nil {
			return fmt.Errorf("envoyrls: unmarshal %T: %w", v, err)
		}
		return nil
	}
	if len(data) == 1 {
		return DecodeRateLimitRequest(data[0].ReadOnlyData(), req)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return DecodeRateLimitRequest(buf.ReadOnlyData(), req)
}

// ServerOptions returns the options of a grpc.Server of the service: Codec, MaxRequestBytes
// as the largest message it receives and sends, MaxHeaderBytes as the most headers of a call,
// and MaxCallsInFlight (MaxWatches for health Watch streams) as the most calls it holds at
// once. grpc-go refuses a larger request with ResourceExhausted as soon as it has read the
// message's length, before its bytes, and larger headers as it reads them; a call past
// MaxCallsInFlight is refused with ResourceExhausted from its headers, before its message is
// read. Each call returns options of a count of their own: give them to one server.
func ServerOptions() []grpc.ServerOption {
	limits := newCallLimits()
	return []grpc.ServerOption{
		grpc.InTapHandle(limits.tap),
		grpc.ChainUnaryInterceptor(interceptUnary),
		grpc.ChainStreamInterceptor(interceptStream),
		grpc.MaxHeaderListSize(MaxHeaderBytes),
		grpc.ForceServerCodecV2(Codec{}),
		grpc.MaxRecvMsgSize(MaxRequestBytes),
		grpc.MaxSendMsgSize(MaxRequestBytes),
	}
}

func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2(grpcproto.Name) }

// DecodeRateLimitRequest decodes the wire-format message b into req (reset first) as Codec
// does: strings are kept whether or not they are UTF-8, and a request with more than
// MaxDescriptors descriptors or a descriptor with more than MaxDescriptorEntries entries is
// refused before anything is allocated. req keeps no reference to b: its strings share one
// copy of it.
func DecodeRateLimitRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	descriptors, entries, err := countRequest(b)
	if err != nil {
		return err
	}
	proto.Reset(req)
	// The request in at most five allocations, whatever the number of its messages: its
	// strings, and slabs of its descriptors and entries.
	d := decoder{b: b, s: string(b)}
	if descriptors > 0 {
		d.descriptors = make([]ratelimitv3.RateLimitDescriptor, descriptors)
		d.descriptorPtrs = make([]*ratelimitv3.RateLimitDescriptor, descriptors)
	}
	if entries > 0 {
		d.entries = make([]ratelimitv3.RateLimitDescriptor_Entry, entries)
		d.entryPtrs = make([]*ratelimitv3.RateLimitDescriptor_Entry, entries)
	}
	return d.request(0, len(b), req)
}

// field is one field of a message in the wire format: its number and wire type, where its
// value starts (after the tag: raw) and where it ends. A varint's value is in v; a
// length-delimited value is b[start:end].
type field struct {
	num        protowire.Number
	typ        protowire.Type
	raw, start int
	end        int
	v          uint64
}

// next reads the field of b that starts at i, before end; ok is false when b is malformed
// there. It refuses what proto.Unmarshal refuses: a field number out of range, an end of
// group without its start, a truncated value, a reserved wire type.
func next(b []byte, i, end int) (f field, ok bool) {
	tag, n := protowire.ConsumeVarint(b[i:end])
	if n < 0 {
		return f, false
	}
	num := tag >> 3
	if num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) {
		return f, false
	}
	f.num, f.typ, f.raw, f.start = protowire.Number(num), protowire.Type(tag&7), i+n, i+n
	switch f.typ {
	case protowire.VarintType:
		f.v, n = protowire.ConsumeVarint(b[f.start:end])
	case protowire.BytesType:
		var l uint64
		l, n = protowire.ConsumeVarint(b[f.start:end])
		if n >= 0 {
			if l > uint64(end-f.start-n) {
				return f, false
			}
			f.start += n
			n = int(l)
		}
	case protowire.EndGroupType:
		return f, false
	case protowire.Fixed32Type, protowire.Fixed64Type, protowire.StartGroupType: // never fields of these messages
		fallthrough
	default: // reserved types
		n = protowire.ConsumeFieldValue(f.num, f.typ, b[f.start:end])
	}
	if n < 0 {
		return f, false
	}
	f.end = f.start + n
	return f, true
}

// fields calls fn with each field of the message b[i:end], in order, and returns the first error
// fn returns, or errMalformed as soon as b is malformed there.
func fields(b []byte, i, end int, fn func(f field) error) error {
	for i < end {
		f, ok := next(b, i, end)
		if !ok {
			return errMalformed
		}
		i = f.end
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// Field numbers of the messages decoded here, and the wire types of their known fields.
const (
	requestDomain      = 1 // string
	requestDescriptors = 2 // repeated RateLimitDescriptor
	requestHitsAddend  = 3 // uint32
	descriptorEntries  = 1 // repeated Entry
	descriptorLimit    = 2 // RateLimitOverride
	descriptorHits     = 3 // google.protobuf.UInt64Value
	descriptorNegative = 4 // bool
	entryKey           = 1 // string
	entryValue         = 2 // string
	wrapperValue       = 1 // uint64 of UInt64Value
	bytesType          = protowire.BytesType
	varintType         = protowire.VarintType
)

// Field numbers of the fields of an ext_authz CheckRequest that lead to its header fields.
const (
	checkAttributes   = 1  // CheckRequest.attributes
	attributesRequest = 4  // AttributeContext.request
	requestHTTP       = 2  // AttributeContext.Request.http
	httpHeaders       = 3  // AttributeContext.HttpRequest.headers (map entries)
	httpHeaderMap     = 13 // AttributeContext.HttpRequest.header_map
	headerMapHeaders  = 1  // HeaderMap.headers
)

// CheckHeaders returns the number of header fields of the ext_authz check b (an
// envoy.service.auth.v3.CheckRequest in the wire format): the entries of every occurrence of
// attributes.request.http.headers and .header_map.headers, which proto.Unmarshal merges, or
// an error as soon as b is malformed on the way to them. It allocates nothing.
func CheckHeaders(b []byte) (int, error) {
	n := 0
	// in calls fn with each field of number num and type bytes of the message b[i:end].
	in := func(i, end int, num protowire.Number, fn func(f field) error) error {
		return fields(b, i, end, func(f field) error {
			if f.num == num && f.typ == bytesType {
				return fn(f)
			}
			return nil
		})
	}
	err := in(0, len(b), checkAttributes, func(a field) error {
		return in(a.start, a.end, attributesRequest, func(r field) error {
			return in(r.start, r.end, requestHTTP, func(h field) error {
				return fields(b, h.start, h.end, func(f field) error {
					switch {
					case f.typ != bytesType:
					case f.num == httpHeaders:
						n++
					case f.num == httpHeaderMap:
						return in(f.start, f.end, headerMapHeaders, func(field) error {
							n++
							return nil
						})
					}
					return nil
				})
			})
		})
	})
	if err != nil {
		return 0, errMalformedCheck
	}
	return n, nil
}

// errMalformedCheck is the error of bytes that are not a CheckRequest in the wire format.
var errMalformedCheck = errors.New("envoyrls: malformed CheckRequest")

// countRequest returns the number of descriptors of the request b and the number of their
// entries, or an error as soon as b is malformed or past a bound. It allocates nothing.
func countRequest(b []byte) (descriptors, entries int, err error) {
	err = fields(b, 0, len(b), func(f field) error {
		if f.num != requestDescriptors || f.typ != bytesType {
			return nil
		}
		if descriptors == MaxDescriptors {
			return ErrTooManyDescriptors
		}
		descriptors++
		n := 0
		err := fields(b, f.start, f.end, func(g field) error {
			if g.num == descriptorEntries && g.typ == bytesType {
				if n == MaxDescriptorEntries {
					return ErrTooManyEntries
				}
				n++
			}
			return nil
		})
		entries += n
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	return descriptors, entries, nil
}

// decoder fills a request from b, whose copy s holds its strings, taking its messages in turn
// from slabs that countRequest sized.
type decoder struct {
	b              []byte
	s              string
	descriptors    []ratelimitv3.RateLimitDescriptor
	descriptorPtrs []*ratelimitv3.RateLimitDescriptor
	entries        []ratelimitv3.RateLimitDescriptor_Entry
	entryPtrs      []*ratelimitv3.RateLimitDescriptor_Entry
	nextDescriptor int
	nextEntry      int
}

// unknown appends the field f to m's unknown fields, as proto.Unmarshal keeps a field it does
// not know (or knows with another wire type): its tag written anew (in its shortest form),
// then its value as sent.
func (d *decoder) unknown(m proto.Message, f field) {
	r := m.ProtoReflect()
	u := protowire.AppendTag(r.GetUnknown(), f.num, f.typ)
	r.SetUnknown(append(u, d.b[f.raw:f.end]...))
}

func (d *decoder) request(i, end int, req *rlsv3.RateLimitRequest) error {
	first := d.nextDescriptor
	return fields(d.b, i, end, func(f field) error {
		switch {
		case f.num == requestDomain && f.typ == bytesType:
			req.Domain = d.s[f.start:f.end]
		case f.num == requestDescriptors && f.typ == bytesType:
			n := d.nextDescriptor
			d.nextDescriptor++
			d.descriptorPtrs[n] = &d.descriptors[n]
			req.Descriptors = d.descriptorPtrs[first:d.nextDescriptor:d.nextDescriptor]
			if err := d.descriptor(f.start, f.end, d.descriptorPtrs[n]); err != nil {
				return err
			}
		case f.num == requestHitsAddend && f.typ == varintType:
			req.HitsAddend = uint32(f.v)
		default:
			d.unknown(req, f)
		}
		return nil
	})
}

func (d *decoder) descriptor(i, end int, desc *ratelimitv3.RateLimitDescriptor) error {
	first := d.nextEntry
	return fields(d.b, i, end, func(f field) error {
		switch {
		case f.num == descriptorEntries && f.typ == bytesType:
			n := d.nextEntry
			d.nextEntry++
			d.entryPtrs[n] = &d.entries[n]
			desc.Entries = d.entryPtrs[first:d.nextEntry:d.nextEntry]
			if err := d.entry(f.start, f.end, d.entryPtrs[n]); err != nil {
				return err
			}
		case f.num == descriptorLimit && f.typ == bytesType:
			// Ignored by the service and holding no strings: proto.Unmarshal merges it.
			if desc.Limit == nil {
				desc.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{}
			}
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(d.b[f.start:f.end], desc.Limit); err != nil {
				return errMalformed
			}
		case f.num == descriptorHits && f.typ == bytesType:
			if desc.HitsAddend == nil {
				desc.HitsAddend = &wrapperspb.UInt64Value{}
			}
			if err := d.uint64Value(f.start, f.end, desc.HitsAddend); err != nil {
				return err
			}
		case f.num == descriptorNegative && f.typ == varintType:
			desc.IsNegativeHits = f.v != 0
		default:
			d.unknown(desc, f)
		}
		return nil
	})
}

func (d *decoder) entry(i, end int, e *ratelimitv3.RateLimitDescriptor_Entry) error {
	return fields(d.b, i, end, func(f field) error {
		switch {
		case f.num == entryKey && f.typ == bytesType:
			e.Key = d.s[f.start:f.end]
		case f.num == entryValue && f.typ == bytesType:
			e.Value = d.s[f.start:f.end]
		default:
			d.unknown(e, f)
		}
		return nil
	})
}

// uint64Value merges a google.protobuf.UInt64Value into v.
func (d *decoder) uint64Value(i, end int, v *wrapperspb.UInt64Value) error {
	return fields(d.b, i, end, func(f field) error {
		if f.num == wrapperValue && f.typ == varintType {
			v.Value = f.v
		} else {
			d.unknown(v, f)
		}
		return nil
	})
}
