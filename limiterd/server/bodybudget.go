package server

import (
	"net/http"
	"sync/atomic"
)

// bodyBudget bounds the bytes of request bodies a server holds at once (WithBodyBudget): a
// semaphore of bytes that is never waited on. A nil budget admits every body.
type bodyBudget struct{ free atomic.Int64 }

// take takes n bytes of the budget and reports whether there were that many free.
func (b *bodyBudget) take(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	for {
		free := b.free.Load()
		if free < n {
			return false
		}
		if b.free.CompareAndSwap(free, free-n) {
			return true
		}
	}
}

// give returns n bytes to the budget, taken before by take.
func (b *bodyBudget) give(n int64) {
	if b != nil && n > 0 {
		b.free.Add(n)
	}
}

// WithBodyBudget bounds the bytes of request bodies the decisions API reads and holds at once,
// over all its requests, to bytes: a POST must take, before its body is read, the bytes its body
// may hold (its Content-Length, or the body limit of its path when it declares none, as a
// chunked body: MaxBodyBytes, or MaxBatchBodyBytes for a batch), and gives them back when it is
// answered, whatever the outcome (a malformed or cut-off body included). A request that finds
// too few bytes free is answered at once, without reading its body, with 503, Retry-After: 1,
// Connection: close and {"error": "..."}, and spends nothing. A request whose Content-Length is
// over its path's limit takes nothing: it is answered 413 unread.
//
// bytes should be at least MaxBatchBodyBytes, or chunked batches are never served. Without
// this option bodies are not bounded together.
func WithBodyBudget(bytes int64) DecisionsOption {
	return func(h *Decisions) {
		h.bodies = new(bodyBudget)
		h.bodies.free.Store(bytes)
	}
}

// errBodyBudget is the error of a request refused for the budget of bodies; an error, not an
// errRequest, so that it is not boxed anew for each refusal.
var errBodyBudget error = errRequest("server busy: too many request bodies in flight, retry later")

// bodyBusyRetryAfter is the Retry-After of a request refused for the budget of bodies:
// requests are answered within milliseconds, or cut after the read timeout.
var bodyBusyRetryAfter = []string{"1"}

// connectionClose asks net/http to close the connection after the answer.
var connectionClose = []string{"close"}

// readBodyInBudget takes from the budget the bytes r's body may hold under limit, then reads it
// into buf (readBodyUpTo). It returns the bytes taken, to give back when the request is
// answered, even on an error; refused for the budget, it sets the answer's Retry-After and
// Connection fields and returns 503.
func (h *Decisions) readBodyInBudget(w http.ResponseWriter, r *http.Request, buf []byte, limit int64, tooLarge error) (
	_ []byte, taken int64, status int, err error) {
	if r.ContentLength > limit {
		return buf, 0, http.StatusRequestEntityTooLarge, tooLarge
	}
	taken = bodyBytes(r, limit)
	if !h.bodies.take(taken) {
		hdr := w.Header()
		hdr[headerRetryAfter] = bodyBusyRetryAfter
		hdr["Connection"] = connectionClose
		return buf, 0, http.StatusServiceUnavailable, errBodyBudget
	}
	buf, status, err = readBodyUpTo(w, r, buf, limit, tooLarge)
	return buf, taken, status, err
}
