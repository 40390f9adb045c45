package envoyrls

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/server"
)

// heldRLS is a rate-limit service that holds every call, with its decoded request, until
// release is closed; it tells entered when a call reaches it.
type heldRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	entered chan struct{}
	release chan struct{}
}

func (h heldRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	h.entered <- struct{}{}
	<-h.release
	runtime.KeepAlive(req)
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// serveHeld serves h, and grpc-go's health service as limiterd does, with ServerOptions on a
// loopback TCP port and returns conns connections to it, all closed when the test ends
// (release is closed first).
func serveHeld(t *testing.T, h heldRLS, conns int) []*grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions()...)
	Register(srv, h)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	cs := make([]*grpc.ClientConn, conns)
	for i := range cs {
		if cs[i], err = grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range cs {
			_ = c.Close()
		}
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return cs
}

// maximalRequest returns a request of MaxDescriptors descriptors of one entry each, as long
// as MaxRequestBytes allows: the largest request the server decodes in full.
func maximalRequest(t testing.TB) []byte {
	t.Helper()
	probe := wireRequest("default/api", wireDescriptor("client", ""))
	valueLen := (MaxRequestBytes-len(probe))/MaxDescriptors - len(wireDescriptor("client", "")) - 8
	ds := make([][]byte, MaxDescriptors)
	for i := range ds {
		ds[i] = wireDescriptor("client", fmt.Sprintf("%0*d", valueLen, i))
	}
	b := wireRequest("default/api", ds...)
	if len(b) > MaxRequestBytes || len(b) < MaxRequestBytes*3/4 {
		t.Fatalf("maximal request of %d bytes, want at most %d and near it", len(b), MaxRequestBytes)
	}
	return b
}

// TestRequestPastTheHTTPBodyBoundIsRefused sends a request of one descriptor one byte longer
// than an HTTP request body may be: refused with ResourceExhausted, as grpc-go refuses a
// message past MaxRequestBytes from its length.
func TestRequestPastTheHTTPBodyBoundIsRefused(t *testing.T) {
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 1000, 1, time.Hour))
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	conn := serveLoopback(t, newEngine(t, testsupport.NewClock(), p), nil)
	fits := wireRequest("default/api", wireDescriptor("client", strings.Repeat("x", server.MaxBodyBytes-64)))
	if _, err := shouldRateLimitRaw(t.Context(), conn, fits); err != nil {
		t.Fatalf("a %d-byte request: %v", len(fits), err)
	}
	over := wireRequest("default/api", wireDescriptor("client", strings.Repeat("x", server.MaxBodyBytes)))
	if _, err := shouldRateLimitRaw(t.Context(), conn, over); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a %d-byte request: %v, want ResourceExhausted", len(over), err)
	}
}

// holdCalls starts n calls of req spread over conns, and waits until each has either reached
// h (held) or failed; it returns how many were held and the errors of the others.
func holdCalls(t *testing.T, h heldRLS, conns []*grpc.ClientConn, n int, req []byte, wg *sync.WaitGroup) (held int, errs []error) {
	t.Helper()
	failed := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if _, err := shouldRateLimitRaw(context.Background(), conns[i%len(conns)], req); err != nil {
				failed <- err
			}
		})
	}
	for held+len(errs) < n {
		select {
		case <-h.entered:
			held++
		case err := <-failed:
			errs = append(errs, err)
		case <-t.Context().Done():
			t.Fatal("test ended while calls were pending")
		}
	}
	return held, errs
}

// TestCallsPastTheInFlightCapAreRefused holds MaxCallsInFlight calls in the service, over
// several connections: further calls are refused with ResourceExhausted, and accepted again
// once the held ones finish.
func TestCallsPastTheInFlightCapAreRefused(t *testing.T) {
	h := heldRLS{entered: make(chan struct{}), release: make(chan struct{})}
	conns := serveHeld(t, h, 8)
	req := wireRequest("default/api", wireDescriptor("client", "a"))
	var wg sync.WaitGroup
	released := false
	defer func() {
		if !released {
			close(h.release)
		}
		wg.Wait()
	}()
	held, errs := holdCalls(t, h, conns, MaxCallsInFlight, req, &wg)
	if held != MaxCallsInFlight {
		t.Fatalf("%d of %d calls held, errors: %v", held, MaxCallsInFlight, errs)
	}
	// Without the cap the call would be held too: the timeout only ends such a call.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for i, c := range conns {
		_, err := shouldRateLimitRaw(ctx, c, req)
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a call on connection %d past %d in flight: %v, want ResourceExhausted", i, MaxCallsInFlight, err)
		}
	}
	close(h.release)
	released = true
	wg.Wait()
	// A finished call's slot is released as its method returns, about when the client has its
	// answer: each connection is accepted again once it is.
	go func() {
		for range h.entered {
		}
	}()
	defer close(h.entered)
	for i, c := range conns {
		_, err := shouldRateLimitRaw(t.Context(), c, req)
		for status.Code(err) == codes.ResourceExhausted && t.Context().Err() == nil {
			_, err = shouldRateLimitRaw(t.Context(), c, req)
		}
		if err != nil {
			t.Errorf("a call on connection %d after the held calls finished: %v", i, err)
		}
	}
}

// TestBurstOfMaximalCallsHoldsBoundedHeap sends 4×MaxCallsInFlight calls of the largest
// request the server decodes in full (MaxDescriptors descriptors in MaxRequestBytes) at once,
// and measures the heap while the admitted ones are held with their decoded requests: at most
// MaxCallsInFlight calls of 8×MaxRequestBytes (512 KiB) each; a held call measured about
// 300 KiB, its message and decoded request on the server and its buffers on the client. Without
// the cap, every call is held (about 300 MiB).
func TestBurstOfMaximalCallsHoldsBoundedHeap(t *testing.T) {
	h := heldRLS{entered: make(chan struct{}), release: make(chan struct{})}
	conns := serveHeld(t, h, 16)
	req := maximalRequest(t)
	var wg sync.WaitGroup
	defer func() {
		close(h.release)
		wg.Wait()
	}()
	var before, during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n := 4 * MaxCallsInFlight
	held, errs := holdCalls(t, h, conns, n, req, &wg)
	runtime.GC()
	runtime.ReadMemStats(&during)
	grown := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d calls of %d bytes: %d held, %d refused; heap grew by %d bytes (%d per held call)",
		n, len(req), held, len(errs), grown, grown/int64(max(held, 1)))
	if held > MaxCallsInFlight {
		t.Errorf("%d calls held at once, want at most %d", held, MaxCallsInFlight)
	}
	for _, err := range errs {
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a refused call: %v, want ResourceExhausted", err)
			break
		}
	}
	if bound := int64(MaxCallsInFlight) * 8 * MaxRequestBytes; grown > bound {
		t.Errorf("heap grew by %d bytes with %d calls in flight, want at most %d", grown, held, bound)
	}
}

// TestCancelledCallsKeepTheirSlotsUntilTheyEnd holds MaxCallsInFlight calls in the service and
// then cancels them on the client: the service still holds them (a handler need not watch its
// context), so their slots stay taken and a further call is refused until they return. A cap
// that freed a slot when the client cancelled would let a client that cancels each call as soon
// as it is sent keep any number of calls, each with its decoded request, on the server.
func TestCancelledCallsKeepTheirSlotsUntilTheyEnd(t *testing.T) {
	h := heldRLS{entered: make(chan struct{}), release: make(chan struct{})}
	conns := serveHeld(t, h, 4)
	req := wireRequest("default/api", wireDescriptor("client", "a"))
	ctx, cancel := context.WithCancel(t.Context())
	var calls sync.WaitGroup
	for i := range MaxCallsInFlight {
		calls.Go(func() { _, _ = shouldRateLimitRaw(ctx, conns[i%len(conns)], req) })
	}
	for range MaxCallsInFlight {
		<-h.entered
	}
	cancel()
	calls.Wait() // every client has its Canceled, and has reset its stream
	probe, stop := context.WithTimeout(t.Context(), 10*time.Second)
	defer stop()
	for i, c := range conns {
		if _, err := shouldRateLimitRaw(probe, c, req); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a call on connection %d while %d cancelled calls are still handled: %v, want ResourceExhausted", i, MaxCallsInFlight, err)
		}
	}
	close(h.release)
	go func() {
		for range h.entered {
		}
	}()
	defer close(h.entered)
	for i, c := range conns {
		_, err := shouldRateLimitRaw(t.Context(), c, req)
		for status.Code(err) == codes.ResourceExhausted && t.Context().Err() == nil {
			_, err = shouldRateLimitRaw(t.Context(), c, req)
		}
		if err != nil {
			t.Errorf("a call on connection %d once the cancelled calls returned: %v", i, err)
		}
	}
}

// TestCallsThatNeverReachTheServiceReleaseTheirSlots makes more than MaxCallsInFlight calls that
// end before the service sees them (a request the codec refuses, a method the server does not
// have, a message past the size bound): none keeps its slot, so a decision is still served.
func TestCallsThatNeverReachTheServiceReleaseTheirSlots(t *testing.T) {
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 10, 1, time.Hour))
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	conn := serveLoopback(t, newEngine(t, testsupport.NewClock(), p), nil)
	refused := maximalRefusedRequest()
	oversize := bytes.Repeat([]byte{0}, MaxRequestBytes+1)
	for i := range MaxCallsInFlight + 10 {
		var err error
		switch want := codes.InvalidArgument; i % 3 {
		case 0:
			_, err = shouldRateLimitRaw(t.Context(), conn, refused)
			if status.Code(err) != want {
				t.Fatalf("call %d, refused by the codec: %v, want %v", i, err, want)
			}
		case 1:
			b := wireRequest("default/api", wireDescriptor("client", "a"))
			err = conn.Invoke(t.Context(), "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod", &b, &rlsv3.RateLimitResponse{}, grpc.ForceCodecV2(rawCodec{}))
			if status.Code(err) != codes.Unimplemented {
				t.Fatalf("call %d, of no method: %v, want Unimplemented", i, err)
			}
		case 2:
			_, err = shouldRateLimitRaw(t.Context(), conn, oversize)
			if status.Code(err) != codes.ResourceExhausted || strings.Contains(err.Error(), "in flight") {
				t.Fatalf("call %d, past the size bound: %v, want ResourceExhausted for its size", i, err)
			}
		}
	}
	resp, err := shouldRateLimitRaw(t.Context(), conn, wireRequest("default/api", wireDescriptor("client", "a")))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a decision after %d calls that ended early: %v, %v", MaxCallsInFlight+10, resp, err)
	}
}

// TestWatchesAreCountedApart: health Watch streams, which last as long as their clients want,
// are bounded too (before, they were not counted at all: 800 watches of 60 KB requests held
// 513 MiB), and apart from the rate-limit calls, whose places they cannot take.
func TestWatchesAreCountedApart(t *testing.T) {
	h := heldRLS{entered: make(chan struct{}, 1), release: make(chan struct{})}
	close(h.release)
	conn := serveHeld(t, h, 1)[0]
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for i := range MaxWatches {
		st, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	st, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("watch %d: %v, want ResourceExhausted", MaxWatches+1, err)
	}
	if _, err := shouldRateLimitRaw(t.Context(), conn, wireRequest("default/api", wireDescriptor("client", "a"))); err != nil {
		t.Errorf("a rate-limit call while %d watches are open: %v", MaxWatches, err)
	}
	<-h.entered
}

// TestCallHeadersAreBounded: a call's headers are at most MaxHeaderBytes; before, grpc-go's
// default let each call hold 16 MiB of them.
func TestCallHeadersAreBounded(t *testing.T) {
	h := heldRLS{entered: make(chan struct{}, 2), release: make(chan struct{})}
	close(h.release)
	conn := serveHeld(t, h, 1)[0]
	req := wireRequest("default/api", wireDescriptor("client", "a"))
	big := metadata.AppendToOutgoingContext(t.Context(), "x-pad", strings.Repeat("x", 2*MaxHeaderBytes))
	if _, err := shouldRateLimitRaw(big, conn, req); err == nil {
		t.Errorf("a call with %d bytes of headers was served", 2*MaxHeaderBytes)
	}
	small := metadata.AppendToOutgoingContext(t.Context(), "x-pad", strings.Repeat("x", 1<<10))
	if _, err := shouldRateLimitRaw(small, conn, req); err != nil {
		t.Errorf("a call with 1 KiB of headers: %v", err)
	}
}
