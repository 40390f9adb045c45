package server

import (
	"context"
	"net/http"
	"strconv"

	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/internal/jsonscan"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

// ReleaseRequest is a lease's release or extension: POST /v1/release {"lease": "...",
// "extend": false}.
type ReleaseRequest struct {
	// Lease is the token of the lease to end or extend (the "lease" of an admitted decision's
	// answer, or of an extension's): 1 to reservation.MaxTokenBytes bytes.
	Lease string
	// Extend asks for the lease to be extended, by the tier's lease timeout from now, instead of
	// released.
	Extend bool
}

var errLeaseTooLong = errRequest("lease is longer than " + strconv.Itoa(reservation.MaxTokenBytes) + " bytes")

const (
	errLeaseMissing = errRequest("lease is required: the lease of the admitted decision to release or extend")
	errLeaseUTF8    = errRequest("lease is not valid UTF-8")
	errExtendBool   = errRequest("extend must be true or false")
	errLeaseTimeout = errRequest("the policy sets the lease timeout, not the caller: a release names the lease and extend only")
)

// The fields of a release's JSON, by their index in releaseFields: the known ones, then those
// a caller might send to choose a timeout, refused with errLeaseTimeout.
const (
	releaseLease = iota
	releaseExtend
	releaseTimeout
	releaseLeaseTimeout
	releaseTTL
)

var releaseFields = jsonFields{
	names: []string{
		releaseLease: "lease", releaseExtend: "extend",
		releaseTimeout: "timeout", releaseLeaseTimeout: "leaseTimeout", releaseTTL: "ttl",
	},
	known: "lease, extend",
}

// DecodeReleaseRequest decodes a JSON release request, as strictly as DecodeRefundRequest: an
// object with the fields "lease" (string, required) and "extend" (true, false or null: false),
// each at most once, and nothing after it. A field that would choose the lease's timeout
// (timeout, leaseTimeout, ttl) is refused with a message that says the policy sets it. Every
// error is an errRequest whose text can be shown to the client.
func DecodeReleaseRequest(body []byte) (ReleaseRequest, error) {
	d := jsonDecoder{Scanner: jsonscan.Scanner{Data: body}}
	var req ReleaseRequest
	err := d.object(&releaseFields, func(field int) error {
		var err error
		switch field {
		case releaseLease:
			if req.Lease, err = d.str(reservation.MaxTokenBytes); err != nil {
				return fieldErr(err, errLeaseTooLong, errLeaseUTF8, "lease must be a string")
			}
		case releaseExtend:
			switch {
			case d.Literal("true"):
				req.Extend = true
			case d.Literal("false"), d.Literal("null"):
			default:
				return errExtendBool
			}
		default: // timeout, leaseTimeout, ttl
			return errLeaseTimeout
		}
		return nil
	})
	switch {
	case err != nil:
		return ReleaseRequest{}, err
	case req.Lease == "":
		return ReleaseRequest{}, errLeaseMissing
	}
	return req, nil
}

// release serves POST /v1/release: it answers 200 with the decision JSON of a peek after the
// release or extension, with "released" or "extended" and, for an extension, the new lease
// (see the package documentation), or an error.
func (h *Decisions) release(w http.ResponseWriter, r *http.Request) {
	servePost(h, w, r, DecodeReleaseRequest, func(ctx context.Context, req ReleaseRequest) (engine.Result, error) {
		return h.engine.Release(ctx, req.Lease, req.Extend)
	})
}
