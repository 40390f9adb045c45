package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// TestVersionFlag: limiterd --version prints "limiterd <version>" to stdout, with the Go version
// that built it, writes nothing to stderr and exits 0, even beside flags that would not start
// it. It runs the test binary as limiterd (see startProcess) for the real exit status.
func TestVersionFlag(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--version"}, {"--version", "--max-clients", "-1"}} {
		cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
		cmd.Env = append(os.Environ(), runMainEnv+"=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("limiterd %q: %v (want exit status 0)\nstderr: %s", args, err, stderr.String())
		}
		want := "limiterd " + buildVersion() + "\n"
		if stdout.String() != want {
			t.Errorf("limiterd %q printed %q, want %q", args, stdout.String(), want)
		}
		if !strings.Contains(stdout.String(), runtime.Version()) {
			t.Errorf("limiterd %q printed %q, without the Go version %s", args, stdout.String(), runtime.Version())
		}
		if stderr.Len() > 0 {
			t.Errorf("limiterd %q wrote to stderr: %s", args, stderr.String())
		}
	}
}

// TestVersionInStartupLog: the "limiterd serving" log line says which build is serving.
func TestVersionInStartupLog(t *testing.T) {
	d := start(t, hooks{}, "--policy-file", policyFile(t, t.TempDir(), tokenBucketPolicy))
	deadline := time.Now().Add(5 * time.Second)
	for {
		sc := bufio.NewScanner(strings.NewReader(d.logs.String()))
		for sc.Scan() {
			var entry struct {
				Msg     string `json:"msg"`
				Version string `json:"version"`
			}
			if json.Unmarshal(sc.Bytes(), &entry) != nil || entry.Msg != "limiterd serving" {
				continue
			}
			if entry.Version != buildVersion() || !strings.Contains(entry.Version, runtime.Version()) {
				t.Fatalf("start-up log: version %q, want %q\n%s", entry.Version, buildVersion(), sc.Text())
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no \"limiterd serving\" log line:\n%s", d.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFormatVersion: the module version, the VCS revision (+dirty when modified) and time, and
// the Go version, each when the build recorded it.
func TestFormatVersion(t *testing.T) {
	for _, tc := range []struct {
		info debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"}}, "v0.1.0 go1.26.8"},
		{debug.BuildInfo{GoVersion: "go1.26.8"}, "(devel) go1.26.8"},
		{debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "69fa98b"},
			{Key: "vcs.time", Value: "2026-12-07T06:00:00Z"}, {Key: "vcs.modified", Value: "true"},
		}}, "(devel) revision 69fa98b+dirty 2026-12-07T06:00:00Z go1.26.8"},
		{debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "69fa98b"}, {Key: "vcs.modified", Value: "false"},
		}}, "v0.1.0 revision 69fa98b go1.26.8"},
	} {
		if got := formatVersion(&tc.info); got != tc.want {
			t.Errorf("formatVersion(%+v) = %q, want %q", tc.info, got, tc.want)
		}
	}
}
