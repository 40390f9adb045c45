package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/envoyrls"
	"github.com/limiterd/limiterd/limiterd/extauthz"
)

// Bounds of the gRPC server that no flag sets.
const (
	// defaultGRPCMaxConnections bounds the connections the gRPC server serves at once; more
	// wait in the listen backlog until one closes. Envoy opens one connection per worker
	// thread to each replica, so this serves about a hundred Envoys of 8 workers with room to
	// spare, and bounds what idle connections cost (grpc-go holds ~70 KiB of buffers each).
	defaultGRPCMaxConnections = 1024
	// defaultGRPCMaxConcurrentStreams bounds the calls in flight on one connection; more wait
	// for one to finish (Envoy queues them). With MaxRequestBytes per call it bounds what one
	// connection can make the server hold.
	defaultGRPCMaxConcurrentStreams = 100
	// grpcStreamWindow and grpcConnWindow are the HTTP/2 flow-control windows the server
	// grants: what a client may send on one call, and on one connection, before the server has
	// read it. A call's message is at most envoyrls.MaxRequestBytes, so a stream window of
	// twice that never slows a call; fixed windows also switch off grpc-go's bandwidth-delay
	// estimation, which grows both windows up to 16 MiB on a fast connection, so that what a
	// connection can make the server buffer stays at grpcConnWindow.
	grpcStreamWindow = 2 * envoyrls.MaxRequestBytes
	grpcConnWindow   = 1 << 20
	// defaultGRPCPingTime is how long a connection may be silent before the server pings it,
	// and defaultGRPCPingTimeout how long it waits for the answer before it closes it: a peer
	// that vanished without closing its connection (a killed node) frees it within 80 s.
	defaultGRPCPingTime    = time.Minute
	defaultGRPCPingTimeout = 20 * time.Second
)

// grpcLimits bounds what the gRPC server's clients may hold: connections, calls in flight and
// time. A zero field takes its default: the constants above, and the HTTP servers' read and
// idle timeouts (--read-timeout, --idle-timeout).
type grpcLimits struct {
	maxConnections       int
	maxConcurrentStreams uint32
	// handshakeTimeout bounds a new connection's TLS handshake and HTTP/2 preface, as the read
	// timeout bounds an HTTP request: a client that sends nothing loses its connection then.
	handshakeTimeout time.Duration
	// idleTimeout closes a connection with no call in flight for that long (with a GOAWAY, so
	// the client reconnects when it needs to), as the HTTP idle timeout does.
	idleTimeout           time.Duration
	pingTime, pingTimeout time.Duration
}

// grpcLimitsOf returns the gRPC server's limits for the HTTP server flags c.
func grpcLimitsOf(c httpConfig) grpcLimits {
	return grpcLimits{handshakeTimeout: c.readTimeout, idleTimeout: c.idleTimeout}
}

// withDefaults returns l with every zero field set to its default.
func (l grpcLimits) withDefaults() grpcLimits {
	set := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if l.maxConnections <= 0 {
		l.maxConnections = defaultGRPCMaxConnections
	}
	if l.maxConcurrentStreams == 0 {
		l.maxConcurrentStreams = defaultGRPCMaxConcurrentStreams
	}
	set(&l.handshakeTimeout, defaultReadTimeout)
	set(&l.idleTimeout, defaultIdleTimeout)
	set(&l.pingTime, defaultGRPCPingTime)
	set(&l.pingTimeout, defaultGRPCPingTimeout)
	return l
}

// options returns the server options that hold l (but the connection bound, which is the
// listener's), with the service's own (envoyrls.ServerOptions: its codec and message bounds).
func (l grpcLimits) options() []grpc.ServerOption {
	return append([]grpc.ServerOption{
		grpc.MaxConcurrentStreams(l.maxConcurrentStreams),
		grpc.InitialWindowSize(grpcStreamWindow),
		grpc.InitialConnWindowSize(grpcConnWindow),
		grpc.ConnectionTimeout(l.handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: l.idleTimeout,
			Time:              l.pingTime,
			Timeout:           l.pingTimeout,
		}),
		// Envoy may keep idle connections alive with HTTP/2 pings; accept them every 10 s rather
		// than answering GOAWAY "too_many_pings" under gRPC's 5-minute default.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, envoyrls.ServerOptions()...)
}

// addGRPC adds Envoy's rate-limit and external authorization services on cfg.grpcAddr to d's background loops, unless the
// address is empty. A listen failure is reported as the loop's error, which stops limiterd.
func (d *daemon) addGRPC(cfg config) {
	if cfg.grpcAddr == "" {
		return
	}
	d.servers = append(d.servers, func(ctx context.Context) error {
		var opts []grpc.ServerOption
		if creds := d.tls.grpcCredentials(); creds != nil {
			opts = append(opts, grpc.Creds(creds))
		}
		return serveGRPC(ctx, d.draining, cfg.grpcAddr, cfg.shutdownTimeout, grpcLimitsOf(cfg.http), d.engine, d.log, nil, opts...)
	})
}

// knownServiceHealth serves grpc.health.v1.Health for the server as a whole ("") and its
// services (rate limit, external authorization), and answers NotFound for any other name without passing it to grpc-go's
// health server, whose Watch keeps every name it was asked about for the life of the process
// (grpc-go v1.84; grpc/grpc-go#9411 fixes it upstream): 4,000 watches of 60 KB names, each
// ended, held 251 MiB.
type knownServiceHealth struct {
	*health.Server
}

var errUnknownHealthService = status.Errorf(codes.NotFound, "unknown service: this server reports the health of \"\", %s and %s",
	rlsv3.RateLimitService_ServiceDesc.ServiceName, authv3.Authorization_ServiceDesc.ServiceName)

func knownHealthService(name string) bool {
	return name == "" || name == rlsv3.RateLimitService_ServiceDesc.ServiceName || name == authv3.Authorization_ServiceDesc.ServiceName
}

// Check answers the health of a known service.
func (h knownServiceHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if !knownHealthService(req.GetService()) {
		return nil, errUnknownHealthService
	}
	return h.Server.Check(ctx, req) //nolint:wrapcheck // grpc-go's status, answered as is
}

// Watch streams the health of a known service.
func (h knownServiceHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	if !knownHealthService(req.GetService()) {
		return errUnknownHealthService
	}
	return h.Server.Watch(req, stream) //nolint:wrapcheck // grpc-go's status, answered as is
}

// serveGRPC serves envoy.service.ratelimit.v3.RateLimitService, envoy.service.auth.v3.Authorization
// (ext_authz) and grpc.health.v1.Health on addr, within limits (the calls in flight of both
// services counted together), until ctx is done, then stops gracefully: new calls are refused, and
// calls in flight finish, for at most timeout, after which their connections are closed and
// their contexts cancelled. Health turns NOT_SERVING as soon as draining is closed (nil: when
// ctx is done), while calls are still served, so that clients that check health move away
// first. listening, if not nil, is called with the bound address once calls are accepted. opts
// are added to the server's (grpc.Creds for TLS).
func serveGRPC(ctx context.Context, draining <-chan struct{}, addr string, timeout time.Duration, limits grpcLimits,
	e *engine.Engine, log *slog.Logger, listening func(net.Addr), opts ...grpc.ServerOption,
) error {
	limits = limits.withDefaults()
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for grpc: %w", err)
	}
	// Past maxConnections, the listener accepts no more until one closes.
	ln = netutil.LimitListener(ln, limits.maxConnections)
	srv := grpc.NewServer(append(limits.options(), opts...)...)
	envoyrls.Register(srv, envoyrls.New(e, log))
	envoyrls.RegisterAuthorization(srv, extauthz.New(e, log))
	healthSrv := health.NewServer()
	healthSrv.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthSrv.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, knownServiceHealth{healthSrv})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("grpc serving", "grpc_addr", ln.Addr().String())
	if listening != nil {
		listening(ln.Addr())
	}

	select {
	case err := <-served:
		return fmt.Errorf("serve grpc %s: %w", ln.Addr(), err)
	case <-draining:
		healthSrv.Shutdown()
		select {
		case err := <-served:
			return fmt.Errorf("serve grpc %s: %w", ln.Addr(), err)
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
	healthSrv.Shutdown()
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		// Stop closes the connections, which fails the calls for their clients and cancels
		// their contexts, then waits for their handlers: do not wait for one that ignores
		// its context.
		go srv.Stop()
		log.Warn("grpc shutdown timed out", "grpc_addr", ln.Addr().String(), "timeout", timeout.String())
		return fmt.Errorf("shut down grpc %s: calls still in flight after %s were cancelled", ln.Addr(), timeout)
	}
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve grpc %s: %w", ln.Addr(), err)
	}
	return nil
}
