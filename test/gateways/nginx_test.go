// Package gateways runs real gateways in front of limiterd's forward-auth endpoint, with the
// configurations shipped in docs/gateways.
package gateways

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/server"
)

// budget is the policy's burst: a client gets exactly this many requests through.
const budget = 3

// shopPolicy is the policy shop/api the shipped configurations name: a burst of budget per
// client address, one more a minute.
func shopPolicy() *v1alpha1.RateLimitPolicy {
	hops := int32(1)
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "shop"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "per-client",
			Tiers:       []v1alpha1.Tier{testsupport.TokenBucketTier("per-client", budget, 1, time.Minute)},
			Gateway: &v1alpha1.Gateway{KeySources: []v1alpha1.KeySource{
				{Type: v1alpha1.KeySourceClientAddress, TrustedHops: &hops},
			}},
		},
	}
}

// needNginx returns nginx's path. Without nginx the test is skipped on a developer's machine
// and fails under CI, where .ci/run installs it.
func needNginx(t *testing.T) string {
	t.Helper()
	if _, err := testbin.Nginx.Path(); err != nil && os.Getenv("CI") == "" {
		t.Skipf("%v (CI is not set)", err)
	}
	return testbin.Need(t, testbin.Nginx)
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startNginx runs nginx on a loopback port with docs/gateways/nginx.conf as its server's
// configuration, limiterd at limiterdAddr and the application at appAddr, and returns its
// base URL.
func startNginx(t *testing.T, limiterdAddr, appAddr string) string {
	t.Helper()
	bin := needNginx(t)
	shipped, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways", "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	locations := strings.ReplaceAll(string(shipped), "limiterd.limiterd.svc:8080", limiterdAddr)
	if locations == string(shipped) {
		t.Fatal("docs/gateways/nginx.conf no longer names limiterd.limiterd.svc:8080")
	}
	dir := t.TempDir()
	port := freePort(t)
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    upstream app { server %[2]s; }
    server {
        listen 127.0.0.1:%[3]d;
%[4]s
    }
}
`, dir, appAddr, port, locations)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", confPath)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx output:\n%s\nerror.log:\n%s", out, log)
		}
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx exited: %v\n%s\n%s", err, out, log)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx does not listen on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// clientFrom returns an HTTP client whose connections come from the loopback address local,
// so that the test has several client addresses.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
	}
}

type reply struct {
	status int
	header http.Header
	body   string
}

func get(t *testing.T, c *http.Client, url string, header http.Header) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, res.Header, string(b)}
}

// TestNginx runs nginx's auth_request in front of limiterd with docs/gateways/nginx.conf: a
// client gets exactly its budget through, then 429 with Retry-After and the RateLimit fields,
// and nothing more reaches the application; a forged X-Forwarded-For gets no fresh budget;
// another client has its own; with limiterd down, nginx fails closed (500).
func TestNginx(t *testing.T) {
	var hits atomic.Int64
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, "app\n")
	}))
	defer app.Close()
	engine := testsupport.NewEngine(t, time.Now, shopPolicy())
	limiterd := httptest.NewServer(server.NewDecisions(engine, nil, server.WithAllowedHosts(nil)))
	defer limiterd.Close()
	base := startNginx(t, limiterd.Listener.Addr().String(), app.Listener.Addr().String())
	url := base + "/api/orders?page=1"

	alice, bob := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	for i := range budget {
		r := get(t, alice, url, nil)
		if r.status != http.StatusOK || r.body != "app\n" {
			t.Fatalf("request %d: %d %q, want the application's 200", i, r.status, r.body)
		}
		if want := fmt.Sprintf(`"per-client";r=%d;`, budget-1-i); !strings.HasPrefix(r.header.Get("RateLimit"), want) {
			t.Errorf("request %d: RateLimit %q, want %s...", i, r.header.Get("RateLimit"), want)
		}
		if got := r.header.Get("RateLimit-Policy"); got != `"per-client";q=3;w=180` {
			t.Errorf("request %d: RateLimit-Policy %q", i, got)
		}
	}
	if n := hits.Load(); n != budget {
		t.Fatalf("the application got %d requests, want %d", n, budget)
	}

	over := get(t, alice, url, nil)
	if over.status != http.StatusTooManyRequests {
		t.Fatalf("over the budget: %d %q, want 429", over.status, over.body)
	}
	if s, err := strconv.Atoi(over.header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
		t.Errorf("Retry-After %q, want 1 to 60 seconds", over.header.Get("Retry-After"))
	}
	if got := over.header.Get("RateLimit"); !strings.HasPrefix(got, `"per-client";r=0;`) {
		t.Errorf("RateLimit %q on the 429", got)
	}
	// A client that forges X-Forwarded-For (naming another client, or several) gets no fresh
	// budget: nginx appends the address it sees, the only entry limiterd reads.
	for _, forged := range []string{"127.0.0.2", "192.0.2.1", "192.0.2.1, 192.0.2.2", "garbage"} {
		if r := get(t, alice, url, http.Header{"X-Forwarded-For": {forged}}); r.status != http.StatusTooManyRequests {
			t.Errorf("forged X-Forwarded-For %q: %d, want 429", forged, r.status)
		}
	}
	if n := hits.Load(); n != budget {
		t.Fatalf("the application got %d requests after rejections, want %d", n, budget)
	}

	// Another client has a budget of its own.
	if r := get(t, bob, url, nil); r.status != http.StatusOK {
		t.Errorf("another client: %d %q, want 200", r.status, r.body)
	}

	// limiterd down: nginx answers 500 and proxies nothing.
	limiterd.Close()
	before := hits.Load()
	if r := get(t, bob, url, nil); r.status != http.StatusInternalServerError {
		t.Errorf("limiterd down: %d %q, want nginx's 500", r.status, r.body)
	}
	if hits.Load() != before {
		t.Errorf("the application got a request while limiterd was down")
	}
}

// TestGatewaysDocShowsTheShippedNginxConfiguration keeps the nginx block of docs/gateways.md
// the file the test runs.
func TestGatewaysDocShowsTheShippedNginxConfiguration(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways.md"))
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways", "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "```nginx\n"+string(conf)+"```") {
		t.Error("docs/gateways.md's nginx block is not docs/gateways/nginx.conf")
	}
}
