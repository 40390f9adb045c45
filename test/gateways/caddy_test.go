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

// keysPolicy is shop/keys: a burst of budget per X-Api-Key, and a request without the header
// rejected.
func keysPolicy() *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "keys", Namespace: "shop"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "per-key",
			Tiers:       []v1alpha1.Tier{testsupport.TokenBucketTier("per-key", budget, 1, time.Minute)},
			Gateway: &v1alpha1.Gateway{
				KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}},
				MissingKey: v1alpha1.MissingKeyReject,
			},
		},
	}
}

// lbPolicy is shop/lb: a burst of budget per client address behind one load balancer
// (trustedHops 2), for a Caddy that lists the balancer in trusted_proxies.
func lbPolicy() *v1alpha1.RateLimitPolicy {
	hops := int32(2)
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "lb", Namespace: "shop"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "per-client",
			Tiers:       []v1alpha1.Tier{testsupport.TokenBucketTier("per-client", budget, 1, time.Minute)},
			Gateway: &v1alpha1.Gateway{
				KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceClientAddress, TrustedHops: &hops}},
				MissingKey: v1alpha1.MissingKeyReject,
			},
		},
	}
}

// needCaddy returns caddy's path. Without caddy the test is skipped on a developer's machine
// and fails under CI, where make test builds it (make caddy) and sets CADDY.
func needCaddy(t *testing.T) string {
	t.Helper()
	if _, err := testbin.Caddy.Path(); err != nil && os.Getenv("CI") == "" {
		t.Skipf("%v (CI is not set)", err)
	}
	return testbin.Need(t, testbin.Caddy)
}

// The names docs/gateways/Caddyfile uses, which the test replaces.
const (
	caddySite     = "example.com {"
	caddyLimiterd = "limiterd.limiterd.svc:8080"
	caddyApp      = "app:8080"
	caddyURI      = "uri /v1/forward-auth/shop/api?"
	// siteHost is the host the test's clients name: not limiterd's, so that limiterd's Host
	// check refuses it unless the Caddyfile's header_up sends limiterd's own.
	siteHost = "example.com"
	// balancer is the client address the test's Caddy trusts as a proxy.
	balancer = "127.0.0.3"
)

// startCaddy runs caddy with one site per forward-auth URI of uris, each docs/gateways/Caddyfile
// on a loopback port of its own with uris[i] in place of the shipped one, limiterd at
// limiterdAddr and the application at appAddr, and returns each site's base URL.
func startCaddy(t *testing.T, limiterdAddr, appAddr string, uris ...string) []string {
	t.Helper()
	bin := needCaddy(t)
	shipped, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{caddySite, caddyLimiterd, caddyApp, caddyURI} {
		if !strings.Contains(string(shipped), name) {
			t.Fatalf("docs/gateways/Caddyfile no longer has %q", name)
		}
	}
	dir := t.TempDir()
	// No admin endpoint, no certificates, no listener but the loopback ports below; the
	// address balancer stands for a load balancer in front of Caddy.
	conf := "{\n\tadmin off\n\tauto_https off\n\tdefault_bind 127.0.0.1\n" +
		"\tservers {\n\t\ttrusted_proxies static " + balancer + "/32\n\t}\n}\n"
	var addrs []string
	for _, uri := range uris {
		port := freePort(t)
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(port))
		site := strings.NewReplacer(
			caddySite, fmt.Sprintf("http://%s:%d {", siteHost, port),
			caddyLimiterd, limiterdAddr,
			caddyApp, appAddr,
			caddyURI, "uri "+uri,
		).Replace(string(shipped))
		conf += "\n" + site
	}
	confPath := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--adapter", "caddyfile", "--config", confPath)
	// Caddy's storage and autosaved configuration stay in the test's directory.
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
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
			t.Logf("Caddyfile:\n%s\ncaddy output:\n%s", conf, out)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	var bases []string
	for _, addr := range addrs {
		for {
			select {
			case err := <-exited:
				t.Fatalf("caddy exited: %v\n%s\nCaddyfile:\n%s", err, out, conf)
			default:
			}
			c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("caddy does not listen on %s: %v", addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		bases = append(bases, "http://"+addr)
	}
	return bases
}

// siteGet is get with siteHost in Host, which the gateways' shipped sites match (Caddy's site
// address, Traefik's router rule).
func siteGet(t *testing.T, c *http.Client, url string, header http.Header) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = siteHost
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

// TestCaddy runs Caddy's forward_auth in front of limiterd with docs/gateways/Caddyfile: a
// client gets exactly its budget through, the upstream receiving the RateLimit fields, then
// 429 with Retry-After and the fields, and nothing more reaches the application; a forged
// X-Forwarded-For gets no fresh budget (Caddy replaces an untrusted client's); another client
// has its own; keys from X-Api-Key are budgets of their own, and a request without one is
// rejected (429, or 403 under ?deny=403); with limiterd down, Caddy answers 502.
func TestCaddy(t *testing.T) {
	var hits atomic.Int64
	var seen atomic.Pointer[http.Header]
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		h := r.Header.Clone()
		seen.Store(&h)
		_, _ = io.WriteString(w, "app\n")
	}))
	defer app.Close()
	engine := testsupport.NewEngine(t, time.Now, shopPolicy(), keysPolicy(), lbPolicy())
	limiterd := httptest.NewServer(server.NewDecisions(engine, nil, server.WithAllowedHosts(nil)))
	defer limiterd.Close()
	bases := startCaddy(t, limiterd.Listener.Addr().String(), app.Listener.Addr().String(),
		"/v1/forward-auth/shop/api?", "/v1/forward-auth/shop/keys?", "/v1/forward-auth/shop/keys?deny=403",
		"/v1/forward-auth/shop/lb?")
	// The client's query must not reach limiterd, which refuses any but deny (400).
	url, keysURL, keys403URL := bases[0]+"/api/orders?page=1", bases[1]+"/api/orders?page=1", bases[2]+"/api/orders"
	lbURL := bases[3] + "/api/orders"

	alice, bob := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	for i := range budget {
		// A RateLimit field the client sends never reaches the upstream: copy_headers
		// replaces it with limiterd's.
		r := siteGet(t, alice, url, http.Header{"Ratelimit": {`"per-client";r=1000;t=0`}})
		if r.status != http.StatusOK || r.body != "app\n" {
			t.Fatalf("request %d: %d %q, want the application's 200", i, r.status, r.body)
		}
		h := *seen.Load()
		if want := fmt.Sprintf(`"per-client";r=%d;`, budget-1-i); !strings.HasPrefix(h.Get("RateLimit"), want) || len(h.Values("RateLimit")) != 1 {
			t.Errorf("request %d: the upstream got RateLimit %q, want one %s...", i, h.Values("RateLimit"), want)
		}
		if got := h.Get("RateLimit-Policy"); got != `"per-client";q=3;w=180` {
			t.Errorf("request %d: the upstream got RateLimit-Policy %q", i, got)
		}
		// copy_headers sets request headers: the client's answer has none of the fields.
		if got := r.header.Values("RateLimit"); len(got) != 0 {
			t.Errorf("request %d: the client got RateLimit %q on an admission", i, got)
		}
	}
	if n := hits.Load(); n != budget {
		t.Fatalf("the application got %d requests, want %d", n, budget)
	}

	over := siteGet(t, alice, url, nil)
	if over.status != http.StatusTooManyRequests {
		t.Fatalf("over the budget: %d %q, want 429", over.status, over.body)
	}
	if s, err := strconv.Atoi(over.header.Get("Retry-After")); err != nil || s < 1 || s > 60 {
		t.Errorf("Retry-After %q, want 1 to 60 seconds", over.header.Get("Retry-After"))
	}
	if got := over.header.Get("RateLimit"); !strings.HasPrefix(got, `"per-client";r=0;`) {
		t.Errorf("RateLimit %q on the 429", got)
	}
	if got := over.header.Get("RateLimit-Policy"); got != `"per-client";q=3;w=180` {
		t.Errorf("RateLimit-Policy %q on the 429", got)
	}
	// A client that forges X-Forwarded-For gets no fresh budget: Caddy trusts no proxy by
	// default and replaces the field with the address it sees.
	for _, forged := range []string{"127.0.0.2", "192.0.2.1", "192.0.2.1, 192.0.2.2", "garbage"} {
		if r := siteGet(t, alice, url, http.Header{"X-Forwarded-For": {forged}}); r.status != http.StatusTooManyRequests {
			t.Errorf("forged X-Forwarded-For %q: %d %q, want 429", forged, r.status, r.body)
		}
	}
	if n := hits.Load(); n != budget {
		t.Fatalf("the application got %d requests after rejections, want %d", n, budget)
	}

	// Another client has a budget of its own.
	if r := siteGet(t, bob, url, nil); r.status != http.StatusOK || r.body != "app\n" {
		t.Errorf("another client: %d %q, want 200", r.status, r.body)
	}

	// Keys from X-Api-Key, all from one address: each key has its own budget.
	before := hits.Load()
	for i := range budget {
		if r := siteGet(t, alice, keysURL, http.Header{"X-Api-Key": {"k1"}}); r.status != http.StatusOK {
			t.Fatalf("key k1, request %d: %d %q, want 200", i, r.status, r.body)
		}
	}
	if r := siteGet(t, alice, keysURL, http.Header{"X-Api-Key": {"k1"}}); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Errorf("key k1 over its budget: %d %q, Retry-After %q; want 429 with Retry-After", r.status, r.body, r.header.Get("Retry-After"))
	}
	if r := siteGet(t, alice, keysURL, http.Header{"X-Api-Key": {"k2"}}); r.status != http.StatusOK || r.body != "app\n" {
		t.Errorf("key k2: %d %q, want 200", r.status, r.body)
	}
	if n := hits.Load() - before; n != budget+1 {
		t.Errorf("the application got %d keyed requests, want %d", n, budget+1)
	}
	// No key under missingKey Reject: the deny status, without Retry-After, and nothing proxied.
	before = hits.Load()
	if r := siteGet(t, alice, keysURL, nil); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "" {
		t.Errorf("no key: %d %q, Retry-After %q; want 429 without Retry-After", r.status, r.body, r.header.Get("Retry-After"))
	}
	if r := siteGet(t, alice, keys403URL, nil); r.status != http.StatusForbidden {
		t.Errorf("no key under ?deny=403: %d %q, want 403", r.status, r.body)
	}
	if r := siteGet(t, alice, keys403URL, http.Header{"X-Api-Key": {"k3"}}); r.status != http.StatusOK {
		t.Errorf("key k3 under ?deny=403: %d %q, want 200", r.status, r.body)
	}
	if n := hits.Load() - before; n != 1 {
		t.Errorf("the application got %d requests, want 1 (k3's)", n)
	}

	// Behind a balancer Caddy trusts, Caddy appends the balancer's address to the field the
	// balancer sent: trustedHops 2 is the client the balancer saw, each with its own budget.
	lb := clientFrom(balancer)
	before = hits.Load()
	for i := range budget {
		if r := siteGet(t, lb, lbURL, http.Header{"X-Forwarded-For": {"198.51.100.7"}}); r.status != http.StatusOK {
			t.Fatalf("behind the balancer, request %d: %d %q, want 200", i, r.status, r.body)
		}
	}
	if r := siteGet(t, lb, lbURL, http.Header{"X-Forwarded-For": {"192.0.2.1, 198.51.100.7"}}); r.status != http.StatusTooManyRequests {
		t.Errorf("behind the balancer, over the budget (a forged entry left of the balancer's): %d %q, want 429", r.status, r.body)
	}
	if r := siteGet(t, lb, lbURL, http.Header{"X-Forwarded-For": {"198.51.100.8"}}); r.status != http.StatusOK {
		t.Errorf("behind the balancer, another client: %d %q, want 200", r.status, r.body)
	}
	// A client Caddy does not trust has its field replaced by its address: one entry, fewer
	// than trustedHops, so no key (Reject), whatever it forged.
	if r := siteGet(t, alice, lbURL, http.Header{"X-Forwarded-For": {"198.51.100.9"}}); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "" {
		t.Errorf("untrusted client on the trustedHops 2 policy: %d %q, Retry-After %q; want 429 without Retry-After", r.status, r.body, r.header.Get("Retry-After"))
	}
	if n := hits.Load() - before; n != budget+1 {
		t.Errorf("the application got %d requests behind the balancer, want %d", n, budget+1)
	}

	// limiterd down: Caddy cannot reach the auth upstream, answers 502 and proxies nothing.
	limiterd.Close()
	before = hits.Load()
	if r := siteGet(t, bob, url, nil); r.status != http.StatusBadGateway {
		t.Errorf("limiterd down: %d %q, want Caddy's 502", r.status, r.body)
	}
	if hits.Load() != before {
		t.Errorf("the application got a request while limiterd was down")
	}
}

// TestGatewaysDocShowsTheShippedCaddyfile keeps the Caddy block of docs/gateways.md the file
// the test runs.
func TestGatewaysDocShowsTheShippedCaddyfile(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways.md"))
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "```caddyfile\n"+string(conf)+"```") {
		t.Error("docs/gateways.md's Caddy block is not docs/gateways/Caddyfile")
	}
}
