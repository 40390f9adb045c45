package server

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// bodyRequest returns a POST whose body is body and whose declared length is declared (-1:
// none, as a chunked body).
func bodyRequest(body string, declared int64) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/allow:batch", io.NopCloser(strings.NewReader(body)))
	r.ContentLength = declared
	return r
}

// The buffer a body is read into never holds more than the body may: its declared length, or
// for a chunked body the limit, never a doubling past it.
func TestReadBodyBuffersNoMoreThanTheBodyMayHold(t *testing.T) {
	const limit = 10_000
	for _, tc := range []struct {
		name     string
		body     int   // bytes sent
		declared int64 // Content-Length, -1 for none
		status   int
		maxCap   int
	}{
		{name: "declared", body: 3000, declared: 3000, maxCap: 3000},
		{name: "declared at the limit", body: limit, declared: limit, maxCap: limit},
		{name: "empty", body: 0, declared: 0, maxCap: 0},
		{name: "chunked", body: 3000, declared: -1, maxCap: 4096},
		{name: "chunked at the limit", body: limit, declared: -1, maxCap: limit},
		{name: "chunked past the limit", body: limit + 1, declared: -1, status: http.StatusRequestEntityTooLarge, maxCap: limit},
		{name: "declared past the limit", body: limit + 1, declared: limit + 1, status: http.StatusRequestEntityTooLarge, maxCap: 0},
		// A lying Content-Length gets no more room than it declared: the reader stops there.
		{name: "more sent than declared", body: 5000, declared: 100, status: http.StatusRequestEntityTooLarge, maxCap: 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.Repeat("x", tc.body)
			tooLarge := errors.New("too large")
			buf, status, err := readBodyUpTo(httptest.NewRecorder(), bodyRequest(body, tc.declared), nil, limit, tooLarge)
			if status != tc.status {
				t.Fatalf("status = %d (%v), want %d", status, err, tc.status)
			}
			if cap(buf) > tc.maxCap {
				t.Errorf("buffer capacity %d, want at most %d", cap(buf), tc.maxCap)
			}
			if tc.status == 0 && string(buf) != body {
				t.Errorf("read %d bytes, want the %d sent", len(buf), len(body))
			}
		})
	}
}

// A pooled buffer with room enough is read into as it is, with no allocation.
func TestReadBodyReusesARoomyBuffer(t *testing.T) {
	buf := make([]byte, 0, 4096)
	got, status, err := readBodyUpTo(httptest.NewRecorder(), bodyRequest("hello", 5), buf, 100, errBodyTooLarge)
	if status != 0 || string(got) != "hello" || &got[:1][0] != &buf[:1][0] {
		t.Fatalf("got %q, %d, %v; want hello read into the given buffer", got, status, err)
	}
}
