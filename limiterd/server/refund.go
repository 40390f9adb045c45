package server

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/internal/jsonscan"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

// RefundRequest is a refund: POST /v1/refund {"reservation": "...", "cost": 3}.
type RefundRequest struct {
	// Reservation is the reservation of the admitted decision whose units come back: 1 to
	// reservation.MaxTokenBytes bytes.
	Reservation string
	// Cost is how many of them, 1 to MaxCost (at most the reservation's cost); 0 when the
	// request names none: all of them.
	Cost int64
}

var (
	errRefundCost         = errRequest("cost must be an integer between 1 and " + strconv.Itoa(MaxCost))
	errReservationTooLong = errRequest("reservation is longer than " + strconv.Itoa(reservation.MaxTokenBytes) + " bytes")
)

const (
	errReservationMissing = errRequest("reservation is required: the reservation of the admitted decision to refund")
	errReservationUTF8    = errRequest("reservation is not valid UTF-8")
	errRefundByKey        = errRequest(`a refund names the reservation of an admitted decision, not a policy, key and amount: {"reservation": "...", "cost": n}`)
)

// The fields of a refund's JSON, by their index in refundFields: the known ones, then those of
// the refunds before reservations, refused with errRefundByKey.
const (
	refundReservation = iota
	refundCost
	refundPolicy
	refundKey
	refundAmount
)

var refundFields = jsonFields{
	names: []string{
		refundReservation: "reservation", refundCost: "cost",
		refundPolicy: "policy", refundKey: "key", refundAmount: "amount",
	},
	known: "reservation, cost",
}

// DecodeRefundRequest decodes a JSON refund request, as strictly as DecodeAllowRequest: an
// object with the fields "reservation" (string, required) and "cost" (an integer literal from 1
// to MaxCost, or null: the reservation's whole cost), each at most once, and nothing after it.
// The fields of the refunds before reservations (policy, key, amount) are refused with a
// message that says so. Every error is an errRequest whose text can be shown to the client.
func DecodeRefundRequest(body []byte) (RefundRequest, error) {
	d := jsonDecoder{Scanner: jsonscan.Scanner{Data: body}}
	var req RefundRequest
	err := d.object(&refundFields, func(field int) error {
		var err error
		switch field {
		case refundReservation:
			if req.Reservation, err = d.str(reservation.MaxTokenBytes); err != nil {
				return fieldErr(err, errReservationTooLong, errReservationUTF8, "reservation must be a string")
			}
		case refundCost:
			if d.Literal("null") {
				return nil
			}
			if req.Cost, err = d.cost(); err != nil {
				if errors.Is(err, errCost) {
					return errRefundCost
				}
				return err
			}
			if req.Cost < 1 {
				return errRefundCost
			}
		default: // policy, key, amount
			return errRefundByKey
		}
		return nil
	})
	switch {
	case err != nil:
		return RefundRequest{}, err
	case req.Reservation == "":
		return RefundRequest{}, errReservationMissing
	}
	return req, nil
}

// refund serves POST /v1/refund: it answers 200 with the decision JSON of a peek after the
// refund (see the package documentation), or an error.
func (h *Decisions) refund(w http.ResponseWriter, r *http.Request) {
	servePost(h, w, r, DecodeRefundRequest, func(ctx context.Context, req RefundRequest) (engine.Result, error) {
		return h.engine.Refund(ctx, req.Reservation, req.Cost)
	})
}

// servePost serves a POST whose JSON body decode reads (400 when it cannot) and act carries out
// on the engine: 200 with the decision JSON of act's answer, or act's error as writeEngineError
// words it. The body is read within the handler's bounds (readBody).
func servePost[Req any](h *Decisions, w http.ResponseWriter, r *http.Request, decode func([]byte) (Req, error), act func(context.Context, Req) (engine.Result, error)) {
	if r.Method != http.MethodPost {
		w.Header()["Allow"] = allowPost
		writeError(w, http.StatusMethodNotAllowed, "use POST")
		return
	}
	buf := buffers.Get().(*buffer)
	defer buffers.Put(buf)
	var (
		taken  int64
		status int
		err    error
	)
	buf.b, taken, status, err = h.readBody(w, r, buf.b[:0])
	defer h.bodies.give(taken)
	if err != nil {
		writeError(w, status, err.Error())
		return
	}
	req, err := decode(buf.b)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	res, err := act(r.Context(), req)
	if err != nil {
		h.writeEngineError(w, err)
		return
	}
	h.setLegacyHeaders(w, &res)
	writeAnswer(w, &res, http.StatusOK)
}
