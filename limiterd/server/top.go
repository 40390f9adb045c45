package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/adminauth"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/heavyhitters"
)

// Bounds of GET /v1/top's n.
const (
	DefaultTopClients = 20
	MaxTopClients     = 1000
)

// TopAnswer is the body of GET /v1/top: the clients with the most decisions of one kind under a
// policy over the recent period, on this replica alone (a caller merges replicas by adding
// counts and errors of a key).
type TopAnswer struct {
	Policy  v1alpha1.PolicyID `json:"policy"`
	Replica string            `json:"replica"`
	// By is "admitted" or "rejected" (a dry-run tier's rejections count as rejected).
	By string `json:"by"`
	// From and To delimit the period counted, PeriodSeconds its length.
	From          time.Time `json:"from"`
	To            time.Time `json:"to"`
	PeriodSeconds int64     `json:"periodSeconds"`
	// Decisions is N, the decisions counted over the period; ErrorBound is N/k: no client's
	// error exceeds it, and every client with more than ErrorBound decisions is listed (when n
	// is large enough).
	Decisions  uint64      `json:"decisions"`
	ErrorBound uint64      `json:"errorBound"`
	Clients    []TopClient `json:"clients"`
}

// TopClient is one client of a TopAnswer: its true count of decisions over the period is
// between Count-Error and Count. Key is the stored key: a key of over 1,024 bytes is named by
// its digest (engine.ClientKey).
type TopClient struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
}

// top answers GET /v1/top?policy=…[&by=rejected|admitted][&n=20], authorized as reading the
// policy's clients.
func (a *Admin) top(w http.ResponseWriter, r *http.Request) {
	if !a.readOnly(w, r) {
		return
	}
	u, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	policyID, by, n, err := decodeTopQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	id, err := a.policyNamed(policyID)
	if err != nil {
		a.writeError(w, err)
		return
	}
	if !a.authorize(w, r, adminauth.PolicyClients(u, "get", id.Namespace(), id.Name())) {
		return
	}
	top, p, err := a.engine.TopClients(id, by, n)
	if errors.Is(err, engine.ErrTopClientsOff) {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	if err != nil {
		a.writeError(w, err)
		return
	}
	answer := TopAnswer{
		Policy: p.ID, Replica: a.replica, By: by.String(),
		From: top.From.UTC(), To: top.To.UTC(), PeriodSeconds: int64(top.To.Sub(top.From) / time.Second),
		Decisions: top.Total, ErrorBound: top.Bound,
		Clients: make([]TopClient, 0, len(top.Entries)),
	}
	for _, e := range top.Entries {
		answer.Clients = append(answer.Clients, TopClient{Key: e.Key, Count: e.Count, Error: e.Error})
	}
	writeJSON(w, http.StatusOK, answer, a.log)
}

// decodeTopQuery reads policy, by and n from GET /v1/top's query: by is rejected unless
// "admitted", n DefaultTopClients unless given, from 1 to MaxTopClients. Unknown or repeated
// parameters are rejected.
func decodeTopQuery(rawQuery string) (policyID string, by heavyhitters.Direction, n int, err error) {
	values, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", 0, 0, errRequest("malformed query")
	}
	for name, v := range values {
		if name != "policy" && name != "by" && name != "n" {
			return "", 0, 0, errRequest("unknown query parameter (known: policy, by, n)")
		}
		if len(v) > 1 {
			return "", 0, 0, errRequest("query names " + name + " twice")
		}
	}
	policyID = values.Get("policy")
	if len(policyID) > MaxPolicyBytes {
		return "", 0, 0, errPolicyTooLong
	}
	switch values.Get("by") {
	case "", "rejected":
		by = heavyhitters.Rejected
	case "admitted":
		by = heavyhitters.Admitted
	default:
		return "", 0, 0, errRequest(`by must be "rejected" or "admitted"`)
	}
	n = DefaultTopClients
	if s := values.Get("n"); s != "" || values.Has("n") {
		n, err = strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxTopClients {
			return "", 0, 0, errRequest(fmt.Sprintf("n must be a whole number from 1 to %d", MaxTopClients))
		}
	}
	return policyID, by, n, nil
}
