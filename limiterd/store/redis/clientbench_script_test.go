package redis

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// clientbenchScript is the file the client benchmarks (clientbench, a module of its own that
// does not import this package) read: the decision script of one token bucket and its
// arguments, as Store.Decide sends them.
var clientbenchScript = filepath.Join("clientbench", "testdata", "tokenbucket.json")

// TestClientbenchScriptCurrent fails when clientbenchScript is not what Store.Decide runs for a
// decision of one token bucket (of 100 tokens refilled at 100/s, cost 1, on the server's clock,
// no expiry slack). LIMITERD_UPDATE_CLIENTBENCH=1 writes it.
func TestClientbenchScriptCurrent(t *testing.T) {
	s := &Store{c: &Client{slackMS: "0", rebase: strconv.FormatInt(defaultRebaseThreshold, 10)}}
	c := s.newCall("", limitertest.One(tokenBucket(t, 100, 100, time.Second)), time.Time{}, 1, modeDecide)
	want, err := json.MarshalIndent(struct {
		Script string   `json:"script"`
		Args   []string `json:"args"`
	}{decideScripts.of(c).source, s.callArgs(c)}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if os.Getenv("LIMITERD_UPDATE_CLIENTBENCH") == "1" {
		if err := os.WriteFile(clientbenchScript, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(clientbenchScript)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("%s is not the decision script of one token bucket and its arguments: run LIMITERD_UPDATE_CLIENTBENCH=1 go test -run TestClientbenchScriptCurrent ./limiterd/store/redis", clientbenchScript)
	}
}
