package main

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// decideAt asks base for a decision on a request naming host in its Host field.
func decideAt(t *testing.T, base, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/allow?key=alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestDecisionsAllowedHosts: the decisions API on a loopback address answers requests to IP
// addresses and localhost only, unless --allowed-hosts names more; on another address without
// the flag it answers any Host (and says so in its log). Before, a page could reach a loopback
// limiterd through a name of its own resolving to 127.0.0.1 (DNS rebinding), and read the answers.
func TestDecisionsAllowedHosts(t *testing.T) {
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	port := func(base string) string { return base[strings.LastIndex(base, ":"):] }
	// The policy admits 3 requests of a client: a request is decided when it answers 200 or 429.
	decided := func(status int) bool { return status == http.StatusOK || status == http.StatusTooManyRequests }

	d := start(t, hooks{}, "--policy-file", path) // --addr 127.0.0.1:0
	for _, host := range []string{"evil.example", "evil.example" + port(d.decisions), "127.0.0.1.nip.io" + port(d.decisions)} {
		if status, body := decideAt(t, d.decisions, host); status != http.StatusMisdirectedRequest || !isJSONError(body) || !strings.Contains(body, "--allowed-hosts") {
			t.Errorf("loopback --addr, Host %q: %d %s, want 421 with a JSON error naming --allowed-hosts", host, status, body)
		}
	}
	for _, host := range []string{"localhost" + port(d.decisions), "127.0.0.1" + port(d.decisions), "10.0.0.7"} {
		if status, body := decideAt(t, d.decisions, host); !decided(status) {
			t.Errorf("loopback --addr, Host %q: %d %s, want decided", host, status, body)
		}
	}

	d = start(t, hooks{}, "--policy-file", path, "--allowed-hosts", "limiterd.test, gateway.test", "--allowed-hosts", "other.test")
	for host, answered := range map[string]bool{
		"limiterd.test" + port(d.decisions): true, "Gateway.Test": true, "other.test": true, "localhost": true,
		"evil.example": false,
	} {
		if status, body := decideAt(t, d.decisions, host); decided(status) != answered || !answered && status != http.StatusMisdirectedRequest {
			t.Errorf("--allowed-hosts, Host %q: %d %s, want decided %t (else 421)", host, status, body, answered)
		}
	}

	d = start(t, hooks{}, "--policy-file", path, "--addr", "0.0.0.0:0")
	if status, body := decideAt(t, d.decisions, "evil.example"); !decided(status) {
		t.Errorf("--addr 0.0.0.0:0 without --allowed-hosts, Host evil.example: %d %s, want decided", status, body)
	}
	if !strings.Contains(d.logs.String(), `"msg":"decisions API answers requests to any Host`) {
		t.Errorf("no log line says every Host is answered:\n%s", d.logs)
	}
}

func TestAllowedHostsFlag(t *testing.T) {
	cfg, err := parseFlags([]string{"--policy-file", "a.yaml", "--allowed-hosts", "limiterd.shop.svc, Gateway.Example.", "--allowed-hosts", "xn--bcher-kva.example"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"limiterd.shop.svc", "Gateway.Example", "xn--bcher-kva.example"}; !slices.Equal(cfg.allowedHosts, want) {
		t.Errorf("allowed hosts %q, want %q", cfg.allowedHosts, want)
	}
	for _, v := range []string{"", "a,,b", "limiterd:8080", "10.0.0.1", "[::1]", "http://limiterd", "limiterd/v1", "bücher.example", "a..", strings.Repeat("a", 254)} {
		if _, err := parseFlags([]string{"--policy-file", "a.yaml", "--allowed-hosts", v}, io.Discard); err == nil {
			t.Errorf("--allowed-hosts %q accepted", v)
		}
	}
	for addr, check := range map[string]bool{"127.0.0.1:8080": true, "[::1]:8080": true, "localhost:8080": true, ":8080": false, "0.0.0.0:8080": false, "10.0.0.7:8080": false} {
		if got := decisionsHostCheck(addr, nil) != nil; got != check {
			t.Errorf("--addr %s without --allowed-hosts: Host check %t, want %t", addr, got, check)
		}
		if decisionsHostCheck(addr, []string{"limiterd"}) == nil {
			t.Errorf("--addr %s with --allowed-hosts: no Host check", addr)
		}
	}
}
