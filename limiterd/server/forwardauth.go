package server

import (
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// forwardAuthPrefix starts the path of a forward-auth request; the policy's
// <namespace>/<name> follows, then, from Envoy's HTTP ext_authz, the original request's target.
const forwardAuthPrefix = "/v1/forward-auth/"

// Errors of forward-auth requests.
const (
	errDeny = "the only query parameter is deny, 403 or 429"

	errForwardAuthPath = "no such path: " + forwardAuthPrefix + "<namespace>/<name>[/<original path>] names a policy"
)

// allowedNoKey is the answer to a request without a key under missingKey Allow: nothing was
// decided or charged.
var allowedNoKey = []byte(`{"allowed":true}` + "\n")

// forwardAuth answers a gateway's forward-auth request (see the package documentation): it
// derives the client key from the request's headers with the policy's spec.gateway and decides
// cost 1 for it.
//
// The path has two forms:
//
//   - /v1/forward-auth/<namespace>/<name>[?deny=403|429] (nginx, Traefik, Caddy): the original
//     request is described by X-Forwarded-* headers, and the query is limiterd's own;
//   - /v1/forward-auth/<namespace>/<name>/<original target> (Envoy's HTTP ext_authz, whose
//     path_prefix is /v1/forward-auth/<namespace>/<name> and which appends the original
//     request's path and query): everything after the name, the query included, is the
//     original request's, so limiterd reads no parameter of its own from it (a rejection
//     answers 429), and the request's own method and Host are the original's.
//
// The path is split on its escaped form: the policy is the two segments after the prefix, which
// Envoy's configuration gives, and the original target begins at the next '/'. Whatever the
// client puts in its path (dot segments, %2F, a query naming deny) lies after it.
func (h *Decisions) forwardAuth(w http.ResponseWriter, r *http.Request) {
	// The policy is looked up, not parsed: an ID of no loaded policy answers 404 either way,
	// and the lookup costs no validation of names.
	escaped := r.URL.EscapedPath()
	if !strings.HasPrefix(escaped, forwardAuthPrefix) {
		writeError(w, http.StatusNotFound, errForwardAuthPath)
		return
	}
	rest := escaped[len(forwardAuthPrefix):]
	ns, after, ok := strings.Cut(rest, "/")
	name, _, original := strings.Cut(after, "/")
	if !ok || ns == "" || name == "" {
		writeError(w, http.StatusNotFound, errForwardAuthPath)
		return
	}
	id := v1alpha1.PolicyID(rest[:len(ns)+1+len(name)])
	fr := policy.ForwardedRequest{Header: r.Header, Method: r.Method}
	deny := http.StatusTooManyRequests
	switch {
	case original:
		fr.Target = escaped[len(forwardAuthPrefix)+len(id):]
		if r.URL.RawQuery != "" || r.URL.ForceQuery {
			fr.Target += "?" + r.URL.RawQuery
		}
		fr.Host = r.Host
	case r.URL.RawQuery == "", r.URL.RawQuery == "deny=429":
	case r.URL.RawQuery == "deny=403":
		deny = http.StatusForbidden
	default:
		writeError(w, http.StatusBadRequest, errDeny)
		return
	}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		fr.Peer = ap.Addr()
	}
	buf := buffers.Get().(*buffer)
	defer buffers.Put(buf)
	var res engine.Result
	decided, err := h.engine.DecideForwarded(r.Context(), id, &fr, buf.b[:0], &res)
	switch {
	case errors.Is(err, engine.ErrNoKey):
		writeError(w, deny, err.Error())
		return
	case err != nil:
		writeError(w, forwardedErrorStatus(err, h.log), err.Error())
		return
	case !decided: // missingKey Allow
		w.Header()["Content-Type"] = jsonContentType
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(allowedNoKey)
		return
	}
	h.setLegacyHeaders(w, &res)
	status := http.StatusOK
	if !res.Allowed {
		status = deny
	}
	writeAnswer(w, &res, status)
}

// forwardedErrorStatus returns the status that answers an error of engine.DecideForwarded, other
// than engine.ErrNoKey (answered as a rejection): 409 for a policy without spec.gateway, 431 for
// a header over the key sources' bound, 400 for another header the key sources cannot read, and
// the engine's statuses.
func forwardedErrorStatus(err error, log *slog.Logger) int {
	var he *policy.HeaderError
	switch {
	case errors.Is(err, engine.ErrNoGateway):
		return http.StatusConflict
	case errors.Is(err, policy.ErrHeaderTooLarge):
		return http.StatusRequestHeaderFieldsTooLarge
	case errors.As(err, &he):
		return http.StatusBadRequest
	}
	return engineErrorStatus(err, log)
}

// isForwardAuth reports whether path is one of a forward-auth request.
func isForwardAuth(path string) bool { return strings.HasPrefix(path, forwardAuthPrefix) }
