package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// Clock selects the clock decisions are made on.
type Clock uint8

// The clocks.
const (
	// ServerClock decides on the clock of the Redis server that holds the client (TIME in the
	// script): every replica agrees. The now argument of Decide and Peek is ignored.
	ServerClock Clock = iota
	// CallerClock decides on the now argument of Decide and Peek: for tests at fixed instants,
	// or replicas whose clocks are synchronised.
	CallerClock
)

// String returns the clock's flag value.
func (c Clock) String() string {
	if c == CallerClock {
		return "client"
	}
	return "server"
}

// DefaultTimeout bounds a decision's round trips when Options.Timeout is zero.
const DefaultTimeout = 50 * time.Millisecond

// DefaultMaxFlushDelay is limiterd's default Options.MaxFlushDelay (--redis-max-flush-delay): at
// 64 concurrent decisions on one local Redis it cut limiterd's CPU per decision from 17-18 µs to
// 10-12 µs and raised decisions/s by about a fifth (make bench-redis, BenchmarkRedis/store).
const DefaultMaxFlushDelay = 50 * time.Microsecond

// Options configure a Client.
type Options struct {
	// Addrs are host:port addresses: one Redis server, or nodes of a Redis Cluster (detected
	// with CLUSTER SLOTS; the other nodes are discovered), or, when Sentinel.MasterName is set,
	// Redis Sentinels (the others are discovered).
	Addrs []string
	// Sentinel, when its MasterName is set, makes Addrs the addresses of Redis Sentinels that
	// monitor the master of that name: the Client asks them for the master, decides on it
	// alone, and follows it when they fail over to a replica.
	Sentinel SentinelOptions
	// Username and Password authenticate each connection (empty: no AUTH; Username empty with a
	// Password: the default user).
	Username, Password string
	// TLS, when set, is the TLS configuration of every connection.
	TLS *tls.Config
	// Timeout bounds each decision, peek and reset, round trips included (default
	// DefaultTimeout), and each piece of a batch (Store.DecideBatch), with one more Timeout for
	// the requests of a piece sent again (after NOSCRIPT, or to convert state). A call that runs
	// out of time returns an error. Single decisions that start close together share one
	// deadline, so that each costs no timer: such a decision waits at most a sixteenth longer
	// than Timeout, and once sent it waits for its answer even if its caller's context is
	// cancelled (a caller's sooner deadline is kept).
	Timeout time.Duration
	// Clock is the clock decisions are made on (default ServerClock).
	Clock Clock
	// ExpirySlack is added to every key's expiry. With ServerClock it can stay 0; with
	// CallerClock it must cover the skew between the callers' clocks and the real time.
	ExpirySlack time.Duration
	// RejectCache is how many clients each policy's store remembers as rejected, answering
	// them in process until their retry time or until a reset by any replica (0: no cache;
	// otherwise the Client subscribes to ResetChannel).
	RejectCache int
	// MaxFlushDelay lets each connection wait up to this long after writing, so that commands
	// issued meanwhile by other decisions go out in the same write: fewer system calls, and
	// less CPU per decision in limiterd and Redis under load, for at most this much latency
	// (0: write at once). DefaultMaxFlushDelay is the flag's default.
	MaxFlushDelay time.Duration
	// BreakerFailures is how many failures of Redis in a row open the circuit breaker
	// (default DefaultBreakerFailures; negative: it never opens). Only Redis's health counts:
	// a lost connection, an error reply, or a failed health check. A call that times out
	// counts only through the health check it starts (a trivial script within Timeout, one at a
	// time), so that no caller's slow call, however large, opens the breaker for the others.
	// While open, decisions fail at once with ErrBreakerOpen, so that the failure modes answer
	// without waiting for Timeout.
	BreakerFailures int
	// BreakerBackoff is how long the breaker stays open before the next call starts a health
	// check (default DefaultBreakerBackoff); a successful check closes it, each failed one
	// doubles the backoff, up to 8 times BreakerBackoff. After Redis answers again, the
	// breaker closes within the current backoff plus one check (at most 8 × BreakerBackoff +
	// Timeout), given calls that start the check.
	BreakerBackoff time.Duration
	// Logger receives connection events (nil: slog.Default()).
	Logger *slog.Logger

	// rebaseThreshold is where a sliding window's instants or totals are rewritten relative to
	// its oldest entry (0: defaultRebaseThreshold). Tests lower it, each on a Client of its own,
	// so that they exercise rewrites without changing what any other test's Client does.
	rebaseThreshold int64
}

// SentinelOptions say how to reach the master of a Redis Sentinel deployment. Username,
// Password and TLS authenticate the connections to the Redis servers.
type SentinelOptions struct {
	// MasterName is the name the Sentinels monitor the master under (empty: no Sentinel).
	MasterName string
	// Username and Password authenticate each connection to a Sentinel (empty: no AUTH), as
	// the Sentinels' requirepass or ACL users ask.
	Username, Password string
	// TLS, when set, is the TLS configuration of every connection to a Sentinel.
	TLS *tls.Config
}

// sentinelRefreshInterval is how often a Sentinel client asks the Sentinels for the master, on
// top of following their +switch-master messages: a missed message would otherwise leave it on
// the old master for good (rueidis.SentinelOption.TopologyRefreshInterval).
const sentinelRefreshInterval = 5 * time.Second

// Errors of a Client.
var (
	// ErrNotConnected: no connection to Redis was established yet (it is retried in the
	// background).
	ErrNotConnected = errors.New("not connected to redis")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("redis client closed")
	// errInconsistent: the script and the Go code disagree on a decision; a bug.
	errInconsistent = errors.New("script and limiter disagree on admission")
	// errContended: the state of a client kept changing while its conversion was written.
	errContended = errors.New("client state changed during parameter conversion")
)

// maxConversionAttempts bounds the script calls of one decision: the attempts to write a
// converted state, and the calls again with a quota's period at the server's instant.
const maxConversionAttempts = 8

// defaultRebaseThreshold is where a sliding window's instants or totals are rewritten relative
// to its oldest entry, well below 2^53 (Options.rebaseThreshold).
const defaultRebaseThreshold = 1 << 52

// Client is a connection to Redis shared by the stores of every policy. It is safe for
// concurrent use; concurrent calls are pipelined on few connections.
type Client struct {
	opts     Options
	log      *slog.Logger
	slackMS  string
	rebase   string // Options.rebaseThreshold, an argument of every decision
	conn     atomic.Pointer[conn]
	prepared sync.Map // strategy ID (uint64) -> *prepared, while the strategy is in use
	stop     context.CancelFunc
	done     chan struct{} // closed when the connect loop ended
	followed chan struct{} // with Sentinel: closed when followMaster ended
	closed   atomic.Bool
	breaker  *breaker
	waits    *deadlines // bound a single decision's wait (Options.Timeout)

	// Reject caches (invalidate.go), when Options.RejectCache > 0.
	caches         sync.Map // policy ID -> weak.Pointer[rejectCache]
	trust          cacheTrust
	resetsDone     chan struct{} // closed when the reset subscription ended
	cacheHits      atomic.Uint64
	resetsReceived atomic.Uint64
}

// BreakerOpen reports whether the circuit breaker is open: decisions fail at once, without
// calling Redis, until a probe succeeds.
func (c *Client) BreakerOpen() bool { return c.breaker.open() }

// BreakerTrips counts the times the circuit breaker opened.
func (c *Client) BreakerTrips() int64 { return c.breaker.trips.Load() }

type conn struct{ rueidis.Client }

// New returns a client for opts. It connects right away; when Redis cannot be reached it
// logs, keeps trying in the background, and calls fail with ErrNotConnected meanwhile.
func New(opts Options) (*Client, error) {
	if len(opts.Addrs) == 0 {
		return nil, errors.New("redis: no address")
	}
	for _, a := range opts.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("redis: address %q: %w", a, err)
		}
	}
	switch {
	case opts.Timeout < 0:
		return nil, errors.New("redis: negative timeout")
	case opts.ExpirySlack < 0:
		return nil, errors.New("redis: negative expiry slack")
	case opts.MaxFlushDelay < 0:
		return nil, errors.New("redis: negative max flush delay")
	case opts.RejectCache < 0:
		return nil, errors.New("redis: negative reject cache size")
	case opts.BreakerBackoff < 0:
		return nil, errors.New("redis: negative breaker backoff")
	case opts.Clock > CallerClock:
		return nil, fmt.Errorf("redis: unknown clock %d", opts.Clock)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.BreakerFailures == 0 {
		opts.BreakerFailures = DefaultBreakerFailures
	}
	if opts.BreakerBackoff == 0 {
		opts.BreakerBackoff = DefaultBreakerBackoff
	}
	if opts.rebaseThreshold <= 0 {
		opts.rebaseThreshold = defaultRebaseThreshold
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Client{
		opts:    opts,
		log:     opts.Logger,
		slackMS: strconv.FormatInt(ceilMS(opts.ExpirySlack), 10),
		rebase:  strconv.FormatInt(opts.rebaseThreshold, 10),
		stop:    stop,
		done:    make(chan struct{}),
		waits:   newDeadlines(opts.Timeout),
	}
	c.breaker = newBreaker(opts.BreakerFailures, opts.BreakerBackoff, opts.Logger, c.healthCheck)
	connected := true
	if err := c.connect(); err != nil {
		connected = false
		c.log.Warn("redis not reachable, retrying in the background", "addrs", opts.Addrs, "error", err)
		go c.connectLoop(ctx)
	} else {
		close(c.done)
		c.checkEviction(ctx)
		c.preloadScripts(ctx)
	}
	if opts.Sentinel.MasterName != "" {
		c.followed = make(chan struct{})
		go c.followMaster(ctx)
	}
	if opts.RejectCache > 0 {
		c.resetsDone = make(chan struct{})
		started := make(chan struct{})
		go c.subscribeResets(ctx, started)
		if connected { // let the caches answer from the start, unless Redis is slow to
			select {
			case <-started:
			case <-time.After(opts.Timeout):
			}
		}
	}
	return c, nil
}

// connect makes the underlying client. rueidis reconnects by itself once it exists.
func (c *Client) connect() error {
	dialer := net.Dialer{Timeout: max(c.opts.Timeout, time.Second), KeepAlive: time.Second}
	opt := rueidis.ClientOption{
		InitAddress:   c.opts.Addrs,
		Username:      c.opts.Username,
		Password:      c.opts.Password,
		TLSConfig:     c.opts.TLS,
		ClientName:    "limiterd",
		DisableCache:  true,
		MaxFlushDelay: c.opts.MaxFlushDelay,
		Dialer:        dialer,
		// Decisions are not idempotent: never resend one after a network error.
		DisableRetry: true,
		// Keep the topology of a cluster current even without MOVED replies.
		ClusterOption: rueidis.ClusterOption{ShardsRefreshInterval: 10 * time.Second},
	}
	if s := c.opts.Sentinel; s.MasterName != "" {
		// The client then talks to the master alone: Nodes() is the current master, so that
		// Ping, the scripts' preload and the memory check address it, and the reset
		// subscription is on it (a failover closes it, and subscribeResets subscribes on the
		// new master).
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet:               s.MasterName,
			Username:                s.Username,
			Password:                s.Password,
			TLSConfig:               s.TLS,
			ClientName:              "limiterd",
			Dialer:                  dialer,
			TopologyRefreshInterval: sentinelRefreshInterval,
		}
	}
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		if c.opts.Sentinel.MasterName != "" {
			return fmt.Errorf("connect to master %q through sentinels %s: %w", c.opts.Sentinel.MasterName, strings.Join(c.opts.Addrs, ","), err)
		}
		return fmt.Errorf("connect to %s: %w", strings.Join(c.opts.Addrs, ","), err)
	}
	c.conn.Store(&conn{rc})
	return nil
}

// connectLoop retries connect with backoff until it succeeds or ctx is done.
func (c *Client) connectLoop(ctx context.Context) {
	defer close(c.done)
	wait := 100 * time.Millisecond
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		err := c.connect()
		if err == nil {
			c.log.Info("redis connected", "addrs", c.opts.Addrs)
			c.checkEviction(ctx)
			c.preloadScripts(ctx)
			return
		}
		c.log.Debug("redis connect failed", "error", err)
		wait = min(2*wait, 2*time.Second)
		timer.Reset(wait)
	}
}

// Close stops the client: later calls fail with ErrClosed. It waits for nothing in flight.
func (c *Client) Close() {
	if c.closed.Swap(true) {
		return
	}
	c.stop()
	<-c.done
	if c.followed != nil {
		<-c.followed
	}
	if c.resetsDone != nil {
		<-c.resetsDone
	}
	if cn := c.conn.Load(); cn != nil {
		cn.Close()
	}
}

func (c *Client) get() (*conn, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	cn := c.conn.Load()
	if cn == nil {
		return nil, ErrNotConnected
	}
	return cn, nil
}

// masterCheckInterval is how often a Sentinel client looks whether it follows a new master.
const masterCheckInterval = 200 * time.Millisecond

// followMaster, with Sentinel, loads the scripts on each new master the client follows, and
// checks its memory settings, until ctx is done. Redis does not replicate its script cache: right
// after a failover every script would be missing on the new master, and the first call of each
// would take two round trips and a compilation within its timeout (see preloadScripts). The
// master the client connected to is handled by New and connectLoop; the decisions that reach a
// new master before this loop sees it load what they miss themselves.
func (c *Client) followMaster(ctx context.Context) {
	defer close(c.followed)
	ticker := time.NewTicker(masterCheckInterval)
	defer ticker.Stop()
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		cn := c.conn.Load()
		if cn == nil {
			continue
		}
		for addr := range cn.Nodes() { // the master alone
			if last != "" && addr != last {
				c.log.Info("redis sentinel: following a new master", "master", c.opts.Sentinel.MasterName,
					"addr", addr, "previous", last)
				c.checkEviction(ctx)
				c.preloadScripts(ctx)
			}
			last = addr
		}
	}
}

// RecommendedEvictionPolicy is the maxmemory-policy that bounds the memory of client state:
// every key limiterd writes has an expiry, and volatile-ttl evicts the state closest to being
// fresh again, whose loss gives its client back least.
const RecommendedEvictionPolicy = "volatile-ttl"

// preloadScripts loads every script of the store on every node (SCRIPT LOAD), once a
// connection is made, so that no decision pays for it: otherwise the first call of each script
// is answered NOSCRIPT and sent again with its source, which Redis then compiles, two round trips
// and a compilation within the decision's timeout. Right after start-up, on a busy machine, that
// missed the timeout, and the failure mode answered the first decisions (failure mode Local
// admitted them from each replica's memory: 13 admitted against a shared limit of 10). It waits
// at most the connection's dial timeout; a failure is logged, and calls load the scripts
// themselves as before.
func (c *Client) preloadScripts(ctx context.Context) {
	cn, err := c.get()
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max(c.opts.Timeout, time.Second))
	defer cancel()
	if err := loadScripts(ctx, cn, allScripts()); err != nil {
		c.log.Warn("redis scripts not loaded ahead of decisions", "error", err)
	}
}

// checkEviction warns, once a connection is made, about each Redis node whose memory settings
// leave client state unbounded (maxmemory 0: it grows with the number of client keys, which
// callers choose, until the host runs out) or make a full Redis refuse decisions (noeviction:
// every decision's write fails, and the failure modes decide for everyone). A node that does not
// allow CONFIG GET (managed services) is skipped.
func (c *Client) checkEviction(ctx context.Context) {
	cn, err := c.get()
	if err != nil {
		return
	}
	for addr, node := range cn.Nodes() {
		ctx, cancel := context.WithTimeout(ctx, max(c.opts.Timeout, time.Second))
		cfg, err := node.Do(ctx, node.B().ConfigGet().Parameter("maxmemory*").Build()).AsStrMap()
		cancel()
		if err != nil {
			c.log.Debug("redis memory settings not readable", "addr", addr, "error", err)
			continue
		}
		if cfg["maxmemory"] == "0" || cfg["maxmemory-policy"] == "noeviction" {
			c.log.Warn("redis memory of client state unbounded or full redis refusing decisions: set maxmemory and maxmemory-policy "+RecommendedEvictionPolicy,
				"addr", addr, "maxmemory", cfg["maxmemory"], "maxmemory_policy", cfg["maxmemory-policy"])
		}
	}
}

// Ping checks that every Redis node (every master and replica of a cluster; the current master
// with Sentinel) answers, for readiness.
func (c *Client) Ping(ctx context.Context) error {
	cn, err := c.get()
	if err != nil {
		return err
	}
	var errs []error
	for addr, node := range cn.Nodes() {
		if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
			errs = append(errs, fmt.Errorf("ping redis %s: %w", addr, err))
		}
	}
	return errors.Join(errs...)
}

// healthScript is the circuit breaker's health check: a script, not PING, so that it waits
// where decisions wait (a CLIENT PAUSE WRITE holds scripts that may write, and lets PING
// through), and is sent with a key of the call that failed, to that key's node of a cluster.
const healthScript = "return 1"

// healthCheck asks Redis to run a trivial script within Options.Timeout, on the node of key (any
// node if key is ""), for the circuit breaker.
func (c *Client) healthCheck(key string) error {
	cn, err := c.get()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	var cmd rueidis.Completed
	if key == "" {
		cmd = cn.B().Eval().Script(healthScript).Numkeys(0).Build()
	} else { // on the node of the call that started it
		cmd = cn.B().Eval().Script(healthScript).Numkeys(1).Key(key).Build()
	}
	if err := cn.Do(ctx, cmd).Error(); err != nil {
		return fmt.Errorf("redis health check: %w", err)
	}
	return nil
}

// Store returns the store of one policy's clients.
func (c *Client) Store(policyID string) *Store {
	s := &Store{c: c, policy: policyID, prefix: keyPrefix(policyID), lib: &currentLibrary}
	if c.opts.RejectCache > 0 {
		s.cache = c.rejectCacheOf(policyID)
	}
	return s
}

// prepared is what the scripts need of a strategy, formatted once.
type prepared struct {
	fp string
	// token bucket
	rate string
	tau  [3]string // a full refill
	unit [3]string // the interval of one token
	// sliding window; a quota's limit
	limit, window string
	// quota: the bounds of the period last computed, kept while decisions fall in it
	period atomic.Pointer[quotaPeriod]
}

// quotaPeriod is a quota's period: its bounds, Unix seconds, and as the script takes them.
type quotaPeriod struct {
	start, end       int64
	startArg, endArg string
}

// quotaPeriodArgs returns the bounds of q's period that holds at, as the script takes them
// (QT_START, QT_END). Within the period last asked for, they are the ones kept; otherwise they
// are computed (a few time zone lookups) and kept for the next decisions.
func quotaPeriodArgs(q *limiter.Quota, p *prepared, at time.Time) (start, end string) {
	sec := at.Unix()
	if qp := p.period.Load(); qp != nil && qp.start <= sec && sec < qp.end {
		return qp.startArg, qp.endArg
	}
	qp := &quotaPeriod{}
	qp.start, qp.end = q.Period(at)
	qp.startArg, qp.endArg = strconv.FormatInt(qp.start, 10), strconv.FormatInt(qp.end, 10)
	p.period.Store(qp)
	return qp.startArg, qp.endArg
}

func (c *Client) prepare(rl limiter.RateLimiter) *prepared {
	id := rl.ID()
	if p, ok := c.prepared.Load(id); ok {
		return p.(*prepared)
	}
	// The entry goes with its strategy: the map holds the strategies in use (package limiter
	// frees a strategy nothing references), and never keeps one in use itself. IDs are never
	// reused, so an entry is never taken for another strategy's. Two callers racing to prepare
	// one strategy register two cleanups, which delete the same entry.
	p := &prepared{fp: fingerprint(rl)}
	switch rl := rl.(type) {
	case *limiter.TokenBucket:
		capacity, rate, _ := rl.Params()
		p.rate = strconv.FormatInt(rate, 10)
		p.tau = limbs(rl.Interval(capacity))
		p.unit = limbs(rl.Interval(1))
		runtime.AddCleanup(rl, c.forgetPrepared, id)
	case *limiter.SlidingWindow:
		limit, window := rl.Params()
		p.limit, p.window = strconv.FormatInt(limit, 10), strconv.FormatInt(int64(window), 10)
		runtime.AddCleanup(rl, c.forgetPrepared, id)
	case *limiter.Quota:
		p.limit = strconv.FormatInt(rl.Limit(), 10)
		runtime.AddCleanup(rl, c.forgetPrepared, id)
	case *limiter.Concurrency:
		limit, timeout := rl.Params()
		p.limit, p.window = strconv.FormatInt(limit, 10), strconv.FormatInt(int64(timeout), 10)
		runtime.AddCleanup(rl, c.forgetPrepared, id)
	}
	q, _ := c.prepared.LoadOrStore(id, p)
	return q.(*prepared)
}

// forgetPrepared removes the prepared arguments of a strategy the garbage collector freed.
func (c *Client) forgetPrepared(id uint64) { c.prepared.Delete(id) }

// nowArgs returns the scripts' NOW arguments: with CallerClock, now in whole seconds and
// nanoseconds; otherwise "", "" (the scripts read the server's clock).
func (c *Client) nowArgs(now time.Time) (sec, ns string) {
	if c.opts.Clock != CallerClock {
		return "", ""
	}
	s, n := split(now.UnixNano())
	return strconv.FormatInt(s, 10), strconv.FormatInt(n, 10)
}

// stateAtTAT reads a token bucket's state from a script's three TAT integers (seconds,
// nanoseconds, fraction of rl's refill rate), checking their ranges.
func stateAtTAT(rl *limiter.TokenBucket, tat []rueidis.RedisMessage) (limiter.State, error) {
	_, rate, _ := rl.Params()
	ints, err := integers(tat, 3)
	if err == nil && (ints[1] < 0 || ints[1] >= 1e9 || ints[2] < 0 || ints[2] >= rate) {
		err = fmt.Errorf("TAT %v out of range", ints)
	}
	if err != nil {
		return limiter.State{}, err
	}
	return rl.StateAt(ints[0]*1e9+ints[1], uint64(ints[2])), nil
}

// stateful is a limiter whose decision, peek and refund the Go code replays on the state a
// script read: the token bucket and the quota.
type stateful interface {
	Decide(st *limiter.State, at time.Time, cost int64) limiter.Decision
	Peek(st *limiter.State, at time.Time) limiter.Decision
	Refund(st *limiter.State, at time.Time, cost int64) limiter.Decision
}

// applyOn answers a decision, peek or refund (mode) on a token bucket's or a quota's state as
// the script read it at; the script has already applied it to Redis's copy exactly so.
func applyOn[L stateful](rl L, st *limiter.State, at time.Time, cost int64, mode mode) limiter.Decision {
	switch mode {
	case modePeek:
		return rl.Peek(st, at)
	case modeRefund:
		return rl.Refund(st, at, cost)
	case modeDecide:
	}
	return rl.Decide(st, at, cost)
}

// limbs formats a duration of ns + frac/rate nanoseconds as (seconds, ns, frac).
func limbs(ns int64, frac uint64) [3]string {
	s, n := split(ns)
	return [3]string{strconv.FormatInt(s, 10), strconv.FormatInt(n, 10), strconv.FormatUint(frac, 10)}
}

// split returns Unix nanoseconds as whole seconds and nanoseconds in [0, 1e9).
func split(ns int64) (s, n int64) {
	s, n = ns/1e9, ns%1e9
	if n < 0 {
		s, n = s-1, n+1e9
	}
	return s, n
}

// ceilMS returns d in whole milliseconds, rounded up.
func ceilMS(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Store keeps one policy's client state in Redis. It implements limiter.Store.
type Store struct {
	c      *Client
	policy string
	prefix string       // of the policy's keys
	cache  *rejectCache // nil: none
	lib    *library     // the scripts it runs: currentLibrary
}

var _ limiter.Store = (*Store)(nil)

// refunded tells every replica's reject cache, if there is one, to forget a client that a
// refund may let in before its cached retry time.
func (s *Store) refunded(ctx context.Context, key string) {
	if s.cache == nil {
		return
	}
	s.c.trust.epoch.Add(1) // a rejection decided before the refund must not be cached after it
	s.cache.delete(key)
	if cn, err := s.c.get(); err == nil {
		ctx, cancel := context.WithTimeout(ctx, s.c.opts.Timeout)
		defer cancel()
		// The refund is done: a replica that misses the message keeps rejecting the client
		// until its cached retry time at most, which admits nothing extra.
		if err := cn.Do(ctx, cn.B().Publish().Channel(ResetChannel).Message(s.policy+"\x00"+key).Build()).Error(); err != nil {
			s.c.log.Warn("refund not announced to the other replicas' reject caches", "policy", s.policy, "error", err)
		}
	}
}

// Reset implements limiter.Store: it deletes the client's state and that of every limit it has
// state for (LimitKey: all on the client's slot), and, in the same step, publishes the reset on
// ResetChannel, so that every replica's reject cache forgets the client. The cache of this
// process forgets it before Reset returns; other replicas' as soon as the message reaches them.
//
// The limits' keys are found first by limitKeys, a scan of the node that holds the client's
// slot; then one script deletes them all with the client's key. A decision concurrent with the
// reset is therefore wholly before it or wholly after it, except one that writes a limit's state
// for the first time (a name the client had no state for) after the scan passed it: that state
// is kept, as if that limit had been decided after the reset and the others before it, which
// lets the racing request's cost through once more at most. Each round trip is bounded by
// Options.Timeout, the whole reset by ctx only.
//
// The script also writes the client's reset mark (the client's key and resetSuffix): now, kept
// as long as the longest time to live of the states it deleted (a state lives until its units
// have refilled, and the reservations that charged it are valid no longer) and
// limiter.RefundRecordGrace more, for the replicas' clock skew. A refund of a charge made at
// or before now is then void (Refund). now is the caller's clock, the one reservations are
// issued on, whatever the Clock option.
func (s *Store) Reset(ctx context.Context, key string, now time.Time) error {
	now = limiter.ClampInstant(now)
	cn, err := s.c.get()
	if err == nil {
		k := s.key(key)
		var keys []string
		if keys, err = s.limitKeys(ctx, cn, k); err == nil {
			ctx, cancel := context.WithTimeout(ctx, s.c.opts.Timeout)
			defer cancel()
			keys = append([]string{k + resetSuffix, k}, keys...)
			sec, ns := split(now.UnixNano())
			err = resetScript.lua.Exec(ctx, cn, keys, []string{ResetChannel, s.policy + "\x00" + key,
				strconv.FormatInt(sec, 10), strconv.FormatInt(ns, 10),
				strconv.FormatInt(ceilMS(limiter.RefundRecordGrace), 10)}).Error()
		}
	}
	if s.cache != nil {
		s.c.trust.epoch.Add(1) // a rejection decided before the reset must not be cached after it
		s.cache.delete(key)
	}
	if err != nil {
		return fmt.Errorf("redis store: policy %s: reset: %w", s.policy, err)
	}
	return nil
}

// resetScanCount is how many keys each step of limitKeys asks Redis to visit (SCAN's COUNT):
// a step holds its node for well under a millisecond, and a node of a million keys takes a
// thousand steps.
const resetScanCount = 1000

// limitKeys returns the keys of the limits of the client whose key is k (LimitKey with a name
// other than limiter.DefaultLimitName): those of the loaded policy's limits and of limits a
// policy edit removed alike. The keys of a client's limits are k, ':' and a name, on k's slot:
// each step of the scan is a script sent with k (resetscan.lua), so it runs on the node holding
// that slot, the only one to scan. The scan visits every key of that node, in steps of
// resetScanCount: a reset is an admin operation, rare, and a cheaper index would cost every
// decision a write. Nothing on the decision path is slower.
//
// The pattern is k with its glob characters escaped, then ":*". Since escape leaves no '}' in a
// client key, the first '}' after the policy ends the client key, so a key beginning with k+":"
// is one of this client's limits and of no other client's, however keys are crafted; the prefix
// is checked again in Go. A refund's record (k, "#refund:", an ID) and the reset mark (k,
// resetSuffix) are not limits: the record stays, the mark is rewritten by the reset itself.
// A slot that moves to another node during the scan may make the scan miss keys (the cursor is
// the old node's): a reset retried after the move finds them.
func (s *Store) limitKeys(ctx context.Context, cn *conn, k string) ([]string, error) {
	prefix := k + ":"
	pattern := globEscape(k) + ":*"
	count := strconv.Itoa(resetScanCount)
	var keys []string
	for cursor := "0"; ; {
		step, cancel := context.WithTimeout(ctx, s.c.opts.Timeout)
		r, err := resetScanScript.lua.Exec(step, cn, []string{k}, []string{cursor, pattern, count}).ToArray()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("scan for the client's limits: %w", err)
		}
		if len(r) != 2 {
			return nil, fmt.Errorf("scan for the client's limits: %d values in a SCAN reply", len(r))
		}
		if cursor, err = r[0].ToString(); err != nil {
			return nil, fmt.Errorf("scan for the client's limits: cursor: %w", err)
		}
		found, err := r[1].AsStrSlice()
		if err != nil {
			return nil, fmt.Errorf("scan for the client's limits: keys: %w", err)
		}
		for _, f := range found {
			if strings.HasPrefix(f, prefix) {
				keys = append(keys, f)
			}
		}
		if cursor == "0" {
			return keys, nil
		}
	}
}

// globEscape returns s with the characters special in a Redis glob pattern ('*', '?', '[',
// ']' and '\') escaped by a backslash, so that the pattern matches s literally.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func (s *Store) key(client string) string { return s.prefix + keySuffix(client) }

// throughBreaker runs a decision's script calls within the timeout, through the circuit
// breaker; key is the client's key, whose node a health check asks after a failure. A call the
// caller gave up on (ctx done) says nothing of Redis's health, nor does a timeout by itself (see
// breaker).
func (s *Store) throughBreaker(ctx context.Context, key string, run func(context.Context) (limiter.Decision, error)) (limiter.Decision, error) {
	if err := s.c.breaker.allow(); err != nil {
		return limiter.Decision{}, err
	}
	timed, cancel := s.c.waits.context(ctx)
	defer cancel()
	d, err := run(timed)
	if err == nil {
		s.c.breaker.done(succeeded, "")
	} else {
		s.c.breaker.done(classify(ctx, err), s.key(key))
	}
	return d, err
}

// tokenBucketCost returns the interval of cost tokens as the script takes it: seconds "" when
// the cost exceeds the capacity (never admitted), a full refill for a refund of the capacity or
// more.
func tokenBucketCost(rl *limiter.TokenBucket, p *prepared, cost int64, mode mode) [3]string {
	capacity, _, _ := rl.Params()
	switch {
	case mode == modeRefund && cost >= capacity:
		return p.tau // a refund of the capacity or more fills any bucket
	case cost > capacity:
		return [3]string{}
	case cost != 1:
		return limbs(rl.Interval(cost))
	}
	return p.unit
}

// parseState returns the state a token bucket (parseTokenBucketState) or a quota
// (parseQuotaState) wrote, or a fresh state and false when no known strategy wrote it: what
// another strategy converts.
func parseState(raw string) (limiter.State, bool) {
	if st, ok := parseQuotaState(raw); ok {
		return st, true
	}
	return parseTokenBucketState(raw)
}

// parseQuotaState returns the state a quota wrote as "<fingerprint> <end> <used>" (the end of
// its period, Unix seconds), or a fresh state and false when no known quota wrote it.
func parseQuotaState(raw string) (limiter.State, bool) {
	f := strings.Fields(raw)
	if len(f) != 3 || !strings.HasPrefix(f[0], "qt:") {
		return limiter.State{}, false
	}
	old, err := parseFingerprint(f[0])
	q, ok := old.(*limiter.Quota)
	if err != nil || !ok {
		return limiter.State{}, false
	}
	end, err1 := strconv.ParseInt(f[1], 10, 64)
	used, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || used < 0 || used > limiter.MaxQuotaLimit ||
		end > math.MaxInt64/int64(time.Second) || end < math.MinInt64/int64(time.Second) {
		return limiter.State{}, false
	}
	return q.StateAt(end*int64(time.Second), used), true
}

// parseTokenBucketState returns the state a token bucket wrote as "<fingerprint> <s> <ns>
// <frac>", or a fresh state and false when no known token bucket wrote it.
func parseTokenBucketState(raw string) (limiter.State, bool) {
	f := strings.Fields(raw)
	if len(f) != 4 {
		return limiter.State{}, false
	}
	old, err := parseFingerprint(f[0])
	tb, ok := old.(*limiter.TokenBucket)
	if err != nil || !ok {
		return limiter.State{}, false
	}
	_, rate, _ := tb.Params()
	sec, err1 := strconv.ParseInt(f[1], 10, 64)
	ns, err2 := strconv.ParseInt(f[2], 10, 64)
	frac, err3 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || ns < 0 || ns >= 1e9 || frac >= uint64(rate) ||
		sec > math.MaxInt64/int64(time.Second)-1 || sec < math.MinInt64/int64(time.Second)+1 {
		return limiter.State{}, false
	}
	return tb.StateAt(sec*1e9+ns, frac), true
}

// integers reads the first n elements of a script's answer as integers.
func integers(arr []rueidis.RedisMessage, n int) ([]int64, error) {
	if len(arr) < n {
		return nil, fmt.Errorf("%d elements, want at least %d", len(arr), n)
	}
	out := make([]int64, n)
	for i := range out {
		v, err := arr[i].AsInt64()
		if err != nil {
			return nil, fmt.Errorf("element %d: %w", i, err)
		}
		out[i] = v
	}
	return out, nil
}
