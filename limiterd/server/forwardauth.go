package server

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// forwardAuthPrefix starts the path of a forward-auth request; the policy's
// <namespace>/<name> follows.
const forwardAuthPrefix = "/v1/forward-auth/"

// Errors of forward-auth requests.
const (
	errNoGateway = "policy has no spec.gateway: it does not answer forward-auth requests (add spec.gateway to say where a forwarded request's client key comes from)"
	errNoKey     = "no key: no key source of the policy's spec.gateway yielded a client key, and its missingKey is Reject"
	errDeny      = "the only query parameter is deny, 403 or 429"

	errForwardAuthPath = "no such path: " + forwardAuthPrefix + "<namespace>/<name> names a policy"
)

// allowedNoKey is the answer to a request without a key under missingKey Allow: nothing was
// decided or charged.
var allowedNoKey = []byte(`{"allowed":true}` + "\n")

// forwardAuth answers a gateway's forward-auth request (see the package documentation): it
// derives the client key from the request's headers with the policy's spec.gateway and decides
// cost 1 for it.
func (h *Decisions) forwardAuth(w http.ResponseWriter, r *http.Request) {
	// The policy is looked up, not parsed: an ID of no loaded policy answers 404 either way,
	// and the lookup costs no validation of names.
	rest := r.URL.Path[len(forwardAuthPrefix):]
	if ns, name, ok := strings.Cut(rest, "/"); !ok || ns == "" || name == "" || strings.IndexByte(name, '/') >= 0 {
		writeError(w, http.StatusNotFound, errForwardAuthPath)
		return
	}
	id := v1alpha1.PolicyID(rest)
	deny := http.StatusTooManyRequests
	switch r.URL.RawQuery {
	case "":
	case "deny=429":
	case "deny=403":
		deny = http.StatusForbidden
	default:
		writeError(w, http.StatusBadRequest, errDeny)
		return
	}
	set := h.engine.Policies()
	if set == nil {
		writeError(w, http.StatusServiceUnavailable, engine.ErrNotReady.Error())
		return
	}
	p, ok := set.Get(id)
	if !ok {
		writeError(w, http.StatusNotFound, engine.ErrUnknownPolicy.Error()+" "+string(id))
		return
	}
	if p.Gateway == nil {
		writeError(w, http.StatusConflict, string(id)+": "+errNoGateway)
		return
	}

	fr := policy.ForwardedRequest{Header: r.Header, Method: r.Method}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		fr.Peer = ap.Addr()
	}
	buf := buffers.Get().(*buffer)
	defer buffers.Put(buf)
	key, found, err := p.Gateway.AppendKey(buf.b[:0], &fr)
	buf.b = key[:0]
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, policy.ErrHeaderTooLarge) {
			status = http.StatusRequestHeaderFieldsTooLarge
		}
		writeError(w, status, err.Error())
		return
	}
	k := v1alpha1.SharedGatewayKey
	switch {
	case found:
		k = string(key)
	case p.Gateway.MissingKey == v1alpha1.MissingKeyAllow:
		w.Header()["Content-Type"] = jsonContentType
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(allowedNoKey)
		return
	case p.Gateway.MissingKey == v1alpha1.MissingKeyShared:
	default: // Reject
		writeError(w, deny, errNoKey)
		return
	}
	res, err := h.engine.Decide(r.Context(), id, k, 1)
	if err != nil {
		h.writeEngineError(w, err)
		return
	}
	h.setLegacyHeaders(w, &res)
	status := http.StatusOK
	if !res.Allowed {
		status = deny
	}
	writeAnswer(w, &res, status)
}

// isForwardAuth reports whether path is one of a forward-auth request.
func isForwardAuth(path string) bool { return strings.HasPrefix(path, forwardAuthPrefix) }
