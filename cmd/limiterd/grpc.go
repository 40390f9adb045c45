package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/envoyrls"
)

// addGRPC adds Envoy's rate-limit service on cfg.grpcAddr to d's background loops, unless the
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
		return serveGRPC(ctx, d.draining, cfg.grpcAddr, cfg.shutdownTimeout, d.engine, d.log, nil, opts...)
	})
}

// serveGRPC serves envoy.service.ratelimit.v3.RateLimitService and grpc.health.v1.Health on
// addr until ctx is done, then stops gracefully: new calls are refused, and calls in flight
// finish, for at most timeout, after which their connections are closed and their contexts
// cancelled. Health turns NOT_SERVING as soon as draining is closed (nil: when ctx is done),
// while calls are still served, so that clients that check health move away first.
// listening, if not nil, is called with the bound address once calls are accepted. opts are
// added to the server's (grpc.Creds for TLS).
func serveGRPC(ctx context.Context, draining <-chan struct{}, addr string, timeout time.Duration, e *engine.Engine, log *slog.Logger,
	listening func(net.Addr), opts ...grpc.ServerOption,
) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for grpc: %w", err)
	}
	srv := grpc.NewServer(append(append([]grpc.ServerOption{
		// Envoy may keep idle connections alive with HTTP/2 pings; accept them every 10 s rather
		// than answering GOAWAY "too_many_pings" under gRPC's 5-minute default.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}, envoyrls.ServerOptions()...), opts...)...)
	rlsv3.RegisterRateLimitServiceServer(srv, envoyrls.New(e, log))
	healthSrv := health.NewServer()
	healthpb.RegisterHealthServer(srv, healthSrv)
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
