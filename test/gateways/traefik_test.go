package gateways

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/server"
)

// What docs/gateways/traefik.yml names, which the test replaces.
const (
	traefikAddress = "http://limiterd.limiterd.svc:8080/v1/forward-auth/shop/api"
	traefikApp     = "http://app:8080"
	traefikRule    = "Host(`" + siteHost + "`)"
	// readyHost is the Host of the test's readiness router, which answers noop@internal's 418.
	readyHost = "ready.test"
)

// traefikDynamic is the part of a dynamic configuration the shipped file may have: its HTTP
// middlewares, routers and services, each kept as decoded.
type traefikDynamic struct {
	HTTP struct {
		Middlewares map[string]map[string]any `json:"middlewares"`
		Routers     map[string]map[string]any `json:"routers"`
		Services    map[string]map[string]any `json:"services"`
	} `json:"http"`
}

// traefikConfig derives the test's dynamic configuration from shipped, docs/gateways/traefik.yml,
// which must hold one forwardAuth middleware asking traefikAddress, one router (rule
// traefikRule, that middleware, no entry points) and one service of one server, traefikApp;
// anything else fails. For each forward-auth URI uris[i], the configuration has a copy of the
// middleware asking limiterdAddr with that URI and a copy of the router on the entry point
// site<i> only, using it; the service reaches the application at appAddr; every other field is
// the shipped one. A router on every entry point answers the Host readyHost with
// noop@internal's 418: once it does, the configuration is in place.
func traefikConfig(shipped []byte, limiterdAddr, appAddr string, uris []string) ([]byte, error) {
	var in traefikDynamic
	if err := yaml.UnmarshalStrict(shipped, &in); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	one := func(what string, m map[string]map[string]any) (name string, v map[string]any, err error) {
		for name, v = range m {
		}
		if len(m) != 1 {
			err = fmt.Errorf("%d %s, want 1", len(m), what)
		}
		return name, v, err
	}
	mwName, mw, err := one("middlewares", in.HTTP.Middlewares)
	if err != nil {
		return nil, err
	}
	routerName, router, err := one("routers", in.HTTP.Routers)
	if err != nil {
		return nil, err
	}
	svcName, svc, err := one("services", in.HTTP.Services)
	if err != nil {
		return nil, err
	}
	fa, _ := mw["forwardAuth"].(map[string]any)
	if len(mw) != 1 || fa == nil || fa["address"] != traefikAddress {
		return nil, fmt.Errorf("middleware %s is not one forwardAuth with address %s", mwName, traefikAddress)
	}
	if router["rule"] != traefikRule || router["service"] != svcName || router["entryPoints"] != nil ||
		!reflect.DeepEqual(router["middlewares"], []any{mwName}) {
		return nil, fmt.Errorf("router %s does not route %s through %s to %s on every entry point", routerName, traefikRule, mwName, svcName)
	}
	wantServers := []any{map[string]any{"url": traefikApp}}
	lb, _ := svc["loadBalancer"].(map[string]any)
	if lb == nil || !reflect.DeepEqual(lb["servers"], wantServers) {
		return nil, fmt.Errorf("service %s does not balance to %s alone", svcName, traefikApp)
	}

	out := traefikDynamic{}
	out.HTTP.Middlewares = map[string]map[string]any{}
	out.HTTP.Routers = map[string]map[string]any{
		"ready": {"rule": "Host(`" + readyHost + "`)", "service": "noop@internal"},
	}
	for i, uri := range uris {
		m, r := clone(mw), clone(router)
		m["forwardAuth"].(map[string]any)["address"] = "http://" + limiterdAddr + uri
		r["entryPoints"] = []any{fmt.Sprintf("site%d", i)}
		r["middlewares"] = []any{fmt.Sprintf("%s-%d", mwName, i)}
		out.HTTP.Middlewares[fmt.Sprintf("%s-%d", mwName, i)] = m
		out.HTTP.Routers[fmt.Sprintf("%s-%d", routerName, i)] = r
	}
	s := clone(svc)
	s["loadBalancer"].(map[string]any)["servers"] = []any{map[string]any{"url": "http://" + appAddr}}
	out.HTTP.Services = map[string]map[string]any{svcName: s}
	b, err := yaml.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return b, nil
}

// clone returns a deep copy of a decoded map.
func clone(m map[string]any) map[string]any {
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	return c
}

// startTraefik runs traefik with the dynamic configuration traefikConfig derives from
// docs/gateways/traefik.yml, one entry point site<i> on a loopback port of its own for each
// forward-auth URI uris[i], each trusting balancer's X-Forwarded-* (forwardedHeaders.trustedIPs),
// and returns each entry point's base URL once traefik serves the configuration.
func startTraefik(t *testing.T, limiterdAddr, appAddr string, uris ...string) []string {
	t.Helper()
	bin := testbin.Need(t, testbin.Traefik)
	shipped, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways", "traefik.yml"))
	if err != nil {
		t.Fatal(err)
	}
	conf, err := traefikConfig(shipped, limiterdAddr, appAddr, uris)
	if err != nil {
		t.Fatalf("docs/gateways/traefik.yml: %v", err)
	}
	dir := t.TempDir()
	confPath := filepath.Join(dir, "dynamic.yml")
	if err := os.WriteFile(confPath, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	// The static configuration: the file provider, the entry points, nothing else (no API,
	// dashboard, ping or metrics, and no call home).
	args := []string{
		"--global.checkNewVersion=false", "--global.sendAnonymousUsage=false",
		"--log.level=DEBUG", "--providers.file.filename=" + confPath,
	}
	var addrs []string
	for i := range uris {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		addrs = append(addrs, addr)
		ep := fmt.Sprintf("--entryPoints.site%d.", i)
		args = append(args, ep+"address="+addr, ep+"forwardedHeaders.trustedIPs="+balancer+"/32")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+dir)
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
			t.Logf("traefik %s\ndynamic configuration:\n%s\ntraefik output:\n%s", strings.Join(args, " "), conf, out)
		}
	})
	// Entry points listen before the provider's configuration is in place, and answer 404
	// until it is: wait for the readiness router's 418 on each.
	probe := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	var bases []string
	for _, addr := range addrs {
		for {
			select {
			case err := <-exited:
				t.Fatalf("traefik exited: %v\n%s\ndynamic configuration:\n%s", err, out, conf)
			default:
			}
			req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+addr+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = readyHost
			res, err := probe.Do(req)
			if err == nil {
				res.Body.Close()
				if res.StatusCode == http.StatusTeapot {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("traefik does not serve its configuration on %s: %v", addr, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		bases = append(bases, "http://"+addr)
	}
	return bases
}

// TestTraefik runs Traefik's ForwardAuth in front of limiterd with docs/gateways/traefik.yml: a
// client gets exactly its budget through, the upstream receiving the RateLimit fields, then 429
// with Retry-After and the fields, and nothing more reaches the application; limiterd reads
// the X-Forwarded-* fields Traefik writes, never the client's, so a forged X-Forwarded-For gets
// no fresh budget; another client has its own; keys from X-Api-Key are budgets of their own,
// and a request without one is rejected (429, or 403 under ?deny=403); behind a balancer the
// entry point trusts, trustedHops 2 is the balancer's client; with limiterd down, Traefik
// answers 500.
func TestTraefik(t *testing.T) {
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
	decisions := server.NewDecisions(engine, nil, server.WithAllowedHosts(nil))
	// asked is the last forward-auth request limiterd got, its Host in the header's "Host".
	var asked atomic.Pointer[http.Header]
	limiterd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		h["Host"] = []string{r.Host}
		asked.Store(&h)
		decisions.ServeHTTP(w, r)
	}))
	defer limiterd.Close()
	bases := startTraefik(t, limiterd.Listener.Addr().String(), app.Listener.Addr().String(),
		"/v1/forward-auth/shop/api", "/v1/forward-auth/shop/keys", "/v1/forward-auth/shop/keys?deny=403",
		"/v1/forward-auth/shop/lb")
	// The client's query never reaches limiterd, which refuses any but deny (400): ForwardAuth
	// asks its address as it is.
	url, keysURL, keys403URL := bases[0]+"/api/orders?page=1", bases[1]+"/api/orders?page=1", bases[2]+"/api/orders"
	lbURL := bases[3] + "/api/orders"

	alice, bob := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	for i := range budget {
		// Neither a RateLimit field nor X-Forwarded-* fields the client sends count: the entry
		// point drops the client's X-Forwarded-*, ForwardAuth writes its own, and
		// authResponseHeaders replaces RateLimit with limiterd's.
		r := siteGet(t, alice, url, http.Header{
			"Ratelimit":          {`"per-client";r=1000;t=0`},
			"X-Forwarded-For":    {"192.0.2.9"},
			"X-Forwarded-Method": {"POST"},
			"X-Forwarded-Uri":    {"/forged"},
			"X-Forwarded-Host":   {"forged.example"},
		})
		if r.status != http.StatusOK || r.body != "app\n" {
			t.Fatalf("request %d: %d %q, want the application's 200", i, r.status, r.body)
		}
		a := *asked.Load()
		for name, want := range map[string]string{
			"Host":               limiterd.Listener.Addr().String(), // for --allowed-hosts
			"X-Forwarded-For":    "127.0.0.1",
			"X-Forwarded-Method": "GET",
			"X-Forwarded-Uri":    "/api/orders?page=1",
			"X-Forwarded-Host":   siteHost,
		} {
			if got := a.Values(name); len(got) != 1 || got[0] != want {
				t.Errorf("request %d: limiterd got %s %q, want %q", i, name, got, want)
			}
		}
		h := *seen.Load()
		if want := fmt.Sprintf(`"per-client";r=%d;`, budget-1-i); !strings.HasPrefix(h.Get("RateLimit"), want) || len(h.Values("RateLimit")) != 1 {
			t.Errorf("request %d: the upstream got RateLimit %q, want one %s...", i, h.Values("RateLimit"), want)
		}
		if got := h.Get("RateLimit-Policy"); got != `"per-client";q=3;w=180` {
			t.Errorf("request %d: the upstream got RateLimit-Policy %q", i, got)
		}
		// authResponseHeaders sets request headers: the client's answer has none of the fields.
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
	if !json.Valid([]byte(over.body)) {
		t.Errorf("the 429's body %q is not limiterd's JSON", over.body)
	}
	// A client that forges X-Forwarded-For gets no fresh budget: the entry point trusts only
	// the balancer, and drops the field of any other client.
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

	// Behind a balancer the entry point trusts (forwardedHeaders.trustedIPs), the entry point
	// keeps the field the balancer sent and ForwardAuth (trustForwardHeader) appends the
	// balancer's address: trustedHops 2 is the client the balancer saw, each with its own
	// budget.
	lb := clientFrom(balancer)
	before = hits.Load()
	for i := range budget {
		if r := siteGet(t, lb, lbURL, http.Header{"X-Forwarded-For": {"198.51.100.7"}}); r.status != http.StatusOK {
			t.Fatalf("behind the balancer, request %d: %d %q, want 200", i, r.status, r.body)
		}
	}
	if got := (*asked.Load()).Values("X-Forwarded-For"); !reflect.DeepEqual(got, []string{"198.51.100.7, " + balancer}) {
		t.Errorf("behind the balancer, limiterd got X-Forwarded-For %q", got)
	}
	if r := siteGet(t, lb, lbURL, http.Header{"X-Forwarded-For": {"192.0.2.1, 198.51.100.7"}}); r.status != http.StatusTooManyRequests {
		t.Errorf("behind the balancer, over the budget (a forged entry left of the balancer's): %d %q, want 429", r.status, r.body)
	}
	if r := siteGet(t, lb, lbURL, http.Header{"X-Forwarded-For": {"198.51.100.8"}}); r.status != http.StatusOK {
		t.Errorf("behind the balancer, another client: %d %q, want 200", r.status, r.body)
	}
	// A client the entry point does not trust has its field dropped: one entry, its address,
	// fewer than trustedHops, so no key (Reject), whatever it forged.
	if r := siteGet(t, alice, lbURL, http.Header{"X-Forwarded-For": {"198.51.100.9"}}); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "" {
		t.Errorf("untrusted client on the trustedHops 2 policy: %d %q, Retry-After %q; want 429 without Retry-After", r.status, r.body, r.header.Get("Retry-After"))
	}
	if n := hits.Load() - before; n != budget+1 {
		t.Errorf("the application got %d requests behind the balancer, want %d", n, budget+1)
	}

	// limiterd down: ForwardAuth cannot reach its address, answers 500 with an empty body and
	// proxies nothing.
	limiterd.Close()
	before = hits.Load()
	if r := siteGet(t, bob, url, nil); r.status != http.StatusInternalServerError || r.body != "" {
		t.Errorf("limiterd down: %d %q, want Traefik's empty 500", r.status, r.body)
	}
	if hits.Load() != before {
		t.Errorf("the application got a request while limiterd was down")
	}
}

// TestTraefikDocShowsTheShippedConfiguration keeps docs/gateways/traefik.md's block the file the
// test runs.
func TestTraefikDocShowsTheShippedConfiguration(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways", "traefik.md"))
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways", "traefik.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, []byte("```yaml\n"+string(conf)+"```")) {
		t.Error("docs/gateways/traefik.md's configuration block is not docs/gateways/traefik.yml")
	}
}

// TestTraefikConfigRefusesAnotherShape checks that traefikConfig fails, rather than derive
// something else, when the shipped file's shape changes.
func TestTraefikConfigRefusesAnotherShape(t *testing.T) {
	shipped, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateways", "traefik.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := traefikConfig(shipped, "127.0.0.1:1", "127.0.0.1:2", []string{"/a", "/b"}); err != nil {
		t.Fatalf("the shipped file: %v", err)
	}
	for _, c := range []struct{ old, new string }{
		{"limiterd.limiterd.svc:8080", "limiterd.other.svc:8080"},
		{"rule: Host(`example.com`)", "rule: Host(`example.org`)"},
		{"http://app:8080", "http://app:9090"},
		{"      service: app\n", "      service: app\n      entryPoints: [web]\n"},
		{"  services:\n", "  serversTransports:\n    t: {}\n  services:\n"},
		{"http:\n", "tcp: {}\nhttp:\n"},
	} {
		changed := strings.Replace(string(shipped), c.old, c.new, 1)
		if changed == string(shipped) {
			t.Errorf("the shipped file has no %q", c.old)
			continue
		}
		if _, err := traefikConfig([]byte(changed), "127.0.0.1:1", "127.0.0.1:2", []string{"/a"}); err == nil {
			t.Errorf("%q for %q: derived a configuration, want an error", c.new, c.old)
		}
	}
}
