package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// errBatchTooLarge is an error, not an errRequest, so that passing it to readBodyUpTo does not
// box its text anew for each batch (as errBodyTooLarge).
var errBatchTooLarge error = errRequest("body is larger than " + strconv.Itoa(MaxBatchBodyBytes) + " bytes")

// batchScratch is the pooled scratch of one batch.
type batchScratch struct {
	body    []byte
	items   []BatchItem
	decide  []engine.BatchItem   // the items that are requests
	results []engine.BatchResult // their answers
	answer  []byte
}

var batchScratches = sync.Pool{New: func() any { return new(batchScratch) }}

// release returns the scratch to the pool without the keys and policies it refers to.
func (sc *batchScratch) release() {
	clear(sc.items)
	clear(sc.decide)
	clear(sc.results)
	batchScratches.Put(sc)
}

// batch answers POST /v1/allow:batch: every item's decision, in the order of the items, in one
// engine call (engine.DecideBatch).
func (h *Decisions) batch(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header()["Allow"] = allowPost
		writeError(w, http.StatusMethodNotAllowed, "use POST")
		return
	}
	sc := batchScratches.Get().(*batchScratch)
	defer sc.release()
	var (
		status int
		taken  int64
		err    error
	)
	sc.body, taken, status, err = h.readBodyInBudget(w, r, sc.body[:0], MaxBatchBodyBytes, errBatchTooLarge)
	defer h.bodies.give(taken)
	if err != nil {
		writeError(w, status, err.Error())
		return
	}
	if sc.items, err = DecodeBatchRequest(sc.body, sc.items[:0]); err != nil {
		status = http.StatusBadRequest
		if errors.Is(err, ErrTooManyItems) {
			status = http.StatusRequestEntityTooLarge
		}
		writeError(w, status, err.Error())
		return
	}
	sc.decide = sc.decide[:0]
	for i := range sc.items {
		if it := &sc.items[i]; it.Err == nil {
			sc.decide = append(sc.decide, engine.BatchItem{Policy: v1alpha1.RequestedPolicyID(it.Policy), Key: it.Key, Cost: it.Cost})
		}
	}
	if cap(sc.results) < len(sc.decide) {
		sc.results = make([]engine.BatchResult, len(sc.decide))
	}
	sc.results = sc.results[:len(sc.decide)]
	if err := h.engine.DecideBatch(r.Context(), sc.decide, sc.results); err != nil {
		h.writeEngineError(w, err)
		return
	}
	b := sc.answer[:0]
	b = append(b, `{"results":[`...)
	next := 0
	for i := range sc.items {
		if i > 0 {
			b = append(b, ',')
		}
		if err := sc.items[i].Err; err != nil {
			b = appendItemError(b, err.Error(), http.StatusBadRequest)
			continue
		}
		res := &sc.results[next]
		next++
		if res.Err != nil {
			b = appendItemError(b, res.Err.Error(), engineErrorStatus(res.Err, h.log))
			continue
		}
		// As a single call's 429: a retry time unless no wait admits the cost.
		b = appendDecision(b, &res.Result, !res.Allowed && res.RetryAfter > 0)
	}
	b = append(b, "]}\n"...)
	sc.answer = b
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// appendItemError appends the answer to an item that was not decided.
func appendItemError(b []byte, msg string, status int) []byte {
	quoted, err := json.Marshal(msg)
	if err != nil { // unreachable: a string always marshals
		quoted = []byte(`"internal error"`)
	}
	b = append(b, `{"error":`...)
	b = append(b, quoted...)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	return append(b, '}')
}
