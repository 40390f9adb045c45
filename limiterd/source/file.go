package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/limiterd/limiterd/api/v1alpha1"
)

// MaxPolicyFileSize bounds a policy file; a larger one is rejected unread.
const MaxPolicyFileSize = 4 << 20

// DefaultDebounce is how long a file watch waits for a burst of events to end before it
// reloads.
const DefaultDebounce = 50 * time.Millisecond

// rewatchInterval is how often a watch whose directory went away tries to watch it again.
const rewatchInterval = 100 * time.Millisecond

// ErrNoPolicies is wrapped by the error of a policy file that holds no policy: a file caught
// half-written (truncated, not yet filled) looks like that, so it keeps the last good policies
// rather than unloading them.
var ErrNoPolicies = errors.New("policy file holds no policy")

// FileOptions configure a File. The zero value logs to slog.Default and debounces by
// DefaultDebounce.
type FileOptions struct {
	Logger *slog.Logger
	// Debounce is the quiet time after the last event before a reload; a reload happens at the
	// latest 2*Debounce after the first event of a burst.
	Debounce time.Duration
	// OnWatch, if set, is called with false when the file's directory is deleted or moved away
	// (changes are not seen until it is back) and with true when it is watched again.
	OnWatch func(watched bool)
}

// File is a policy file: a YAML stream of RateLimitPolicy documents (see
// v1alpha1.DecodePolicies). It feeds its policies to a Pipeline under the origin
// "file:<absolute path>".
//
// A change that cannot be loaded (unreadable, missing, invalid, no policy) keeps the file's
// last good policies in service; it is logged and counted by the pipeline. A removed file
// therefore keeps its policies until it is back.
type File struct {
	path     string // absolute, clean
	origin   string
	pipeline *Pipeline
	log      *slog.Logger
	debounce time.Duration
	onWatch  func(bool)

	mu      sync.Mutex // serialises loads
	loaded  bool       // a load was attempted
	content []byte     // content of the last load attempt that read the file
	readErr string     // error of the last load attempt that could not read it

	watching     chan struct{} // closed once the directory is watched
	watchingOnce sync.Once
}

// NewFile returns the policy file at path, feeding pipeline.
func NewFile(path string, pipeline *Pipeline, opts FileOptions) (*File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	return &File{
		path:     abs,
		origin:   "file:" + abs,
		pipeline: pipeline,
		log:      opts.Logger,
		debounce: opts.Debounce,
		onWatch:  opts.OnWatch,
		watching: make(chan struct{}),
	}, nil
}

// Origin returns the origin the file's policies are contributed under.
func (f *File) Origin() string { return f.origin }

// Path returns the file's absolute path.
func (f *File) Path() string { return f.path }

// Load reads the file and applies its policies, even if its content did not change. It returns
// the reason the content was rejected, if it was.
func (f *File) Load() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loadLocked(true)
}

// reload is Load for a watch event: content already tried, good or bad, is not tried again.
func (f *File) reload() {
	f.mu.Lock()
	defer f.mu.Unlock()
	_ = f.loadLocked(false) // logged and counted by the pipeline
}

func (f *File) loadLocked(force bool) error {
	content, err := readPolicyFile(f.path)
	if err != nil {
		if !force && f.loaded && f.content == nil && f.readErr == err.Error() {
			return err // the same failure again (still missing, say): already reported
		}
		f.loaded, f.content, f.readErr = true, nil, err.Error()
		f.pipeline.Fail(f.origin, err)
		return err
	}
	if !force && f.loaded && f.content != nil && bytes.Equal(content, f.content) {
		return nil // an event that did not change the content
	}
	f.loaded, f.content, f.readErr = true, content, ""
	policies, err := v1alpha1.DecodePolicies(content)
	if err == nil && len(policies) == 0 {
		err = ErrNoPolicies
	}
	if err != nil {
		err = fmt.Errorf("policy file %s: %w", f.path, err)
		f.pipeline.Fail(f.origin, err)
		return err
	}
	ptrs := make([]*v1alpha1.RateLimitPolicy, len(policies))
	for i := range policies {
		ptrs[i] = &policies[i]
	}
	if err := f.pipeline.Apply(f.origin, ptrs); err != nil {
		return fmt.Errorf("policy file %s: %w", f.path, err)
	}
	return nil
}

func readPolicyFile(path string) ([]byte, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read policy file: %w", err)
	}
	// Only read: what was read is checked below, and a failed close of it loses nothing.
	defer func() { _ = fd.Close() }()
	content, err := io.ReadAll(io.LimitReader(fd, MaxPolicyFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read policy file %s: %w", path, err)
	}
	if len(content) > MaxPolicyFileSize {
		return nil, fmt.Errorf("policy file %s is larger than %d bytes", path, MaxPolicyFileSize)
	}
	return content, nil
}

// Watching returns a channel closed once Watch watches the file's directory, so that every
// later change is seen.
func (f *File) Watching() <-chan struct{} { return f.watching }

// Watch reloads the file whenever it may have changed, until ctx is done. It watches the
// file's directory, not the file, so that every way of replacing it is seen: writes in place,
// renames over it (editors, atomic replaces), and the symlink swaps of a Kubernetes ConfigMap
// volume; it also watches the directory of the file's symlink target. A directory that is
// deleted or moved away is watched again as soon as it is back (tried every 100 ms; logged,
// and reported to FileOptions.OnWatch), and the file reloaded. Events are debounced; content
// already tried is not tried again. Watch first reloads once, to catch a change made since
// the last Load. It returns an error only if the watch cannot be set up. Call it once.
func (f *File) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch policy file %s: %w", f.path, err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			f.log.Warn("policy file watch not closed", "path", f.path, "error", err)
		}
	}()
	dir := filepath.Dir(f.path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch policy file directory %s: %w", dir, err)
	}
	watched := map[string]bool{dir: true}
	f.watchTarget(w, watched)
	f.watchingOnce.Do(func() { close(f.watching) })
	f.log.Info("policy file watched", "path", f.path)
	f.reload()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var (
		burstStart time.Time        // zero: no reload pending
		rewatch    *time.Ticker     // while dir is not watched
		retry      <-chan time.Time // rewatch.C, nil while dir is watched
	)
	defer func() {
		if rewatch != nil {
			rewatch.Stop()
		}
	}()
	lost := func() {
		if retry != nil {
			return
		}
		f.log.Warn("policy file directory gone: not watched until it is back", "path", f.path, "dir", dir)
		if f.onWatch != nil {
			f.onWatch(false)
		}
		rewatch = time.NewTicker(rewatchInterval)
		retry = rewatch.C
	}
	// watchDir watches dir again if it is back, and reports whether it is watched.
	watchDir := func() bool {
		if watched[dir] {
			return true
		}
		if w.Add(dir) != nil {
			return false
		}
		watched[dir] = true
		if retry != nil {
			rewatch.Stop()
			rewatch, retry = nil, nil
			f.log.Info("policy file directory watched again", "path", f.path, "dir", dir)
			if f.onWatch != nil {
				f.onWatch(true)
			}
		}
		return true
	}
	arm := func() {
		now := time.Now()
		if burstStart.IsZero() {
			burstStart = now
		}
		// Wait for quiet, but no longer than 2*debounce after the burst started.
		wait := min(f.debounce, burstStart.Add(2*f.debounce).Sub(now))
		timer.Reset(max(wait, 0))
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Remove|fsnotify.Rename) && watched[ev.Name] {
				delete(watched, ev.Name) // a watched directory went away; rewatched if it returns
				if ev.Name == dir {
					// The watch of a deleted directory is gone for good: without one, nothing
					// tells when it is back.
					_ = w.Remove(dir)
					lost()
				}
			}
			arm()
		case <-retry:
			if watchDir() {
				f.reload() // the file may be back already: its events came before the watch
				f.watchTarget(w, watched)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			f.log.Warn("policy file watch error", "path", f.path, "error", err)
			arm() // events may have been lost
		case <-timer.C:
			burstStart = time.Time{}
			if !watchDir() {
				lost()
			}
			f.reload()
			f.watchTarget(w, watched)
		}
	}
}

// watchTarget also watches the directory of the file's symlink target, when it has one.
func (f *File) watchTarget(w *fsnotify.Watcher, watched map[string]bool) {
	target, err := filepath.EvalSymlinks(f.path)
	if err != nil {
		return
	}
	dir := filepath.Dir(target)
	if watched[dir] {
		return
	}
	if err := w.Add(dir); err != nil {
		f.log.Warn("policy file target not watched", "path", f.path, "target", target, "error", err)
		return
	}
	watched[dir] = true
}
