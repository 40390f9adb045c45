package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/envoyrls"
	"github.com/limiterd/limiterd/limiterd/policy"
)

func TestGRPCAddrFlag(t *testing.T) {
	cfg, err := parseFlags([]string{"--policy-file", "p.yaml"}, io.Discard)
	if err != nil || cfg.grpcAddr != "" {
		t.Fatalf("default: %q %v, want disabled", cfg.grpcAddr, err)
	}
	cfg, err = parseFlags([]string{"--policy-file", "p.yaml", "--grpc-addr", "127.0.0.1:8081"}, io.Discard)
	if err != nil || cfg.grpcAddr != "127.0.0.1:8081" {
		t.Fatalf("--grpc-addr: %q %v", cfg.grpcAddr, err)
	}
	d := &daemon{}
	d.addGRPC(config{})
	if len(d.servers) != 0 {
		t.Errorf("an empty --grpc-addr added %d servers", len(d.servers))
	}
	d.addGRPC(config{grpcAddr: "127.0.0.1:0"})
	if len(d.servers) != 1 || len(d.background) != 0 {
		t.Errorf("--grpc-addr added %d servers and %d loops, want 1 server", len(d.servers), len(d.background))
	}
}

// gate is an engine clock that blocks the first decision after arm until open.
type gate struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) now() time.Time {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
	}
	return time.Unix(1_900_000_000, 0)
}

// grpcUnderTest is serveGRPC running on a loopback port.
type grpcUnderTest struct {
	conn   *grpc.ClientConn
	rls    rlsv3.RateLimitServiceClient
	addr   string
	stop   context.CancelFunc
	done   chan error
	engine *engine.Engine
}

func startGRPC(t *testing.T, clock func() time.Time, timeout time.Duration) *grpcUnderTest {
	t.Helper()
	return startGRPCWith(t, clock, timeout, grpcLimits{})
}

// startGRPCWith is startGRPC with limits.
func startGRPCWith(t *testing.T, clock func() time.Time, timeout time.Duration, limits grpcLimits) *grpcUnderTest {
	t.Helper()
	p, err := policy.Compile(&v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "default"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "standard",
			Tiers: []v1alpha1.Tier{{Name: "standard", Algorithm: v1alpha1.AlgorithmTokenBucket,
				TokenBucket: &v1alpha1.TokenBucket{Capacity: 2, RefillRate: 1}}},
			Gateway: &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.NewSet(p)
	if err != nil {
		t.Fatal(err)
	}
	e := engine.New(engine.Options{Clock: clock})
	e.Swap(set)
	ctx, cancel := context.WithCancel(t.Context())
	g := &grpcUnderTest{stop: cancel, done: make(chan error, 1), engine: e}
	addrs := make(chan net.Addr, 1)
	log := slog.New(slog.DiscardHandler)
	go func() {
		g.done <- serveGRPC(ctx, nil, "127.0.0.1:0", timeout, limits, e, log, func(a net.Addr) { addrs <- a })
	}()
	select {
	case a := <-addrs:
		g.addr = a.String()
	case err := <-g.done:
		t.Fatalf("serveGRPC: %v", err)
	}
	g.conn, err = grpc.NewClient("passthrough:///"+g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	g.rls = rlsv3.NewRateLimitServiceClient(g.conn)
	t.Cleanup(func() {
		cancel()
		_ = g.conn.Close()
	})
	return g
}

func allowRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "default/api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: "alice"}},
	}}}
}

func TestServeGRPCDecidesAndReportsHealth(t *testing.T) {
	g := startGRPC(t, time.Now, time.Minute)
	h, err := healthpb.NewHealthClient(g.conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v, want SERVING", h, err)
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := g.rls.ShouldRateLimit(t.Context(), allowRequest())
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("request %d: %v %v, want %v", i, resp, err, want)
		}
	}
	g.stop()
	if err := <-g.done; err != nil {
		t.Fatalf("serveGRPC after stop: %v", err)
	}
	if c, err := net.Dial("tcp", g.addr); err == nil {
		_ = c.Close()
		t.Fatalf("%s still accepts connections after stop", g.addr)
	}
}

// waitClosed waits until addr refuses connections (the server closed its listener).
func waitClosed(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections", addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestServeGRPCStopLetsCallsInFlightFinish(t *testing.T) {
	gt := newGate()
	g := startGRPC(t, gt.now, time.Minute)
	gt.armed.Store(true)
	answered := make(chan error, 1)
	go func() {
		resp, err := g.rls.ShouldRateLimit(t.Context(), allowRequest())
		if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			err = io.ErrUnexpectedEOF
		}
		answered <- err
	}()
	<-gt.entered // the call is being decided
	g.stop()
	waitClosed(t, g.addr) // graceful stop has begun
	select {
	case err := <-g.done:
		t.Fatalf("serveGRPC returned (%v) with a call in flight", err)
	default:
	}
	close(gt.release)
	if err := <-answered; err != nil {
		t.Fatalf("call in flight during stop: %v, want OK", err)
	}
	if err := <-g.done; err != nil {
		t.Fatalf("serveGRPC: %v", err)
	}
}

func TestServeGRPCStopCancelsCallsAfterTheTimeout(t *testing.T) {
	gt := newGate()
	g := startGRPC(t, gt.now, 50*time.Millisecond)
	gt.armed.Store(true)
	answered := make(chan error, 1)
	go func() {
		_, err := g.rls.ShouldRateLimit(t.Context(), allowRequest())
		answered <- err
	}()
	<-gt.entered
	g.stop()
	err := <-g.done
	if err == nil || !strings.Contains(err.Error(), "calls still in flight after 50ms were cancelled") {
		t.Fatalf("serveGRPC: %v, want the timeout error", err)
	}
	if err := <-answered; err == nil {
		t.Fatal("the call in flight succeeded, want it cancelled")
	}
	close(gt.release)
}

func TestServeGRPCListenError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = serveGRPC(t.Context(), nil, ln.Addr().String(), time.Second, grpcLimits{}, engine.New(engine.Options{}), slog.Default(), nil)
	if err == nil || !strings.Contains(err.Error(), "listen for grpc") {
		t.Fatalf("serveGRPC on a busy port: %v", err)
	}
}

// blockingClock is an engine clock that blocks every decision while armed, until released.
type blockingClock struct {
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newBlockingClock() *blockingClock {
	return &blockingClock{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (c *blockingClock) now() time.Time {
	if c.armed.Load() {
		c.entered <- struct{}{}
		<-c.release
	}
	return time.Unix(1_900_000_000, 0)
}

// callOnNewConn makes one decision on a connection of its own to g, closed when the test ends.
func (g *grpcUnderTest) callOnNewConn(ctx context.Context, t *testing.T) (*grpc.ClientConn, error) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, allowRequest())
	return conn, err
}

func TestServeGRPCServesAtMostMaxConnections(t *testing.T) {
	g := startGRPCWith(t, time.Now, time.Minute, grpcLimits{maxConnections: 2})
	first, err := g.callOnNewConn(t.Context(), t)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.callOnNewConn(t.Context(), t); err != nil {
		t.Fatal(err)
	}
	// A third connection is not accepted: its call waits.
	third, err := grpc.NewClient("passthrough:///"+g.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(third).ShouldRateLimit(ctx, allowRequest()); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call on a connection past the bound: %v, want it to wait (DeadlineExceeded)", err)
	}
	// Once one closes, the next is served.
	_ = first.Close()
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(third).ShouldRateLimit(ctx, allowRequest(), grpc.WaitForReady(true)); err != nil {
		t.Fatalf("a call once a connection closed: %v", err)
	}
}

func TestServeGRPCServesAtMostMaxConcurrentStreams(t *testing.T) {
	clock := newBlockingClock()
	g := startGRPCWith(t, clock.now, time.Minute, grpcLimits{maxConcurrentStreams: 2})
	if _, err := g.rls.ShouldRateLimit(t.Context(), allowRequest()); err != nil { // connected
		t.Fatal(err)
	}
	clock.armed.Store(true)
	answered := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := g.rls.ShouldRateLimit(t.Context(), allowRequest())
			answered <- err
		}()
	}
	for range 2 {
		select {
		case <-clock.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("two calls were not decided at once")
		}
	}
	select {
	case <-clock.entered:
		t.Fatal("a third call was decided while two were in flight on the connection")
	case <-time.After(300 * time.Millisecond):
	}
	clock.armed.Store(false)
	close(clock.release)
	for range 3 {
		if err := <-answered; err != nil {
			t.Errorf("call: %v", err)
		}
	}
}

// rawHTTP2 opens a TCP connection to addr and, when preface, sends the HTTP/2 client preface
// and an empty SETTINGS frame; it returns how long until the server closed the connection
// (it answers nothing the server sends, PINGs included), failing after 10 s.
func rawHTTP2(t *testing.T, addr string, preface bool) time.Duration {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if preface {
		if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the server did not close the connection: %v", err)
	}
	return time.Since(start)
}

func TestServeGRPCClosesConnectionsThatHoldNothing(t *testing.T) {
	t.Parallel()
	t.Run("no handshake", func(t *testing.T) {
		g := startGRPCWith(t, time.Now, time.Minute, grpcLimits{handshakeTimeout: 200 * time.Millisecond})
		if d := rawHTTP2(t, g.addr, false); d < 150*time.Millisecond {
			t.Errorf("closed after %v, before the handshake timeout", d)
		}
	})
	t.Run("idle", func(t *testing.T) {
		g := startGRPCWith(t, time.Now, time.Minute, grpcLimits{idleTimeout: 200 * time.Millisecond})
		if d := rawHTTP2(t, g.addr, true); d < 150*time.Millisecond {
			t.Errorf("closed after %v, before the idle timeout", d)
		}
		// A client's connection goes idle too.
		if _, err := g.rls.ShouldRateLimit(t.Context(), allowRequest()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		for s := g.conn.GetState(); s == connectivity.Ready; s = g.conn.GetState() {
			if !g.conn.WaitForStateChange(ctx, s) {
				t.Fatal("the idle client connection was not closed")
			}
		}
	})
	t.Run("no ping answer", func(t *testing.T) {
		g := startGRPCWith(t, time.Now, time.Minute, grpcLimits{pingTime: 100 * time.Millisecond, pingTimeout: 100 * time.Millisecond, idleTimeout: time.Hour})
		if d := rawHTTP2(t, g.addr, true); d < 150*time.Millisecond {
			t.Errorf("closed after %v, before the ping's time and timeout", d)
		}
	})
}

// checkRequest is an ext_authz check of default/api for the client key.
func checkRequest(key string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		ContextExtensions: map[string]string{"namespace": "default", "policy": "api"},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "GET", Host: "shop.example", Path: "/", Headers: map[string]string{"x-api-key": key},
		}},
	}}
}

// TestServeGRPCServesExtAuthz: the ext_authz service shares the server, its engine and its
// message bound with the rate-limit service.
func TestServeGRPCServesExtAuthz(t *testing.T) {
	g := startGRPC(t, time.Now, time.Minute)
	c := authv3.NewAuthorizationClient(g.conn)
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		resp, err := c.Check(t.Context(), checkRequest("alice"))
		if err != nil || codes.Code(resp.GetStatus().GetCode()) != want {
			t.Fatalf("check %d: %v %v, want %v", i, resp, err, want)
		}
	}
	req := checkRequest("bob")
	req.Attributes.Request.Http.Headers["x-pad"] = strings.Repeat("x", envoyrls.MaxRequestBytes)
	if _, err := c.Check(t.Context(), req); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a check over %d bytes: %v, want ResourceExhausted", envoyrls.MaxRequestBytes, err)
	}
	if resp, err := c.Check(t.Context(), checkRequest("bob")); err != nil || resp.GetStatus().GetCode() != 0 {
		t.Fatalf("bob after the refused check: %v %v, want OK (nothing charged)", resp, err)
	}
}

func TestServeGRPCRefusesOversizeMessages(t *testing.T) {
	g := startGRPC(t, time.Now, time.Minute)
	req := allowRequest()
	req.Descriptors[0].Entries[0].Value = strings.Repeat("x", envoyrls.MaxRequestBytes)
	if _, err := g.rls.ShouldRateLimit(t.Context(), req); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a request over %d bytes: %v, want ResourceExhausted", envoyrls.MaxRequestBytes, err)
	}
	if _, err := g.rls.ShouldRateLimit(t.Context(), allowRequest()); err != nil {
		t.Fatalf("the next call on the connection: %v", err)
	}
}

// TestServeGRPCRefusesRequestsPastTheCountsAsInvalid: a request past a count of the server's
// codec (descriptors, entries, ext_authz header fields) fails with InvalidArgument naming the
// bound, a fault of the caller. Before, it failed with Internal, which reads as a fault of
// the server.
func TestServeGRPCRefusesRequestsPastTheCountsAsInvalid(t *testing.T) {
	g := startGRPC(t, time.Now, time.Minute)
	tooMany := &rlsv3.RateLimitRequest{Domain: "default/api"}
	for range envoyrls.MaxDescriptors + 1 {
		tooMany.Descriptors = append(tooMany.Descriptors, allowRequest().Descriptors[0])
	}
	wide := allowRequest()
	for range envoyrls.MaxDescriptorEntries {
		wide.Descriptors[0].Entries = append(wide.Descriptors[0].Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want error
	}{
		{"1,001 descriptors", tooMany, envoyrls.ErrTooManyDescriptors},
		{"65 entries", wide, envoyrls.ErrTooManyEntries},
	} {
		_, err := g.rls.ShouldRateLimit(t.Context(), tc.req)
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != tc.want.Error() {
			t.Errorf("%s: %v, want InvalidArgument %q", tc.name, err, tc.want)
		}
	}
	check := checkRequest("alice")
	for i := range envoyrls.MaxCheckHeaders {
		check.Attributes.Request.Http.Headers[fmt.Sprint("x-", i)] = "v"
	}
	_, err := authv3.NewAuthorizationClient(g.conn).Check(t.Context(), check)
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != envoyrls.ErrTooManyCheckHeaders.Error() {
		t.Errorf("a check of %d header fields: %v, want InvalidArgument %q", envoyrls.MaxCheckHeaders+1, err, envoyrls.ErrTooManyCheckHeaders)
	}
	// Nothing was charged: alice still has her 2 requests.
	for i := range 2 {
		if resp, err := g.rls.ShouldRateLimit(t.Context(), allowRequest()); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("decision %d after the refused requests: %v %v, want OK", i, resp, err)
		}
	}
}

func TestGRPCLimitsFollowTheHTTPFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--policy-file", "p.yaml", "--read-timeout", "3s", "--idle-timeout", "7s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	l := grpcLimitsOf(cfg.http).withDefaults()
	want := grpcLimits{
		maxConnections: defaultGRPCMaxConnections, maxConcurrentStreams: defaultGRPCMaxConcurrentStreams,
		handshakeTimeout: 3 * time.Second, idleTimeout: 7 * time.Second,
		pingTime: defaultGRPCPingTime, pingTimeout: defaultGRPCPingTimeout,
	}
	if l != want {
		t.Errorf("limits %+v, want %+v", l, want)
	}
}

// TestServeGRPCGrantsBoundedWindows reads the flow-control windows the gRPC server grants a new
// connection (its SETTINGS and first connection WINDOW_UPDATE) from a raw HTTP/2 client: fixed,
// a stream's twice the largest request and a connection's 1 MiB. Before, grpc-go's defaults
// applied: 64 KiB to start, grown by its bandwidth-delay estimate up to 16 MiB per stream and
// connection, which is what one connection could make the server buffer.
func TestServeGRPCGrantsBoundedWindows(t *testing.T) {
	g := startGRPCWith(t, time.Now, time.Minute, grpcLimits{})
	c, err := net.DialTimeout("tcp", g.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var (
		streamWindow uint32 = 65_535 // HTTP/2's initial window, unless SETTINGS says otherwise
		connWindow   uint32 = 65_535
		settings     bool
	)
	// The server sends its SETTINGS, then (when its connection window is larger than HTTP/2's
	// initial one) a WINDOW_UPDATE on stream 0; a PING or SETTINGS ACK may come between.
	for !settings || connWindow == 65_535 {
		f, err := fr.ReadFrame()
		if err != nil {
			if settings { // no WINDOW_UPDATE: the connection window stayed HTTP/2's
				break
			}
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			settings = true
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				streamWindow = v
			}
			_ = fr.WriteSettingsAck()
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				connWindow += f.Increment
			}
		}
	}
	if streamWindow != grpcStreamWindow || connWindow != grpcConnWindow {
		t.Errorf("windows granted: stream %d, connection %d; want %d and %d", streamWindow, connWindow, grpcStreamWindow, grpcConnWindow)
	}
}

// TestServeGRPCHealthAnswersOnlyItsServices: the health service reports the server ("") and
// the rate-limit service, and refuses any other name, which grpc-go's health server would keep
// for good once watched (before: 1,500 ended watches of 60 KB names grew the heap by about
// 94 MiB, and every further name by as much again).
func TestServeGRPCHealthAnswersOnlyItsServices(t *testing.T) {
	g := startGRPC(t, time.Now, time.Minute)
	hc := healthpb.NewHealthClient(g.conn)
	for _, name := range []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName, authv3.Authorization_ServiceDesc.ServiceName} {
		if h, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check %q: %v %v, want SERVING", name, h, err)
		}
		st, err := hc.Watch(t.Context(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("Watch %q: %v", name, err)
		}
		if h, err := st.Recv(); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Watch %q: %v %v, want SERVING", name, h, err)
		}
	}
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "other"}); status.Code(err) != codes.NotFound {
		t.Errorf("Check of another service: %v, want NotFound", err)
	}

	const watches, nameBytes = 1500, 60_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	pad := strings.Repeat("x", nameBytes)
	for i := range watches {
		ctx, cancel := context.WithCancel(t.Context())
		st, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: fmt.Sprint(pad, i)})
		if err == nil {
			_, err = st.Recv()
		}
		cancel()
		if status.Code(err) != codes.NotFound {
			t.Fatalf("Watch %d of an unknown service: %v, want NotFound", i, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d ended watches of %d-byte unknown names: heap grown by %d KiB", watches, nameBytes, grown>>10)
	if grown > 16<<20 {
		t.Errorf("%d ended watches of unknown names still hold %d MiB", watches, grown>>20)
	}
}
