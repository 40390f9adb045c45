package server

import (
	"errors"
	"fmt"
	"net/http"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"github.com/limiterd/limiterd/limiterd/adminauth"
)

// wwwAuthenticate is the challenge of a 401 answer (RFC 6750).
var wwwAuthenticate = []string{`Bearer realm="limiterd"`}

// authenticate returns who sent r, or answers 401 and returns false. Without an Auth every
// request is refused.
func (a *Admin) authenticate(w http.ResponseWriter, r *http.Request) (user.Info, bool) {
	if a.auth == nil {
		w.Header()["Www-Authenticate"] = wwwAuthenticate
		writeError(w, http.StatusUnauthorized, "admin API authentication is not configured")
		return nil, false
	}
	u, err := a.auth.Authenticate(r)
	if errors.Is(err, adminauth.ErrHostNotLoopback) {
		writeError(w, http.StatusForbidden, err.Error())
		return nil, false
	}
	if err != nil {
		// The cause stays in the log: it may describe the API server.
		a.log.Debug("admin request not authenticated", "path", r.URL.Path, "remote", r.RemoteAddr, "error", err)
		w.Header()["Www-Authenticate"] = wwwAuthenticate
		writeError(w, http.StatusUnauthorized, "authentication required: send a valid bearer token")
		return nil, false
	}
	return u, true
}

// authorize reports whether the action attrs may be taken, or answers 403 (denied) or 503 (no
// decision could be had) and returns false.
func (a *Admin) authorize(w http.ResponseWriter, r *http.Request, attrs authorizer.AttributesRecord) bool {
	allowed, ok := a.allowed(w, r, attrs)
	if ok && !allowed {
		writeError(w, http.StatusForbidden, forbidden(attrs))
	}
	return ok && allowed
}

// allowed asks whether the action attrs may be taken. ok is false when no decision could be had;
// it has then answered 503.
func (a *Admin) allowed(w http.ResponseWriter, r *http.Request, attrs authorizer.AttributesRecord) (allowed, ok bool) {
	allowed, reason, err := a.auth.Authorize(r.Context(), attrs)
	if err != nil {
		a.log.Warn("admin request not authorized", "user", attrs.User.GetName(), "error", err)
		writeError(w, http.StatusServiceUnavailable, "authorization unavailable")
		return false, false
	}
	if !allowed {
		a.log.Debug("admin request denied", "user", attrs.User.GetName(), "path", r.URL.Path, "reason", reason)
	}
	return allowed, true
}

// forbidden is a 403 message in kube-apiserver's words.
func forbidden(attrs authorizer.AttributesRecord) string {
	if !attrs.ResourceRequest {
		return fmt.Sprintf("user %q cannot %s path %q", attrs.User.GetName(), attrs.Verb, attrs.Path)
	}
	res := attrs.Resource
	if attrs.Subresource != "" {
		res += "/" + attrs.Subresource
	}
	return fmt.Sprintf("user %q cannot %s resource %q in API group %q in the namespace %q",
		attrs.User.GetName(), attrs.Verb, res, attrs.APIGroup, attrs.Namespace)
}

// verbOf is the authorization verb of a read or a reset.
func verbOf(r *http.Request) string {
	if r.Method == http.MethodDelete {
		return "delete"
	}
	return "get"
}
