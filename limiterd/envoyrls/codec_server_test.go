package envoyrls

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// rawCodec is a client codec that sends a request's wire format as given (a *[]byte), so that
// a test can send what proto.Marshal refuses to write, as Envoy's C++ protobuf does.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// serveLoopback serves the service of e on a loopback TCP port with opts (ServerOptions when
// nil) and returns a connection to it, both closed when the test ends.
func serveLoopback(t testing.TB, e *engine.Engine, opts []grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	return serveLoopbackWith(t, e, opts, func(srv *grpc.Server, s *Service) { Register(srv, s) })
}

// serveLoopbackWith is serveLoopback registering the service with register.
func serveLoopbackWith(t testing.TB, e *engine.Engine, opts []grpc.ServerOption, register func(*grpc.Server, *Service)) *grpc.ClientConn {
	t.Helper()
	if opts == nil {
		opts = ServerOptions()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	register(srv, New(e, nil))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return conn
}

// shouldRateLimitRaw sends the wire-format request b.
func shouldRateLimitRaw(ctx context.Context, conn *grpc.ClientConn, b []byte) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{}
	err := conn.Invoke(ctx, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, &b, resp,
		grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallSendMsgSize(1<<30))
	return resp, err
}

// TestInvalidUTF8ValueIsADistinctClient sends descriptor values holding bytes that are not
// UTF-8, as Envoy does for a header value with obs-text: each is a client of its own, decided
// and limited as any other (grpc-go's proto codec refused such a request, so Envoy admitted it).
func TestInvalidUTF8ValueIsADistinctClient(t *testing.T) {
	clock := testsupport.NewClock()
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 2, 1, time.Hour))
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	e := newEngine(t, clock, p)
	conn := serveLoopback(t, e, nil)
	decide := func(value string, n int) []rlsv3.RateLimitResponse_Code {
		var got []rlsv3.RateLimitResponse_Code
		for range n {
			resp, err := shouldRateLimitRaw(t.Context(), conn, wireRequest("default/api", wireDescriptor("client", value)))
			if err != nil {
				t.Fatalf("client %q: %v", value, err)
			}
			got = append(got, resp.GetOverallCode())
		}
		return got
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for _, value := range []string{"alice\xff", "alice\xfe", "alice", "\xff"} {
		if got := decide(value, 3); got[0] != ok || got[1] != ok || got[2] != over {
			t.Errorf("client %q: %v, want OK, OK, OVER_LIMIT", value, got)
		}
	}
	for _, key := range []string{"alice\xff", "alice\xfe", "alice", "\xff"} {
		if r := remaining(t, e, "default/api", key); r != 0 {
			t.Errorf("client %q has %d remaining, want 0", key, r)
		}
	}
	if r := remaining(t, e, "default/api", "alice\xff\xff"); r != 2 {
		t.Errorf("an untouched client has %d remaining, want 2", r)
	}

	// The whole descriptor as the key, and a domain that is not UTF-8.
	p2 := newPolicy("default", "whole", testsupport.TokenBucketTier("standard", 1, 1, time.Hour))
	e2 := newEngine(t, clock, p2)
	conn2 := serveLoopback(t, e2, nil)
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, over} {
		resp, err := shouldRateLimitRaw(t.Context(), conn2, wireRequest("default/whole", wireDescriptor("h", "v\x80")))
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("request %d: %v %v, want %v", i, resp.GetOverallCode(), err, want)
		}
	}
	_, err := shouldRateLimitRaw(t.Context(), conn2, wireRequest("default/\xff", wireDescriptor("h", "v")))
	if status.Code(err) != codes.NotFound {
		t.Errorf("a domain that is not UTF-8: %v, want NotFound", err)
	}
}

func TestServerRefusesRequestsPastTheBounds(t *testing.T) {
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 1000, 1, time.Hour))
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	e := newEngine(t, testsupport.NewClock(), p)
	conn := serveLoopback(t, e, nil)
	resp, err := shouldRateLimitRaw(t.Context(), conn, manyDescriptors(MaxDescriptors))
	if err != nil || len(resp.GetStatuses()) != MaxDescriptors {
		t.Fatalf("%d descriptors: %d statuses, %v", MaxDescriptors, len(resp.GetStatuses()), err)
	}
	// Refused by the codec, with InvalidArgument (Register's), not Internal (grpc-go's answer to
	// a codec's error, which reads as a fault of the server).
	_, err = shouldRateLimitRaw(t.Context(), conn, manyDescriptors(MaxDescriptors+1))
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != ErrTooManyDescriptors.Error() {
		t.Errorf("%d descriptors: %v, want InvalidArgument %v", MaxDescriptors+1, err, ErrTooManyDescriptors)
	}
	kv := make([]string, 0, 2*(MaxDescriptorEntries+1))
	for range MaxDescriptorEntries + 1 {
		kv = append(kv, "k", "v")
	}
	_, err = shouldRateLimitRaw(t.Context(), conn, wireRequest("default/api", wireDescriptor(kv...)))
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != ErrTooManyEntries.Error() {
		t.Errorf("%d entries: %v, want InvalidArgument %v", MaxDescriptorEntries+1, err, ErrTooManyEntries)
	}
	// Registered the generated way, the same refusal is grpc-go's Internal: what Register is for.
	generated := serveLoopbackWith(t, e, nil, func(srv *grpc.Server, s *Service) { rlsv3.RegisterRateLimitServiceServer(srv, s) })
	_, err = shouldRateLimitRaw(t.Context(), generated, manyDescriptors(MaxDescriptors+1))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), ErrTooManyDescriptors.Error()) {
		t.Errorf("%d descriptors, registered the generated way: %v, want Internal %v", MaxDescriptors+1, err, ErrTooManyDescriptors)
	}
	// A message past MaxRequestBytes is refused from its length.
	big := wireRequest("default/api", wireDescriptor("client", strings.Repeat("x", MaxRequestBytes)))
	_, err = shouldRateLimitRaw(t.Context(), conn, big)
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a %d-byte request: %v, want ResourceExhausted", len(big), err)
	}
	if r := remaining(t, e, "default/api", "a"); r != 0 {
		t.Errorf("client a has %d remaining after the accepted request of %d descriptors, want 0", r, MaxDescriptors)
	}
	// The service holds the bounds for requests decoded by another codec.
	plain := serveLoopback(t, e, []grpc.ServerOption{grpc.MaxRecvMsgSize(64 << 20)})
	_, err = shouldRateLimitRaw(t.Context(), plain, manyDescriptors(MaxDescriptors+1))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), ErrTooManyDescriptors.Error()) {
		t.Errorf("%d descriptors through the proto codec: %v, want InvalidArgument", MaxDescriptors+1, err)
	}
	_, err = shouldRateLimitRaw(t.Context(), plain, wireRequest("default/api", wireDescriptor(kv...)))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), ErrTooManyEntries.Error()) {
		t.Errorf("%d entries through the proto codec: %v, want InvalidArgument", MaxDescriptorEntries+1, err)
	}
}

// TestMaximalRefusedRequestCostsItsBytes measures what the largest request the server refuses
// costs the process (server and client): its bytes and grpc-go's, not one object per
// descriptor. grpc-go's defaults (proto codec, 4 MiB) allocated about 578 MiB for 1M
// descriptors (BenchmarkMaximalRefusedRequest reports both).
func TestMaximalRefusedRequestCostsItsBytes(t *testing.T) {
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 1000, 1, time.Hour))
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	e := newEngine(t, testsupport.NewClock(), p)
	conn := serveLoopback(t, e, nil)
	if _, err := shouldRateLimitRaw(t.Context(), conn, wireRequest("default/api", wireDescriptor("client", "warm"))); err != nil {
		t.Fatal(err)
	}
	b := maximalRefusedRequest()
	var err error
	n := allocated(func() { _, err = shouldRateLimitRaw(t.Context(), conn, b) })
	if err == nil || !strings.Contains(err.Error(), ErrTooManyDescriptors.Error()) {
		t.Fatalf("maximal request: %v, want %v", err, ErrTooManyDescriptors)
	}
	t.Logf("a refused request of %d bytes (%d descriptors) allocated %d bytes (server and client)", len(b), len(b)/4, n)
	if n > 16<<20 {
		t.Errorf("a refused request of %d bytes allocated %d bytes, want at most 16 MiB", len(b), n)
	}
}

// BenchmarkMaximalRefusedRequest reports the bytes the process (server and client) allocates
// for the largest request of the smallest descriptors (one empty entry each) that a server
// receives: with grpc-go's defaults (proto codec, 4 MiB messages), about a million
// descriptors, all decoded before the service refuses them; with ServerOptions, half as many,
// refused by the codec as it counts them. Run it with -benchtime 1x: one call of the defaults takes seconds.
func BenchmarkMaximalRefusedRequest(b *testing.B) {
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 1000, 1, time.Hour))
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	for _, bc := range []struct {
		name  string
		opts  []grpc.ServerOption
		bytes int
	}{
		{"server=grpc-defaults", []grpc.ServerOption{}, 4 << 20},
		{"server=limiterd", ServerOptions(), MaxRequestBytes},
	} {
		b.Run(bc.name, func(b *testing.B) {
			conn := serveLoopback(b, newEngine(b, testsupport.NewClock(), p), bc.opts)
			one := []byte{requestDescriptors<<3 | 2, 2, descriptorEntries<<3 | 2, 0} // a descriptor of one empty entry
			req := append(wireRequest("default/api"), bytes.Repeat(one, (bc.bytes-20)/len(one))...)
			if _, err := shouldRateLimitRaw(b.Context(), conn, wireRequest("default/api", wireDescriptor("client", "warm"))); err != nil {
				b.Fatal(err)
			}
			var total uint64
			b.ResetTimer()
			for range b.N {
				total += allocated(func() {
					resp, err := shouldRateLimitRaw(b.Context(), conn, req)
					b.Logf("%d-byte request of %d descriptors: %d statuses, %v", len(req), len(req)/len(one), len(resp.GetStatuses()), err)
				})
			}
			b.ReportMetric(float64(total)/float64(b.N)/(1<<20), "MiB/request")
		})
	}
}
