// Command limiterd is the rate-limit decision service: it loads RateLimitPolicies from policy
// files or from the operator's ConfigMaps (kube.go), reloads them when they change, and answers
// decision requests over HTTP.
//
// Usage:
//
//	limiterd --policy-file policies.yaml [--policy-file more.yaml] [flags]
//	limiterd --kubeconfig kubeconfig [--namespace ns] [flags]   (in a pod: neither flag needed)
//	limiterd --version
//
// Run limiterd --help for the flags. It stops gracefully on SIGTERM or SIGINT: /readyz fails at
// once while every API keeps serving for --shutdown-delay; then it stops accepting connections
// and lets in-flight requests finish, for at most --shutdown-timeout. A second signal during
// shutdown kills it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	// Quotas count in the time zones of the tz database: embedded, so that the scratch image,
	// which has no /usr/share/zoneinfo, knows every zone (about 400 KB).
	_ "time/tzdata"

	"github.com/limiterd/limiterd/limiterd/adminauth"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/metrics"
	"github.com/limiterd/limiterd/limiterd/replicastatus"
	"github.com/limiterd/limiterd/limiterd/server"
	"github.com/limiterd/limiterd/limiterd/source"

	"k8s.io/klog/v2"
)

func main() {
	os.Exit(runMain())
}

// runMain runs limiterd until SIGTERM or SIGINT and returns its exit status: 0 once it has
// stopped gracefully, printed its usage for --help or its version for --version, 1 on an error,
// which it prints.
func runMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	context.AfterFunc(ctx, stop) // the first signal starts a graceful shutdown; a second one kills
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "limiterd:", err)
		return 1
	}
	return 0
}

// config is what the flags say.
type config struct {
	// version: print the version and exit.
	version bool
	// topClients: record each policy's heaviest clients for GET /v1/top.
	topClients      bool
	policyFiles     []string
	addr            string
	allowedHosts    []string
	adminAddr       string
	grpcAddr        string
	maxClients      int64
	memory          memoryConfig
	sweepInterval   time.Duration
	logLevel        slog.Level
	shutdownTimeout time.Duration
	shutdownDelay   time.Duration
	legacyHeaders   bool
	http            httpConfig
	store           storeConfig
	reservations    reservationConfig
	kube            kubeConfig
	adminAuth       adminAuthConfig
	tls             tlsFlags
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	if v == "" {
		return errors.New("must not be empty")
	}
	*l = append(*l, v)
	return nil
}

// parseFlags parses the command line; usage and errors go to stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("limiterd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&cfg.version, "version", false, "print the version (module version, VCS revision, Go version) and exit")
	fs.BoolVar(&cfg.topClients, "top-clients", false,
		"record each policy's heaviest clients of the last minutes for GET /v1/top (about 30 ns a decision in memory; off: /v1/top answers 404)")
	fs.Var((*stringList)(&cfg.policyFiles), "policy-file",
		"`path` of a policy file: a YAML stream of RateLimitPolicy documents, watched and reloaded on change (repeatable; at least one)")
	fs.StringVar(&cfg.addr, "addr", ":8080", "`address` of the decisions API")
	fs.Var((*hostNames)(&cfg.allowedHosts), "allowed-hosts",
		"host `names` of the decisions API (comma-separated or repeated): it answers requests to IP addresses, localhost and these names, "+
			"and 421 to any other Host, against DNS rebinding (default: IP addresses and localhost when --addr is loopback only; "+
			"any Host otherwise)")
	fs.StringVar(&cfg.adminAddr, "admin-addr", "", "`address` of the admin API: /metrics, /healthz, /readyz, /v1/policies, /v1/clients "+
		"(default "+defaultAdminAddr+"; "+defaultLoopbackAdminAddr+" with policy files only and no --admin-token-file)")
	fs.StringVar(&cfg.grpcAddr, "grpc-addr", "", "`address` of Envoy's rate-limit service (gRPC envoy.service.ratelimit.v3; empty: disabled)")
	fs.Int64Var(&cfg.maxClients, "max-clients", 1_000_000,
		"most clients whose state is kept in memory, over all policies (0: unbounded); past it the client closest to idle is evicted")
	cfg.memory.register(fs)
	fs.DurationVar(&cfg.sweepInterval, "sweep-interval", 10*time.Second, "how often idle client state is dropped")
	fs.TextVar(&cfg.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info, warn or error")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", 15*time.Second,
		"how long in-flight requests may take to finish once the listeners close, after --shutdown-delay")
	fs.DurationVar(&cfg.shutdownDelay, "shutdown-delay", defaultShutdownDelay,
		"how long every API keeps serving after SIGTERM, with /readyz failing, before the listeners close (0: close at once)")
	fs.BoolVar(&cfg.legacyHeaders, "legacy-ratelimit-headers", false,
		"also answer decisions with X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (Unix seconds), which many clients still read")
	cfg.http.register(fs)
	cfg.store.register(fs)
	cfg.reservations.register(fs)
	cfg.kube.register(fs)
	cfg.adminAuth.register(fs)
	cfg.tls.register(fs)
	if err := fs.Parse(args); err != nil {
		return config{}, fmt.Errorf("parse flags: %w", err) // still flag.ErrHelp for errors.Is after --help
	}
	if cfg.version { // nothing else is checked: --version answers whatever else is given
		return cfg, nil
	}
	if err := cfg.http.check(); err != nil {
		return config{}, err
	}
	if err := cfg.store.check(fs); err != nil {
		return config{}, err
	}
	if err := cfg.kube.check(fs, len(cfg.policyFiles) > 0); err != nil {
		return config{}, err
	}
	if err := cfg.adminAuth.check(&cfg.adminAddr, cfg.kube.enabled); err != nil {
		return config{}, err
	}
	if err := cfg.tls.check(); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	switch {
	case len(cfg.policyFiles) == 0 && !cfg.kube.enabled:
		return config{}, errors.New("no policy source: give --policy-file or --kubeconfig")
	case cfg.maxClients < 0:
		return config{}, errors.New("--max-clients must not be negative")
	case cfg.sweepInterval <= 0:
		return config{}, errors.New("--sweep-interval must be positive")
	case cfg.shutdownTimeout <= 0:
		return config{}, errors.New("--shutdown-timeout must be positive")
	case cfg.shutdownDelay < 0:
		return config{}, errors.New("--shutdown-delay must not be negative")
	}
	return cfg, nil
}

// hooks let tests observe and steer a running daemon.
type hooks struct {
	// listening is called with the bound addresses once both APIs accept connections.
	listening func(decisions, admin net.Addr)
	// wrapDecisions wraps the decisions handler.
	wrapDecisions func(http.Handler) http.Handler
	// klogToLog sends klog's logs (client-go's reflectors, the TLS file reloads) to limiterd's
	// logger. klog's logger is global to the process, so only run, which owns the process, sets
	// it; tests that run several daemons in one process leave klog alone.
	klogToLog bool
}

// run runs limiterd until ctx is done, then shuts it down gracefully. Logs (JSON) and usage go
// to stderr; only --version writes to stdout, the version, and then returns.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.version {
		_, err := fmt.Fprintln(stdout, "limiterd", buildVersion())
		return err
	}
	return serve(ctx, cfg, stderr, hooks{klogToLog: true})
}

// daemon is limiterd's parts, wired by newDaemon. Sources feed the pipeline; stores plug into
// the engine's options; each adds its readiness checks and background loops.
type daemon struct {
	log       *slog.Logger
	metrics   *metrics.Metrics
	engine    *engine.Engine
	pipeline  *source.Pipeline
	adminAuth *adminauth.Auth
	tls       serverTLS
	readiness []server.ReadinessCheck
	// status checks are reported by /readyz?verbose without failing readiness.
	status []server.ReadinessCheck
	// servers serve requests until ctx is done (at the end of the shutdown delay), then stop
	// gracefully within the shutdown timeout, alongside the HTTP servers.
	servers []func(ctx context.Context) error
	// background loops run until ctx is done, which is once every server has stopped.
	background []func(ctx context.Context) error
	// draining is closed, and isDraining set, when shutdown starts.
	draining   chan struct{}
	isDraining atomic.Bool
}

// newDaemon wires limiterd's parts and loads the policies. A policy file that cannot be
// loaded at startup is an error: there is no last good policy to keep serving yet, and serving
// the others would answer "unknown policy" for its policies. Later changes never stop limiterd.
func newDaemon(cfg config, log *slog.Logger) (*daemon, error) {
	budget := limiter.NewBudget(cfg.maxClients, cfg.memory.resolve(log))
	m := metrics.New(budget)
	signer, refundsUnavailable, err := cfg.reservations.engineOptions(cfg.store.kind, log)
	if err != nil {
		return nil, err
	}
	st, err := openStore(cfg.store, log)
	if err != nil {
		return nil, err
	}
	defer st.closeIfUnused()
	tally := replicastatus.NewTally(m) // dry-run rejections per policy generation, for the replica status
	e := engine.New(engine.Options{Budget: budget, Observer: tally, NewStore: st.newStore,
		Reservations: signer, RefundsUnavailable: refundsUnavailable, NoTopClients: !cfg.topClients})
	m.AddLeases(e)
	d := &daemon{
		log:      log,
		metrics:  m,
		engine:   e,
		pipeline: source.NewPipeline(tally.Track(e), source.PipelineOptions{Logger: log, Observer: m, Check: st.check}),
		draining: make(chan struct{}),
	}
	d.readiness = append(d.readiness, server.ReadinessCheck{Name: "shutdown", Check: d.shuttingDown})
	var loadErrs []error
	seen := make(map[string]bool)
	for _, path := range cfg.policyFiles {
		f, err := source.NewFile(path, d.pipeline, source.FileOptions{Logger: log, OnWatch: m.PolicyFileWatched})
		if err != nil {
			return nil, err
		}
		if seen[f.Path()] {
			continue
		}
		seen[f.Path()] = true
		if err := f.Load(); err != nil {
			loadErrs = append(loadErrs, err)
		}
		d.background = append(d.background, f.Watch)
	}
	if err := errors.Join(loadErrs...); err != nil {
		return nil, fmt.Errorf("load policies: %w", err)
	}
	if err := d.addKube(cfg.kube, tally); err != nil {
		return nil, err
	}
	if d.adminAuth, err = cfg.adminAuth.build(cfg.kube, log); err != nil {
		return nil, err
	}
	if err := d.addTLS(cfg.tls); err != nil {
		return nil, err
	}
	if !e.Ready() && !cfg.kube.enabled {
		return nil, errors.New("load policies: no policy loaded")
	}
	d.background = append(d.background, func(ctx context.Context) error {
		sweep(ctx, e, cfg.sweepInterval)
		return nil
	})
	d.addGRPC(cfg)
	d.addStore(st)
	return d, nil
}

// sweep drops idle client state every interval until ctx is done.
func sweep(ctx context.Context, e *engine.Engine, interval time.Duration) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			e.Sweep()
		}
	}
}

// serve runs limiterd with cfg until ctx is done.
func serve(ctx context.Context, cfg config, stderr io.Writer, h hooks) error {
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	if h.klogToLog {
		klog.SetSlogLogger(log)
	}
	d, err := newDaemon(cfg, log)
	if err != nil {
		return err
	}
	decisionsOpts := []server.DecisionsOption{server.WithBodyBudget(int64(cfg.http.maxInflightBodyBytes))}
	if cfg.legacyHeaders {
		decisionsOpts = append(decisionsOpts, server.WithLegacyHeaders())
	}
	if check := decisionsHostCheck(cfg.addr, cfg.allowedHosts); check != nil {
		decisionsOpts = append(decisionsOpts, check)
	} else {
		log.Info("decisions API answers requests to any Host: give --allowed-hosts with the names clients use, against DNS rebinding")
	}
	var decisions http.Handler = server.NewDecisions(d.engine, log, decisionsOpts...)
	if h.wrapDecisions != nil {
		decisions = h.wrapDecisions(decisions)
	}
	admin := server.NewAdmin(d.engine, server.AdminOptions{
		Metrics:         d.metrics.Handler(),
		Auth:            d.adminAuth,
		ReadinessChecks: d.readiness,
		StatusChecks:    d.status,
		Logger:          log,
		Replica:         replicaName(cfg.kube.replicaName),
	})
	decisionsLn, err := listen(ctx, cfg.addr, cfg.http.limit, d.tls.decisions)
	if err != nil {
		return fmt.Errorf("listen for decisions: %w", err)
	}
	// The servers close their listeners when they stop; these Closes matter only on the early
	// returns, whose errors are what to report, so theirs are ignored.
	defer func() { _ = decisionsLn.Close() }()
	adminLn, err := listen(ctx, cfg.adminAddr, cfg.http.limit, d.tls.admin)
	if err != nil {
		return fmt.Errorf("listen for admin: %w", err)
	}
	defer func() { _ = adminLn.Close() }()

	errorLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	servers := []*http.Server{
		cfg.http.server(d.closeWhenDraining(decisions), errorLog),
		cfg.http.server(d.closeWhenDraining(admin), errorLog),
	}
	listeners := []net.Listener{decisionsLn, adminLn}

	bgCtx, stopBackground := context.WithCancel(context.Background())
	defer stopBackground()
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	var background, serving sync.WaitGroup
	failed := make(chan error, len(servers)+len(d.servers)+len(d.background))
	for _, loop := range d.background {
		background.Go(func() {
			if err := loop(bgCtx); err != nil {
				failed <- err
			}
		})
	}
	for _, srv := range d.servers {
		serving.Go(func() {
			if err := srv(serveCtx); err != nil {
				failed <- err
			}
		})
	}
	for i, srv := range servers {
		serving.Go(func() {
			if err := srv.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("serve %s: %w", listeners[i].Addr(), err)
			}
		})
	}
	policies := 0 // ConfigMaps may not be synced yet
	if set := d.engine.Policies(); set != nil {
		policies = set.Len()
	}
	log.Info("limiterd serving", "version", buildVersion(), "addr", decisionsLn.Addr().String(), "admin_addr", adminLn.Addr().String(),
		"policies", policies, "max_clients", cfg.maxClients, "admin_auth", d.adminAuth.Mode())
	if h.listening != nil {
		h.listening(decisionsLn.Addr(), adminLn.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
		runErr = d.drain(cfg.shutdownDelay, failed)
	case runErr = <-failed:
		log.Error("limiterd failed", "error", runErr)
	}
	log.Info("limiterd shutting down", "timeout", cfg.shutdownTimeout.String())
	// Every server stops at once, within one timeout; the background loops (the status
	// Lease, the policy sources, the store) stop after them.
	stopServing()
	shutdownErrs := shutdownHTTP(servers, listeners, cfg.shutdownTimeout)
	serving.Wait()
	stopBackground()
	background.Wait()
	close(failed)
	for err := range failed { // servers and loops that failed while stopping
		shutdownErrs = append(shutdownErrs, err)
	}
	if err := errors.Join(append([]error{runErr}, shutdownErrs...)...); err != nil {
		return err
	}
	log.Info("limiterd stopped")
	return nil
}

// shutdownHTTP closes the servers' listeners and waits for their requests in flight to finish,
// for at most timeout, after which their connections are closed.
func shutdownHTTP(servers []*http.Server, listeners []net.Listener, timeout time.Duration) []error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errs := make([]error, len(servers))
	var shutdowns sync.WaitGroup
	for i, srv := range servers {
		shutdowns.Go(func() {
			if err := srv.Shutdown(ctx); err != nil {
				errs[i] = fmt.Errorf("shut down %s: %w", listeners[i].Addr(), err)
				_ = srv.Close()
			}
		})
	}
	shutdowns.Wait()
	return errs
}

// replicaName names this replica in the admin API's answers: --replica-name (or, with
// Kubernetes, the host name it defaults to), else the host name.
func replicaName(configured string) string {
	if configured != "" {
		return configured
	}
	host, _ := os.Hostname()
	return strings.ToLower(host)
}
