package server

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// RefundRequest is a refund: POST /v1/refund {"policy": "...", "key": "...", "amount": 3}.
type RefundRequest struct {
	// Policy is "<namespace>/<name>"; "" when the request names none (allowed when exactly one
	// policy is loaded).
	Policy string
	// Key identifies the client: at least 1 byte of UTF-8, of any length (see MaxKeyBytes).
	Key string
	// Amount is how many units to return, 1 to MaxCost.
	Amount int64
}

var errAmount = errRequest("amount is required: an integer between 1 and " + strconv.Itoa(MaxCost))

// DecodeRefundRequest decodes a JSON refund request, as strictly as DecodeAllowRequest: an
// object with the fields "policy" (string or null), "key" (string) and "amount" (an integer
// literal from 1 to MaxCost, required), each at most once, and nothing after it. Every error
// is an errRequest whose text can be shown to the client.
func DecodeRefundRequest(body []byte) (RefundRequest, error) {
	d := jsonDecoder{data: body}
	var (
		req                           RefundRequest
		haveKey, havePolicy, haveAmnt bool
	)
	d.skipSpace()
	if !d.consume('{') {
		return RefundRequest{}, errNotObject
	}
	d.skipSpace()
	if !d.consume('}') {
		for {
			name, err := d.bytes(maxFieldNameBytes)
			switch {
			case errors.Is(err, errStringTooLong):
				return RefundRequest{}, errRequest("unknown field (known: policy, key, amount)")
			case errors.Is(err, errNotString):
				return RefundRequest{}, d.syntax("a field name")
			case err != nil:
				return RefundRequest{}, err
			}
			d.skipSpace()
			if !d.consume(':') {
				return RefundRequest{}, d.syntax("':' after a field name")
			}
			d.skipSpace()
			switch string(name) {
			case "key":
				if haveKey {
					return RefundRequest{}, errDuplicateField
				}
				haveKey = true
				if req.Key, err = d.key(); err != nil {
					return RefundRequest{}, err
				}
			case "policy":
				if havePolicy {
					return RefundRequest{}, errDuplicateField
				}
				havePolicy = true
				if d.null() {
					break
				}
				if req.Policy, err = d.str(MaxPolicyBytes); err != nil {
					return RefundRequest{}, fieldErr(err, errPolicyTooLong, errPolicyUTF8, "policy must be a string")
				}
			case "amount":
				if haveAmnt {
					return RefundRequest{}, errDuplicateField
				}
				haveAmnt = true
				if req.Amount, err = d.cost(); err != nil {
					if errors.Is(err, errCost) {
						return RefundRequest{}, errAmount
					}
					return RefundRequest{}, err
				}
			default:
				return RefundRequest{}, errRequest(fmt.Sprintf("unknown field %s (known: policy, key, amount)", strconv.QuoteToASCII(string(name))))
			}
			d.skipSpace()
			if d.consume('}') {
				break
			}
			if !d.consume(',') {
				return RefundRequest{}, d.syntax("',' or '}' after a value")
			}
			d.skipSpace()
		}
	}
	d.skipSpace()
	switch {
	case d.pos != len(d.data):
		return RefundRequest{}, errTrailing
	case req.Key == "":
		return RefundRequest{}, errKeyMissing
	case req.Amount < 1:
		return RefundRequest{}, errAmount
	}
	return req, nil
}

// refund serves POST /v1/refund: it answers 200 with the decision JSON of a peek after the
// refund (see the package documentation), or an error.
func (h *Decisions) refund(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header()["Allow"] = allowPost
		writeError(w, http.StatusMethodNotAllowed, "use POST")
		return
	}
	buf := buffers.Get().(*buffer)
	defer buffers.Put(buf)
	var (
		status int
		err    error
	)
	if buf.b, status, err = readBody(w, r, buf.b[:0]); err != nil {
		writeError(w, status, err.Error())
		return
	}
	req, err := DecodeRefundRequest(buf.b)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	res, err := h.engine.Refund(r.Context(), v1alpha1.PolicyID(req.Policy), req.Key, req.Amount)
	if err != nil {
		if errors.Is(err, engine.ErrRefundNotApplied) {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		h.writeEngineError(w, err)
		return
	}
	h.setLegacyHeaders(w, &res)
	writeAnswer(w, &res, http.StatusOK)
}
