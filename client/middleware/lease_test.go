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
	"time"

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

// extensions is a transport that tells granted of each extension limiterd granted (POST
// /v1/release with "extend":true answered 200), and refused of each it refused. With steal, it
// releases the lease before it sends an extension, as another holder of its token could: the
// extension is then refused (409).
type extensions struct {
	granted, refused chan struct{}
	steal            bool
}

func (e *extensions) RoundTrip(r *http.Request) (*http.Response, error) {
	extend := false
	if r.URL.Path == "/v1/release" && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		extend = strings.Contains(string(body), `"extend":true`)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		if extend && e.steal {
			steal := strings.Replace(string(body), `"extend":true`, `"extend":false`, 1)
			req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, r.URL.String(), strings.NewReader(steal))
			if err != nil {
				return nil, err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil {
				return nil, err
			}
			_ = resp.Body.Close()
		}
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && extend {
		tell := e.granted
		if resp.StatusCode != http.StatusOK {
			tell = e.refused
		}
		select {
		case tell <- struct{}{}:
		default: // nobody waits for this one
		}
	}
	return resp, err
}

// TestExtendEvery checks that ExtendEvery extends the lease while the handler runs (the place
// stays held through extensions) and releases the newest lease when it returns: releasing the
// first, spent by the extensions, would be refused and keep the place.
func TestExtendEvery(t *testing.T) {
	ext := &extensions{granted: make(chan struct{})}
	c := startLimiterd(t, concurrencyPolicy, client.WithHTTPClient(&http.Client{Transport: ext}))
	var failed releaseErrors
	var inner []int
	var h http.Handler
	h = middleware.New(c, middleware.ExtendEvery(time.Millisecond), middleware.OnReleaseError(failed.hook))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Inner") != "" {
				return
			}
			<-ext.granted // the test times out if ExtendEvery extends nothing
			<-ext.granted
			inner = append(inner, get(h, "192.0.2.7:4711", "X-Inner", "1").Code)
			_, _ = io.WriteString(w, "hello")
		}))
	for i := range 2 {
		if w := get(h, "192.0.2.7:4711"); w.Code != 200 || w.Body.String() != "hello" {
			t.Fatalf("request %d: %d %q, want 200 hello: the newest lease was not released", i, w.Code, w.Body)
		}
	}
	if len(inner) != 2 || inner[0] != 429 || inner[1] != 429 {
		t.Errorf("requests made from inside the handler after extensions: %v, want 429s", inner)
	}
	if errs := failed.get(); len(errs) != 0 {
		t.Errorf("release errors: %v", errs)
	}
}

// TestExtendEveryRefused checks that once an extension is refused (the lease was released by
// another holder of its token), the middleware tells OnReleaseError, stops extending, and does
// not release the spent lease: one error, the extension's 409.
func TestExtendEveryRefused(t *testing.T) {
	ext := &extensions{refused: make(chan struct{}), steal: true}
	c := startLimiterd(t, concurrencyPolicy, client.WithHTTPClient(&http.Client{Transport: ext}))
	var failed releaseErrors
	h := middleware.New(c, middleware.ExtendEvery(time.Millisecond), middleware.OnReleaseError(failed.hook))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-ext.refused // the test times out if ExtendEvery extends nothing
			_, _ = io.WriteString(w, "hello")
		}))
	if w := get(h, "192.0.2.7:4711"); w.Code != 200 || w.Body.String() != "hello" {
		t.Fatalf("%d %q, want 200 hello", w.Code, w.Body)
	}
	var e *client.Error
	if errs := failed.get(); len(errs) != 1 || !errors.As(errs[0], &e) || e.StatusCode != 409 {
		t.Errorf("release errors: %v, want the extension's 409 alone", errs)
	}
}
