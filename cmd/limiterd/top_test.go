package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The daemon records its decisions and serves them on GET /v1/top, to the token only, naming
// this replica by its host name when it has no --replica-name.
func TestAdminTop(t *testing.T) {
	dir := t.TempDir()
	token := "0123456789abcdef0123"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, hooks{}, "--policy-file", policyFile(t, dir, tokenBucketPolicy), "--admin-token-file", tokenFile, "--top-clients")
	for range 5 {
		allowKey(t, d.decisions, "", "alice") // capacity 3: 2 rejected
	}
	if status, body := adminCall(t, http.MethodGet, d.admin+"/v1/top", ""); status != 401 || !isJSONError(body) {
		t.Errorf("/v1/top without the token: %d %s, want 401", status, body)
	}
	status, body := adminCall(t, http.MethodGet, d.admin+"/v1/top?by=rejected&n=5", token)
	var top struct {
		Policy, Replica string
		Clients         []struct {
			Key   string
			Count uint64
		}
	}
	if err := json.Unmarshal([]byte(body), &top); status != 200 || err != nil {
		t.Fatalf("/v1/top: %d %s %v", status, body, err)
	}
	host, _ := os.Hostname()
	if top.Replica != strings.ToLower(host) || top.Replica == "" || len(top.Clients) != 1 || top.Clients[0].Key != "alice" || top.Clients[0].Count != 2 {
		t.Errorf("/v1/top: %s, want alice rejected twice on replica %q", body, strings.ToLower(host))
	}
}

// Without --top-clients the daemon records nothing (the record costs every decision about
// 30 ns in memory), and GET /v1/top answers 404 with a JSON message saying so.
func TestAdminTopOffByDefault(t *testing.T) {
	dir := t.TempDir()
	token := "0123456789abcdef0123"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, hooks{}, "--policy-file", policyFile(t, dir, tokenBucketPolicy), "--admin-token-file", tokenFile)
	allowKey(t, d.decisions, "", "alice")
	if status, body := adminCall(t, http.MethodGet, d.admin+"/v1/top", token); status != http.StatusNotFound || !isJSONError(body) {
		t.Errorf("/v1/top without --top-clients: %d %s, want 404 with a JSON message", status, body)
	}
}
