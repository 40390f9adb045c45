package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// reloadDeadline is how soon a change must be served.
const reloadDeadline = time.Second

// policyYAML is a policy file holding default/<name> with one token-bucket tier of capacity.
func policyYAML(name string, capacity int) string {
	return fmt.Sprintf(`apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: %s
spec:
  defaultTier: standard
  tiers:
  - name: standard
    algorithm: TokenBucket
    tokenBucket:
      capacity: %d
      refillRate: 1
      refillPeriod: 1s
`, name, capacity)
}

const invalidYAML = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: nowhere
  tiers:
  - name: standard
    algorithm: Unlimited
`

// watched is a policy file under watch feeding an engine.
type watched struct {
	path     string
	file     *File
	engine   *engine.Engine
	reloads  *recorder
	stopped  chan error
	pipeline *Pipeline
	watches  chan bool // FileOptions.OnWatch calls
}

// watchFile writes content to dir/name (unless it is ""), loads it and watches it.
func watchFile(t *testing.T, dir, name, content string) *watched {
	t.Helper()
	path := filepath.Join(dir, name)
	if content != "" {
		writeFile(t, path, content)
	}
	w := &watched{path: path, engine: engine.New(engine.Options{}), reloads: &recorder{}, stopped: make(chan error, 1), watches: make(chan bool, 100)}
	log := slog.New(slog.NewJSONHandler(testWriter{t}, nil))
	w.pipeline = NewPipeline(w.engine, PipelineOptions{Logger: log, Observer: w.reloads})
	f, err := NewFile(path, w.pipeline, FileOptions{Logger: log, OnWatch: func(ok bool) { w.watches <- ok }})
	if err != nil {
		t.Fatal(err)
	}
	w.file = f
	if content != "" {
		if err := f.Load(); err != nil {
			t.Fatalf("initial load: %v", err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	go func() { w.stopped <- f.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-w.stopped; err != nil {
			t.Errorf("watch: %v", err)
		}
	})
	select {
	case <-f.Watching():
	case err := <-w.stopped:
		t.Fatalf("watch ended before watching: %v", err)
	}
	return w
}

// capacity returns the capacity served for default/<name>, or -1 if it is not loaded.
func (w *watched) capacity(name string) int64 {
	set := w.engine.Policies()
	if set == nil {
		return -1
	}
	p, ok := set.Get(v1alpha1.NewPolicyID(v1alpha1.DefaultNamespace, name))
	if !ok {
		return -1
	}
	return p.Default.Limit(0).Limit()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// testWriter sends logs to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}

func TestFileReloadsOnWriteInPlace(t *testing.T) {
	w := watchFile(t, t.TempDir(), "policies.yaml", policyYAML("api", 10))
	if got := w.capacity("api"); got != 10 {
		t.Fatalf("capacity %d after load, want 10", got)
	}
	writeFile(t, w.path, policyYAML("api", 20))
	testsupport.Eventually(t, reloadDeadline, "write in place served", func() bool { return w.capacity("api") == 20 })
}

func TestFileReloadsOnRenameOver(t *testing.T) {
	dir := t.TempDir()
	w := watchFile(t, dir, "policies.yaml", policyYAML("api", 10))
	tmp := filepath.Join(dir, ".policies.yaml.tmp")
	writeFile(t, tmp, policyYAML("api", 30))
	if err := os.Rename(tmp, w.path); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, reloadDeadline, "rename over served", func() bool { return w.capacity("api") == 30 })
	// And again: the watch survives the replaced inode.
	writeFile(t, tmp, policyYAML("api", 31))
	if err := os.Rename(tmp, w.path); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, reloadDeadline, "second rename served", func() bool { return w.capacity("api") == 31 })
}

// TestFileReloadsOnConfigMapSwap replays how the kubelet updates a ConfigMap volume: the file
// is a symlink through "..data", itself a symlink to a timestamped directory, and an update
// renames a new "..data" over the old one.
func TestFileReloadsOnConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	publish := func(version, content string) {
		t.Helper()
		versionDir := filepath.Join(dir, "..ts-"+version)
		if err := os.Mkdir(versionDir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(versionDir, "policies.yaml"), content)
		tmpLink := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink("..ts-"+version, tmpLink); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmpLink, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish("1", policyYAML("api", 10))
	if err := os.Symlink(filepath.Join("..data", "policies.yaml"), filepath.Join(dir, "policies.yaml")); err != nil {
		t.Fatal(err)
	}
	w := watchFile(t, dir, "policies.yaml", "")
	if err := w.file.Load(); err != nil {
		t.Fatal(err)
	}
	publish("2", policyYAML("api", 40))
	if err := os.RemoveAll(filepath.Join(dir, "..ts-1")); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, reloadDeadline, "ConfigMap swap served", func() bool { return w.capacity("api") == 40 })
	publish("3", policyYAML("api", 41))
	testsupport.Eventually(t, reloadDeadline, "second ConfigMap swap served", func() bool { return w.capacity("api") == 41 })
}

func TestFileReloadsWhenItsSymlinkTargetChanges(t *testing.T) {
	dir, elsewhere := t.TempDir(), t.TempDir()
	target := filepath.Join(elsewhere, "real.yaml")
	writeFile(t, target, policyYAML("api", 10))
	if err := os.Symlink(target, filepath.Join(dir, "policies.yaml")); err != nil {
		t.Fatal(err)
	}
	w := watchFile(t, dir, "policies.yaml", "")
	if err := w.file.Load(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, target, policyYAML("api", 50))
	testsupport.Eventually(t, reloadDeadline, "symlink target change served", func() bool { return w.capacity("api") == 50 })
}

func TestFileInvalidChangeKeepsTheLastGoodPolicies(t *testing.T) {
	w := watchFile(t, t.TempDir(), "policies.yaml", policyYAML("api", 10))
	s0, f0 := w.reloads.counts()
	for _, bad := range []string{invalidYAML, "spec: [unclosed", "", "apiVersion: limiterd.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {name: api}\nspec: {defaultTier: a, tiers: [{name: a, algorithm: Unlimited}]}\nunknownField: 1\n"} {
		writeFile(t, w.path, bad)
		testsupport.Eventually(t, reloadDeadline, fmt.Sprintf("failure of %q counted", bad), func() bool {
			_, f := w.reloads.counts()
			return f > f0
		})
		_, f0 = w.reloads.counts()
		if got := w.capacity("api"); got != 10 {
			t.Fatalf("after %q: capacity %d, want the last good 10", bad, got)
		}
	}
	if s, _ := w.reloads.counts(); s != s0 {
		t.Errorf("successes went from %d to %d on invalid content", s0, s)
	}
	// A valid file is picked up again.
	writeFile(t, w.path, policyYAML("api", 11))
	testsupport.Eventually(t, reloadDeadline, "fixed file served", func() bool { return w.capacity("api") == 11 })
}

func TestFileRemovedKeepsItsPoliciesUntilItIsBack(t *testing.T) {
	w := watchFile(t, t.TempDir(), "policies.yaml", policyYAML("api", 10))
	_, f0 := w.reloads.counts()
	if err := os.Remove(w.path); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, reloadDeadline, "removal counted as a failure", func() bool {
		_, f := w.reloads.counts()
		return f == f0+1
	})
	if got := w.capacity("api"); got != 10 {
		t.Fatalf("after removal: capacity %d, want the last good 10", got)
	}
	writeFile(t, w.path, policyYAML("api", 12))
	testsupport.Eventually(t, reloadDeadline, "recreated file served", func() bool { return w.capacity("api") == 12 })
}

// TestFileWatchSurvivesItsDirectoryRecreated deletes the policy file's directory and makes it
// again, twice: the watch is lost and reported, then recovers, and each new file, and each
// later change, is served within reloadDeadline of being written.
func TestFileWatchSurvivesItsDirectoryRecreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "policies")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w := watchFile(t, dir, "policies.yaml", policyYAML("api", 10))
	capacity := 10
	for round := range 2 {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		select {
		case ok := <-w.watches:
			if ok {
				t.Fatalf("round %d: watch reported recovered before the directory came back", round)
			}
		case <-time.After(reloadDeadline):
			t.Fatalf("round %d: the lost watch was not reported", round)
		}
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		capacity++
		writeFile(t, w.path, policyYAML("api", capacity))
		testsupport.Eventually(t, reloadDeadline, "file in the recreated directory served", func() bool { return w.capacity("api") == int64(capacity) })
		if ok := <-w.watches; !ok {
			t.Fatalf("round %d: watch reported lost again, want recovered", round)
		}
		capacity++
		writeFile(t, w.path, policyYAML("api", capacity))
		testsupport.Eventually(t, reloadDeadline, "later change served", func() bool { return w.capacity("api") == int64(capacity) })
	}
}

func TestFileLoad(t *testing.T) {
	dir := t.TempDir()
	p := NewPipeline(engine.New(engine.Options{}), PipelineOptions{Logger: slog.New(slog.DiscardHandler)})
	for name, tc := range map[string]struct {
		content string
		want    error
	}{
		"missing": {"", os.ErrNotExist},
		"empty":   {"\n", ErrNoPolicies},
		"comment": {"# nothing yet\n", ErrNoPolicies},
	} {
		path := filepath.Join(dir, name+".yaml")
		if tc.content != "" {
			writeFile(t, path, tc.content)
		}
		f, err := NewFile(path, p, FileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Load(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	big := filepath.Join(dir, "big.yaml")
	writeFile(t, big, policyYAML("api", 1)+"# "+string(make([]byte, MaxPolicyFileSize))+"\n")
	f, err := NewFile(big, p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Load(); err == nil {
		t.Error("a file over MaxPolicyFileSize loaded")
	}

	multi := filepath.Join(dir, "multi.yaml")
	writeFile(t, multi, policyYAML("one", 1)+"---\n"+policyYAML("two", 2))
	f, err = NewFile(multi, p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Load(); err != nil {
		t.Fatal(err)
	}
	if got := p.Policies(f.Origin()); len(got) != 2 || got[0] != "default/one" || got[1] != "default/two" {
		t.Errorf("multi-document file contributes %v", got)
	}
}
