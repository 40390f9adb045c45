// Package redistest runs real redis-server processes for tests: a single server, a Redis
// Cluster, or a master with replicas and Sentinels, on free loopback ports, in temporary directories, killed when the test ends.
//
// redis-server and redis-cli come from Debian's redis-server and redis-tools (.ci/run installs
// them). A test that needs them fails when they are missing, and is skipped under -short (see
// internal/testbin).
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testbin"
)

// startDeadline bounds how long a server may take to accept connections.
const startDeadline = 15 * time.Second

// Available reports whether redis-server and redis-cli are installed.
func Available() error {
	for _, p := range []testbin.Program{testbin.RedisServer, testbin.RedisCLI} {
		if _, err := p.Path(); err != nil {
			return err
		}
	}
	return nil
}

// Require ends the test unless redis-server and redis-cli are installed: skipped under -short,
// failed otherwise.
func Require(t testing.TB) {
	t.Helper()
	testbin.Need(t, testbin.RedisServer)
	testbin.Need(t, testbin.RedisCLI)
}

// Server is a redis-server process.
type Server struct {
	dir  string
	port int
	args []string
	auth string // the password Do sends

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil while stopped
	exited chan struct{} // closed when cmd has exited
}

// Start runs a redis-server on a free loopback port until the test ends. extra are more
// redis-server arguments ("--cluster-enabled", "yes", ...).
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	Require(t)
	s, err := New(extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// New runs a redis-server on a free loopback port, in a temporary directory, until Close.
func New(extra ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest")
	if err != nil {
		return nil, fmt.Errorf("redis-server directory: %w", err)
	}
	s := &Server{dir: dir}
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before redis binds it
		if s.port, err = freePort(); err != nil {
			break
		}
		s.args = append([]string{
			"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
			"--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning",
			"--logfile", filepath.Join(s.dir, "redis.log"),
		}, extra...)
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, err
}

// Close kills the server and removes its directory.
func (s *Server) Close() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}

// FreePort returns a loopback port that was free a moment ago, for a server's extra listener
// (--tls-port, say).
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func freePort() (int, error) {
	ln, err := new(net.ListenConfig).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

func (s *Server) start() error {
	cmd := exec.CommandContext(context.Background(), "redis-server", s.args...) // ended by kill
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	deadline := time.Now().Add(startDeadline)
	for {
		if err := ping(s.Addr()); err == nil {
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server on port %d exited: %w\n%s", s.port, waitErr, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer within %v", s.port, startDeadline)
		}
	}
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	return nil
}

// ping sends PING and expects PONG.
func ping(addr string) error {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(context.Background(), "tcp", addr)
	if err != nil {
		return fmt.Errorf("dial redis: %w", err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return fmt.Errorf("send PING: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read PING answer: %w", err)
	}
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") { // up, with a password
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Stop kills the server (SIGKILL) and waits until it has exited: its data is lost, as it has no
// persistence.
func (s *Server) Stop() { s.kill() }

func (s *Server) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Restart starts a stopped server again on the same port.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	var err error
	for attempt := 0; attempt < 50; attempt++ { // the port may linger briefly
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal(err)
}

// Pause stops the server process (SIGSTOP): connections stay open and nothing answers.
func (s *Server) Pause(t testing.TB) { s.signal(t, syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) { s.signal(t, syscall.SIGCONT) }

func (s *Server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		t.Fatal("redis-server is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Do runs one command with redis-cli against the server and returns its raw output, trimmed.
func (s *Server) Do(t testing.TB, args ...string) string {
	t.Helper()
	base := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.port)}
	if s.auth != "" {
		base = append(base, "--no-auth-warning", "-a", s.auth)
	}
	return CLI(t, append(base, args...)...)
}

// CLI runs redis-cli with args and returns its output, trimmed; it fails the test on error.
func CLI(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "redis-cli", args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), stderr.String())
	}
	return strings.TrimSpace(out.String())
}

// Info returns one field of an INFO section (e.g. Info(t, "commandstats", "cmdstat_evalsha")),
// or "" when the section has no such field.
func (s *Server) Info(t testing.TB, section, field string) string {
	t.Helper()
	for _, line := range strings.Split(s.Do(t, "INFO", section), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Server
}

// StartCluster runs a Redis Cluster of n masters (at least 3) on loopback until the test ends,
// and waits until every node reports the cluster ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	Require(t)
	c := &Cluster{}
	addrs := make([]string, n)
	for i := range n {
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
		c.Nodes = append(c.Nodes, s)
		addrs[i] = s.Addr()
	}
	CLI(t, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...)
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		for !strings.Contains(s.Do(t, "CLUSTER", "INFO"), "cluster_state:ok") {
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ok:\n%s", s.Addr(), s.Do(t, "CLUSTER", "INFO"))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr()
	}
	return out
}

// Sentinels are a master, its replicas and the Redis Sentinels that monitor it, on loopback.
type Sentinels struct {
	// Name is the name the Sentinels monitor the master under.
	Name      string
	Master    *Server
	Replicas  []*Server
	Sentinels []*Server
}

// SentinelConfig shapes StartSentinels.
type SentinelConfig struct {
	Name                string        // the master's name (default "mymaster")
	Replicas, Sentinels int           // how many of each (default 1 and 3)
	Quorum              int           // Sentinels that must agree the master is down (default a majority)
	DownAfter           time.Duration // down-after-milliseconds (default 1 s)
	FailoverTimeout     time.Duration // failover-timeout (default 3 s)
	// SentinelPassword, when set, is the Sentinels' requirepass: clients and the other
	// Sentinels authenticate with it.
	SentinelPassword string
}

// StartSentinels runs a master, its replicas and Sentinels monitoring it until the test ends, and
// waits until every replica is in sync and every Sentinel knows the replicas and the other
// Sentinels, so that a failover can start as soon as the master fails.
func StartSentinels(t testing.TB, cfg SentinelConfig) *Sentinels {
	t.Helper()
	Require(t)
	if cfg.Name == "" {
		cfg.Name = "mymaster"
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Sentinels == 0 {
		cfg.Sentinels = 3
	}
	if cfg.Quorum == 0 {
		cfg.Quorum = cfg.Sentinels/2 + 1
	}
	if cfg.DownAfter == 0 {
		cfg.DownAfter = time.Second
	}
	if cfg.FailoverTimeout == 0 {
		cfg.FailoverTimeout = 3 * time.Second
	}
	g := &Sentinels{Name: cfg.Name, Master: Start(t)}
	for range cfg.Replicas {
		g.Replicas = append(g.Replicas, Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(g.Master.Port())))
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, r := range g.Replicas {
		for r.Info(t, "replication", "master_link_status") != "up" {
			if time.Now().After(deadline) {
				t.Fatalf("replica %s not in sync with master %s", r.Addr(), g.Master.Addr())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for range cfg.Sentinels {
		s, err := newSentinel(g.Master.Port(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		g.Sentinels = append(g.Sentinels, s)
	}
	for _, s := range g.Sentinels {
		for {
			master := s.Do(t, "SENTINEL", "MASTER", cfg.Name)
			if fieldOf(master, "num-slaves") == strconv.Itoa(cfg.Replicas) &&
				fieldOf(master, "num-other-sentinels") == strconv.Itoa(cfg.Sentinels-1) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sentinel %s does not know the deployment:\n%s", s.Addr(), master)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return g
}

// fieldOf returns the value after the line name in redis-cli's output of a flat map (one key or
// value a line), or "".
func fieldOf(out, name string) string {
	lines := strings.Split(out, "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		if strings.TrimSpace(lines[i]) == name {
			return strings.TrimSpace(lines[i+1])
		}
	}
	return ""
}

// newSentinel runs a Sentinel monitoring the master on masterPort, until Close.
func newSentinel(masterPort int, cfg SentinelConfig) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-sentinel")
	if err != nil {
		return nil, fmt.Errorf("sentinel directory: %w", err)
	}
	s := &Server{dir: dir}
	conf := filepath.Join(dir, "sentinel.conf")
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before redis binds it
		if s.port, err = freePort(); err != nil {
			break
		}
		// Sentinel rewrites its configuration file: each attempt writes it anew.
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nlogfile %s\nloglevel notice\n"+
			"sentinel monitor %s 127.0.0.1 %d %d\nsentinel down-after-milliseconds %[4]s %[7]d\n"+
			"sentinel failover-timeout %[4]s %[8]d\nsentinel parallel-syncs %[4]s 1\n",
			s.port, dir, filepath.Join(dir, "redis.log"), cfg.Name, masterPort, cfg.Quorum,
			cfg.DownAfter.Milliseconds(), cfg.FailoverTimeout.Milliseconds())
		if cfg.SentinelPassword != "" {
			text += fmt.Sprintf("requirepass %q\n", cfg.SentinelPassword)
			s.auth = cfg.SentinelPassword
		}
		if err = os.WriteFile(conf, []byte(text), 0o600); err != nil {
			break
		}
		s.args = []string{conf, "--sentinel"}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, err
}

// MasterAddr returns the master's host:port as the first Sentinel reports it.
func (g *Sentinels) MasterAddr(t testing.TB) string {
	t.Helper()
	out := strings.Fields(g.Sentinels[0].Do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.Name))
	if len(out) != 2 {
		t.Fatalf("sentinel %s: master %s: %q", g.Sentinels[0].Addr(), g.Name, out)
	}
	return net.JoinHostPort(out[0], out[1])
}

// SentinelAddrs returns the Sentinels' addresses.
func (g *Sentinels) SentinelAddrs() []string {
	out := make([]string, len(g.Sentinels))
	for i, s := range g.Sentinels {
		out[i] = s.Addr()
	}
	return out
}
