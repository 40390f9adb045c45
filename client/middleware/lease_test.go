package middleware_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/client/middleware"
)

// concurrencyPolicy is default/jobs: one request per client in flight, a lease held for 30s at
// most.
const concurrencyPolicy = `
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: jobs
spec:
  defaultTier: reports
  tiers:
    - name: reports
      algorithm: Concurrency
      concurrency: {limit: 1, leaseTimeout: 30s}
`

// releaseErrors records the errors of the OnReleaseError hook.
type releaseErrors struct {
	mu   sync.Mutex
	errs []error
}

func (e *releaseErrors) hook(_ *http.Request, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, err)
}

func (e *releaseErrors) get() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.errs...)
}

// TestLeaseHeldWhileHandlerRuns checks that, with a concurrency limit of 1, a request made from
// inside a running handler is rejected (the place is held during the handler), while
// sequential requests all pass: each releases its place when its handler returns. The lease's
// token does not reach the response.
func TestLeaseHeldWhileHandlerRuns(t *testing.T) {
	var failed releaseErrors
	var inner []int
	var h http.Handler
	h = middleware.New(startLimiterd(t, concurrencyPolicy), middleware.OnReleaseError(failed.hook))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Inner") == "" {
				inner = append(inner, get(h, "192.0.2.7:4711", "X-Inner", "1").Code)
			}
			_, _ = io.WriteString(w, "hello")
		}))
	for i := range 3 {
		w := get(h, "192.0.2.7:4711")
		if w.Code != 200 || w.Body.String() != "hello" {
			t.Fatalf("request %d: %d %q, want 200 hello: its place was not released", i, w.Code, w.Body)
		}
		if got := w.Header().Get("Limiterd-Lease"); got != "" {
			t.Errorf("request %d: the response carries the lease %q", i, got)
		}
		if got := w.Header().Get("RateLimit"); got != `"reports";r=0;t=30` {
			t.Errorf("request %d: RateLimit %q", i, got)
		}
	}
	for i, code := range inner {
		if code != http.StatusTooManyRequests {
			t.Errorf("request %d made from inside the handler: %d, want 429 while the place is held", i, code)
		}
	}
	if len(inner) != 3 {
		t.Errorf("%d requests made from inside the handler, want 3", len(inner))
	}
	if errs := failed.get(); len(errs) != 0 {
		t.Errorf("release errors: %v", errs)
	}
}

// TestPanickingHandlerReleases checks that a handler that panics still releases its place, and
// that its panic reaches the caller.
func TestPanickingHandlerReleases(t *testing.T) {
	var failed releaseErrors
	limit := middleware.New(startLimiterd(t, concurrencyPolicy), middleware.OnReleaseError(failed.hook))
	boom := errors.New("boom")
	panicking := limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(boom) }))
	got := func() (v any) {
		defer func() { v = recover() }()
		get(panicking, "192.0.2.7:4711")
		return nil
	}()
	if got != boom {
		t.Fatalf("recovered %v, want the handler's panic", got)
	}
	if w := get(limit(&app{}), "192.0.2.7:4711"); w.Code != 200 {
		t.Fatalf("after a panicking handler: %d, want 200: its place was not released", w.Code)
	}
	if errs := failed.get(); len(errs) != 0 {
		t.Errorf("release errors: %v", errs)
	}
}

// TestCancelledRequestReleases checks that a request whose context is cancelled while its
// handler runs (its client went away) still releases its place.
func TestCancelledRequestReleases(t *testing.T) {
	var failed releaseErrors
	limit := middleware.New(startLimiterd(t, concurrencyPolicy), middleware.OnReleaseError(failed.hook))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancel()
		<-r.Context().Done()
		_, _ = io.WriteString(w, "too late")
	}))
	r := httptest.NewRequest(http.MethodGet, "/orders", nil).WithContext(ctx)
	r.RemoteAddr = "192.0.2.7:4711"
	h.ServeHTTP(httptest.NewRecorder(), r)
	if errs := failed.get(); len(errs) != 0 {
		t.Errorf("release errors: %v", errs)
	}
	if w := get(limit(&app{}), "192.0.2.7:4711"); w.Code != 200 {
		t.Fatalf("after a cancelled request: %d, want 200: its place was not released", w.Code)
	}
}

// TestFailedReleaseKeepsResponse checks that a release that fails (limiterd went away while the
// handler ran) is told to OnReleaseError, as client.Unavailable, and leaves the handler's
// response as it is; and that the default hook logs it.
func TestFailedReleaseKeepsResponse(t *testing.T) {
	for _, defaultHook := range []bool{false, true} {
		c, stop, err := newLimiterd(concurrencyPolicy)
		if err != nil {
			t.Fatal(err)
		}
		var failed releaseErrors
		opts := []middleware.Option{middleware.OnReleaseError(failed.hook)}
		var buf strings.Builder
		var mu sync.Mutex
		if defaultHook {
			opts = nil
			prev := testingLogger(&buf, &mu)
			defer prev()
		}
		// The handler writes nothing: an answer written after it would be the response.
		h := middleware.New(c, opts...)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { stop() }))
		w := get(h, "192.0.2.7:4711")
		if w.Code != 200 || w.Body.Len() != 0 {
			t.Errorf("default hook %t: %d %q, want the handler's empty 200", defaultHook, w.Code, w.Body)
		}
		if defaultHook {
			mu.Lock()
			out := buf.String()
			mu.Unlock()
			if !strings.Contains(out, `"msg":"lease release failed"`) || !strings.Contains(out, `"path":"/orders"`) {
				t.Errorf("log: %s", out)
			}
			continue
		}
		if errs := failed.get(); len(errs) != 1 || !client.Unavailable(errs[0]) {
			t.Errorf("release errors: %v, want one that is client.Unavailable", errs)
		}
	}
}
