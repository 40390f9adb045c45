package server

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
)

const budgetAllow = `{"policy":"default/api","key":"alice","cost":1}`

// budgetDecisions returns the decisions API of one generous policy with a body budget of bytes.
func budgetDecisions(t *testing.T, bytes int64) *Decisions {
	t.Helper()
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 1000, 1000, time.Second)))
	return NewDecisions(e, nil, WithBodyBudget(bytes))
}

// heldRequest is a request whose handler is reading a body that has not all arrived.
type heldRequest struct {
	body *io.PipeWriter
	rec  *httptest.ResponseRecorder
	done chan struct{}
}

// holdBody starts h on a POST to path declaring declared bytes (-1: chunked) and returns once
// the handler has read its first byte, so it holds its share of the budget.
func holdBody(t *testing.T, h http.Handler, path string, declared int64) *heldRequest {
	t.Helper()
	pr, pw := io.Pipe()
	r := httptest.NewRequest(http.MethodPost, path, pr)
	r.ContentLength = declared
	hr := &heldRequest{body: pw, rec: httptest.NewRecorder(), done: make(chan struct{})}
	go func() {
		defer close(hr.done)
		h.ServeHTTP(hr.rec, r)
	}()
	if _, err := pw.Write([]byte("{")); err != nil { // returns once the handler reads it
		t.Fatalf("write the first byte: %v", err)
	}
	return hr
}

// wait returns the held request's answer once it is given.
func (hr *heldRequest) wait(t *testing.T) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case <-hr.done:
		return hr.rec
	case <-time.After(10 * time.Second):
		t.Fatal("held request not answered")
		return nil
	}
}

// wantBusy checks that a is the budget's refusal: 503, Retry-After, Connection: close, a JSON
// error.
func wantBusy(t *testing.T, a answer) {
	t.Helper()
	if a.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d %s, want 503", a.status, a.body)
	}
	if got := a.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1", got)
	}
	if got := a.header.Get("Connection"); got != "close" {
		t.Errorf("Connection = %q, want close", got)
	}
	if msg := a.errorText(t); !strings.Contains(msg, "busy") {
		t.Errorf("error %q does not say the server is busy", msg)
	}
}

// A request whose declared body does not fit in what is left of the budget is refused at once;
// the budget comes back when the holder is answered, whether its body arrived whole or was cut.
func TestBodyBudgetRefusesWhenSpentAndComesBack(t *testing.T) {
	for _, end := range []string{"whole", "cut"} {
		t.Run(end, func(t *testing.T) {
			h := budgetDecisions(t, 60) // room for one budgetAllow (48 bytes), not two
			held := holdBody(t, h, "/v1/allow", int64(len(budgetAllow)))

			// len(budgetAllow) bytes are taken: a second body of the same length does not fit.
			wantBusy(t, serve(t, h, http.MethodPost, "/v1/allow", budgetAllow))
			// GETs read no body and take nothing.
			if a := serve(t, h, http.MethodGet, "/v1/allow?policy=default/api&key=bob", ""); a.status != http.StatusOK {
				t.Fatalf("GET while the budget is spent: %d %s", a.status, a.body)
			}

			want := http.StatusOK
			if end == "whole" {
				_, _ = held.body.Write([]byte(budgetAllow[1:]))
				_ = held.body.Close()
			} else {
				_ = held.body.CloseWithError(errors.New("connection reset"))
				want = http.StatusBadRequest
			}
			if rec := held.wait(t); rec.Code != want {
				t.Fatalf("held request: %d %s, want %d", rec.Code, rec.Body, want)
			}
			if a := serve(t, h, http.MethodPost, "/v1/allow", budgetAllow); a.status != http.StatusOK {
				t.Fatalf("after the holder was answered: %d %s, want 200", a.status, a.body)
			}
			if free := h.bodies.free.Load(); free != 60 {
				t.Errorf("budget has %d bytes free after every request ended, want 60", free)
			}
		})
	}
}

// A body that declares no length takes its path's whole limit; a declared length over the limit
// takes nothing and is refused unread.
func TestBodyBudgetTakesTheLimitOfAChunkedBody(t *testing.T) {
	h := budgetDecisions(t, MaxBatchBodyBytes)
	held := holdBody(t, h, "/v1/allow:batch", -1)
	if got := h.bodies.free.Load(); got != 0 {
		t.Fatalf("a chunked batch left %d bytes free, want 0", got)
	}
	wantBusy(t, serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"x"}`))

	r := httptest.NewRequest(http.MethodPost, "/v1/allow", strings.NewReader(budgetAllow))
	r.ContentLength = MaxBodyBytes + 1
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("declared past the limit while the budget is spent: %d, want 413", rec.Code)
	}

	_ = held.body.CloseWithError(io.ErrUnexpectedEOF)
	held.wait(t)
	if got := h.bodies.free.Load(); got != MaxBatchBodyBytes {
		t.Fatalf("after the batch: %d bytes free, want %d", got, MaxBatchBodyBytes)
	}
}

// Requests that are refused after their body is read (malformed, unknown policy) give their
// bytes back too.
func TestBodyBudgetComesBackAfterErrors(t *testing.T) {
	h := budgetDecisions(t, 1000)
	for _, tc := range []struct{ path, body string }{
		{"/v1/allow", `{"policy":`},
		{"/v1/allow", `{"policy":"default/none","key":"a"}`},
		{"/v1/allow:batch", `{"items":[{"key":"a"},{"policy":"default/none","key":"b"}]}`},
		{"/v1/allow:batch", `[`},
		{"/v1/refund", `{"reservation":"forged"}`},
		{"/v1/release", `{"lease":"forged"}`},
	} {
		serve(t, h, http.MethodPost, tc.path, tc.body)
		if got := h.bodies.free.Load(); got != 1000 {
			t.Fatalf("after %s %s: %d bytes free, want 1000", tc.path, tc.body, got)
		}
	}
}
