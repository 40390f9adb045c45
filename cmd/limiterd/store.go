package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/server"
	redisstore "github.com/limiterd/limiterd/limiterd/store/redis"
)

// passwordEnv holds the Redis password when --redis-password-file is not given.
const passwordEnv = "LIMITERD_REDIS_PASSWORD"

// sentinelPasswordEnv holds the Sentinels' password when --redis-sentinel-password-file is not
// given.
const sentinelPasswordEnv = "LIMITERD_REDIS_SENTINEL_PASSWORD"

// storeConfig is what the store flags say: where client state is kept.
type storeConfig struct {
	kind         string // memory or redis
	redisAddrs   []string
	passwordFile string
	tls          bool
	caFile       string
	certFile     string
	keyFile      string
	serverName   string
	timeout      time.Duration
	clock        string
	rejectCache  int
	flushDelay   time.Duration

	// Sentinel: the master's name, the Sentinels' addresses and password file.
	sentinelMaster       string
	sentinelAddrs        []string
	sentinelPasswordFile string
}

// addrList is a repeatable flag of comma-separated addresses.
type addrList []string

func (l *addrList) String() string { return strings.Join(*l, ",") }

func (l *addrList) Set(v string) error {
	for _, a := range strings.Split(v, ",") {
		if a = strings.TrimSpace(a); a == "" {
			return errors.New("empty address")
		}
		*l = append(*l, strings.TrimSpace(a))
	}
	return nil
}

// register adds the store flags to fs.
func (c *storeConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kind, "store", "memory",
		"where client state is kept: memory (this process only) or redis (shared by every replica)")
	fs.Var((*addrList)(&c.redisAddrs), "redis-addr",
		"Redis `host:port`: one server, or nodes of a Redis Cluster (comma-separated or repeated)")
	fs.StringVar(&c.passwordFile, "redis-password-file", "",
		"`path` of a file holding the Redis password (default: $"+passwordEnv+", if set)")
	fs.StringVar(&c.sentinelMaster, "redis-sentinel-master", "",
		"`name` of the master the Redis Sentinels of --redis-sentinel-addr monitor: limiterd decides on that master and follows its failovers")
	fs.Var((*addrList)(&c.sentinelAddrs), "redis-sentinel-addr",
		"Redis Sentinel `host:port` (comma-separated or repeated; the others are discovered), with --redis-sentinel-master, instead of --redis-addr")
	fs.StringVar(&c.sentinelPasswordFile, "redis-sentinel-password-file", "",
		"`path` of a file holding the Redis Sentinels' password (default: $"+sentinelPasswordEnv+", if set; "+
			"the --redis-tls* flags apply to the Sentinels too)")
	fs.BoolVar(&c.tls, "redis-tls", false, "connect to Redis with TLS (implied by the other --redis-tls-* and file flags)")
	fs.StringVar(&c.caFile, "redis-ca-file", "", "`path` of the PEM CA bundle that verifies Redis (default: the system's)")
	fs.StringVar(&c.certFile, "redis-cert-file", "", "`path` of the PEM client certificate for Redis (with --redis-key-file)")
	fs.StringVar(&c.keyFile, "redis-key-file", "", "`path` of the PEM client key for Redis (with --redis-cert-file)")
	fs.StringVar(&c.serverName, "redis-tls-server-name", "", "`name` Redis's certificate must carry (default: the address's host)")
	fs.DurationVar(&c.timeout, "store-timeout", redisstore.DefaultTimeout,
		"most a decision waits for the store; past it the policy's failureMode decides")
	fs.StringVar(&c.clock, "redis-clock", "server",
		"clock decisions are made on: server (Redis TIME: replicas agree) or client (this host's; needs synchronised clocks)")
	fs.DurationVar(&c.flushDelay, "redis-max-flush-delay", redisstore.DefaultMaxFlushDelay,
		"most a Redis connection waits after a write to send more decisions' commands in the next one: "+
			"less CPU under load for at most this much latency (0: write at once)")
	fs.IntVar(&c.rejectCache, "redis-local-reject-cache", 0,
		"clients per policy whose rejection this process remembers, answering them without Redis until their retry time (0: none)")
}

// check validates the store flags after parsing.
func (c *storeConfig) check(fs *flag.FlagSet) error {
	switch c.kind {
	case "memory":
		var redisFlags []string
		fs.Visit(func(f *flag.Flag) {
			if strings.HasPrefix(f.Name, "redis-") || f.Name == "store-timeout" {
				redisFlags = append(redisFlags, "--"+f.Name)
			}
		})
		if len(redisFlags) > 0 {
			return fmt.Errorf("%s need --store redis", strings.Join(redisFlags, ", "))
		}
		return nil
	case "redis":
	default:
		return fmt.Errorf("--store must be memory or redis, got %q", c.kind)
	}
	switch {
	case len(c.redisAddrs) > 0 && len(c.sentinelAddrs) > 0:
		return errors.New("--redis-addr and --redis-sentinel-addr exclude each other: " +
			"give the Redis servers, or the Sentinels that name the master")
	case len(c.sentinelAddrs) > 0 && c.sentinelMaster == "":
		return errors.New("--redis-sentinel-addr needs --redis-sentinel-master, the name the Sentinels monitor the master under")
	case c.sentinelMaster != "" && len(c.sentinelAddrs) == 0:
		return errors.New("--redis-sentinel-master needs --redis-sentinel-addr, the Sentinels' addresses")
	case c.sentinelPasswordFile != "" && c.sentinelMaster == "":
		return errors.New("--redis-sentinel-password-file needs --redis-sentinel-master and --redis-sentinel-addr")
	case len(c.redisAddrs) == 0 && len(c.sentinelAddrs) == 0:
		return errors.New("--store redis needs --redis-addr (a server or Cluster nodes) or --redis-sentinel-addr with --redis-sentinel-master")
	case c.timeout <= 0:
		return errors.New("--store-timeout must be positive")
	case c.clock != "server" && c.clock != "client":
		return fmt.Errorf("--redis-clock must be server or client, got %q", c.clock)
	case c.rejectCache < 0:
		return errors.New("--redis-local-reject-cache must not be negative")
	case c.flushDelay < 0:
		return errors.New("--redis-max-flush-delay must not be negative")
	case (c.certFile == "") != (c.keyFile == ""):
		return errors.New("--redis-cert-file and --redis-key-file go together")
	}
	return nil
}

// openedStore is the store limiterd decides on, ready to plug into the engine and the daemon.
type openedStore struct {
	// newStore returns a policy's store (nil: the engine's memory stores).
	newStore func(policyID v1alpha1.PolicyID) limiter.Store
	// check refuses a compiled policy the store cannot decide (nil: it decides every policy):
	// the pipeline rejects it as an invalid one (source.PipelineOptions.Check).
	check func(*policy.Policy) error
	// redis is the Redis client, nil for the memory store.
	redis   *redisstore.Client
	close   func()
	adopted bool
}

// storeHealthInterval is how often limiterd pings a shared store for limiterd_store_up.
const storeHealthInterval = 5 * time.Second

// openStore connects the configured store. Redis is connected in the background when it
// cannot be reached yet: limiterd starts, reports not ready, and applies the failure modes.
func openStore(c storeConfig, log *slog.Logger) (*openedStore, error) {
	if c.kind != "redis" {
		return &openedStore{close: func() {}}, nil
	}
	opts := redisstore.Options{
		Addrs:         c.redisAddrs,
		Sentinel:      redisstore.SentinelOptions{MasterName: c.sentinelMaster},
		Timeout:       c.timeout,
		RejectCache:   c.rejectCache,
		MaxFlushDelay: c.flushDelay,
		Logger:        log,
	}
	if c.clock == "client" {
		// Keys outlive their state by a second, so that replicas whose clocks lag a little
		// still find it.
		opts.Clock, opts.ExpirySlack = redisstore.CallerClock, time.Second
	}
	var err error
	if opts.Password, err = redisPassword(c.passwordFile); err != nil {
		return nil, err
	}
	if opts.TLS, err = redisTLS(c); err != nil {
		return nil, err
	}
	if c.sentinelMaster != "" {
		opts.Addrs = c.sentinelAddrs
		if opts.Sentinel.Password, err = readPassword(c.sentinelPasswordFile, sentinelPasswordEnv, "--redis-sentinel-password-file"); err != nil {
			return nil, err
		}
		if opts.TLS != nil {
			opts.Sentinel.TLS = opts.TLS.Clone()
		}
	}
	client, err := redisstore.New(opts)
	if err != nil {
		return nil, fmt.Errorf("redis store: %w", err)
	}
	log.Info("store", "kind", "redis", "addrs", opts.Addrs, "sentinel_master", c.sentinelMaster, "clock", opts.Clock.String(),
		"timeout", c.timeout.String(), "tls", opts.TLS != nil, "reject_cache", c.rejectCache)
	return &openedStore{
		newStore: func(policyID v1alpha1.PolicyID) limiter.Store { return client.Store(policyID.String()) },
		redis:    client,
		close:    client.Close,
	}, nil
}

// closeIfUnused closes a store that no daemon adopted (newDaemon failed).
func (s *openedStore) closeIfUnused() {
	if !s.adopted {
		s.close()
	}
}

// redisMetrics is what package metrics reads of a Redis client (metrics.SharedStore).
type redisMetrics struct{ *redisstore.Client }

// RejectCacheCounts returns the counters of the client's reject caches.
func (r redisMetrics) RejectCacheCounts() (hits, resetsReceived uint64) {
	s := r.RejectCacheStats()
	return s.Hits, s.ResetsReceived
}

// addStore reports the store's health, and closes the store when the daemon's background loops
// stop. A shared store's health is a status check of /readyz?verbose and metrics, never a
// readiness check: during an outage the replica still answers every decision as its policies'
// failure modes say, so it must stay in its Services for them to apply.
func (d *daemon) addStore(s *openedStore) {
	s.adopted = true
	if c := s.redis; c != nil {
		d.status = append(d.status, server.ReadinessCheck{Name: "store", Check: c.Ping})
		up := d.metrics.AddSharedStore(redisMetrics{c}, storeHealthInterval)
		d.background = append(d.background, func(ctx context.Context) error {
			pingLoop(ctx, c.Ping, up, d.log)
			return nil
		})
	}
	d.background = append(d.background, func(ctx context.Context) error {
		<-ctx.Done()
		s.close()
		return nil
	})
}

// pingLoop reports ping's outcome to up every storeHealthInterval until ctx is done, logging
// changes.
func pingLoop(ctx context.Context, ping func(context.Context) error, up func(bool), log *slog.Logger) {
	ticker := time.NewTicker(storeHealthInterval)
	defer ticker.Stop()
	wasUp := true
	for {
		pingCtx, cancel := context.WithTimeout(ctx, server.DefaultReadinessTimeout)
		err := ping(pingCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		up(err == nil)
		switch {
		case err != nil && wasUp:
			log.Warn("store unreachable: policies' failure modes apply", "error", err)
		case err == nil && !wasUp:
			log.Info("store reachable again")
		}
		wasUp = err == nil
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// redisPassword reads the password from path, or from the environment when path is empty.
func redisPassword(path string) (string, error) {
	return readPassword(path, passwordEnv, "--redis-password-file")
}

// readPassword reads a password from path (given by flag), or from the environment variable env
// when path is empty.
func readPassword(path, env, flag string) (string, error) {
	if path == "" {
		return os.Getenv(env), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", flag, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// redisTLS returns the TLS configuration the flags ask for (nil: plain TCP).
func redisTLS(c storeConfig) (*tls.Config, error) {
	if !c.tls && c.caFile == "" && c.certFile == "" && c.serverName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.serverName}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("read --redis-ca-file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-ca-file %s: no PEM certificate", c.caFile)
		}
	}
	if c.certFile != "" {
		cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			return nil, fmt.Errorf("load --redis-cert-file and --redis-key-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
