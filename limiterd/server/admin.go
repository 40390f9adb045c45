package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/limiterd/limiterd/api/openapi"
	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/adminauth"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/ratelimitheaders"
)

// OpenAPIPath is the admin API's path of the OpenAPI description of the decisions and admin
// APIs (package api/openapi). It is open to every caller, as /healthz is: it describes the
// shape of the requests and answers, which the repository publishes, and nothing of this
// replica's configuration (no policy, no address, no credential).
const OpenAPIPath = "/openapi.yaml"

// yamlContentType is the media type of YAML (RFC 9512).
var yamlContentType = []string{"application/yaml"}

// ReadinessCheck is one condition of /readyz, a store's reachability say.
type ReadinessCheck struct {
	// Name identifies the check in the /readyz answer.
	Name string
	// Check returns nil when the condition holds. It must honour ctx.
	Check func(ctx context.Context) error
}

// DefaultReadinessTimeout bounds each readiness check.
const DefaultReadinessTimeout = 2 * time.Second

// AdminOptions configure an Admin.
type AdminOptions struct {
	// Auth authenticates and authorizes every request but /healthz and /readyz, which stay open
	// for the kubelet, and OpenAPIPath (nil: every other request is refused with 401; adminauth.Open lets everyone
	// through). It also decides who sees the checks' errors in /readyz (ReadinessDetailsPath).
	Auth *adminauth.Auth
	// Metrics serves /metrics (nil: 404).
	Metrics http.Handler
	// ReadinessChecks are checked by /readyz after the engine's own ("policies": a policy set
	// is loaded).
	ReadinessChecks []ReadinessCheck
	// StatusChecks are reported by /readyz?verbose but never make the replica unready: the
	// health of a dependency whose failures the replica answers by itself, such as a shared
	// store whose outage the policies' failure modes cover.
	StatusChecks []ReadinessCheck
	// ReadinessTimeout bounds each check (default DefaultReadinessTimeout).
	ReadinessTimeout time.Duration
	// Logger receives unexpected failures (nil: slog.Default).
	Logger *slog.Logger
	// Replica names this replica in the answers of GET /v1/top, for a caller that merges
	// several (the pod's name, say).
	Replica string
}

// Admin serves the admin API of an engine:
//
//	GET    /healthz                          200 while the process serves
//	GET    /readyz[?verbose]                 200 when every readiness check passes, else 503;
//	                                         verbose: every check's result, status checks too;
//	                                         the checks' errors only to authorized callers
//	GET    /metrics                          Prometheus metrics
//	GET    /openapi.yaml                     the OpenAPI 3.1 description of both APIs (OpenAPIPath)
//	GET    /v1/policies                      the loaded policies the caller may list
//	GET    /v1/clients?policy=...&key=...    a client's state, without consuming anything
//	DELETE /v1/clients?policy=...&key=...    forget a client's state (204)
//	GET    /v1/top?policy=...[&by=rejected|admitted][&n=20]
//	                                         the clients with the most decisions of the last
//	                                         minutes on this replica (n at most 1,000)
//
// policy may be omitted when exactly one policy is loaded. Errors answer {"error": "..."} with
// the statuses of the decisions API; a store that fails answers 503.
//
// Every path but /healthz, /readyz and /openapi.yaml needs the caller to be authenticated (401 otherwise) and
// authorized (403) by AdminOptions.Auth, with the actions of package adminauth:
//
//	/metrics              get on the path /metrics
//	/readyz error texts   get on the path /readyz/verbose (ReadinessDetailsPath); without it,
//	                      /readyz names the failing checks with "failed" and no error, since
//	                      an error may name a store's address: the kubelet needs the status only
//	GET /v1/clients       get ratelimitpolicies/clients <name> in the policy's namespace
//	GET /v1/top           get ratelimitpolicies/clients <name> in the policy's namespace
//	DELETE /v1/clients    delete ratelimitpolicies/clients <name> in the policy's namespace
//	/v1/policies          list ratelimitpolicies in a policy's namespace, for each policy listed
//
// Authorization is asked for the policy the request names, loaded or not, so that a 404 tells
// only an authorized caller that a policy is not loaded. A review that cannot be had answers
// 503.
type Admin struct {
	engine  *engine.Engine
	auth    *adminauth.Auth
	metrics http.Handler
	checks  []ReadinessCheck
	status  []ReadinessCheck
	timeout time.Duration
	log     *slog.Logger
	replica string
}

// NewAdmin returns the admin API of e.
func NewAdmin(e *engine.Engine, opts AdminOptions) *Admin {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ReadinessTimeout <= 0 {
		opts.ReadinessTimeout = DefaultReadinessTimeout
	}
	checks := []ReadinessCheck{{Name: "policies", Check: func(context.Context) error {
		if !e.Ready() {
			return engine.ErrNotReady
		}
		return nil
	}}}
	return &Admin{
		engine:  e,
		auth:    opts.Auth,
		metrics: opts.Metrics,
		checks:  append(checks, opts.ReadinessChecks...),
		status:  opts.StatusChecks,
		timeout: opts.ReadinessTimeout,
		log:     opts.Logger,
		replica: opts.Replica,
	}
}

// ServeHTTP implements http.Handler.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/metrics":
		if a.metrics == nil {
			writeError(w, http.StatusNotFound, "no metrics")
			return
		}
		if !a.readOnly(w, r) {
			return
		}
		u, ok := a.authenticate(w, r)
		if !ok || !a.authorize(w, r, adminauth.Path(u, "get", r.URL.Path)) {
			return
		}
		a.metrics.ServeHTTP(w, r)
	case "/healthz":
		if !a.readOnly(w, r) {
			return
		}
		writeJSON(w, http.StatusOK, StatusAnswer{Status: "ok"}, a.log)
	case "/readyz":
		if !a.readOnly(w, r) {
			return
		}
		a.readyz(w, r)
	case OpenAPIPath:
		if !a.readOnly(w, r) {
			return
		}
		h := w.Header()
		h["Content-Type"] = yamlContentType
		h["X-Content-Type-Options"] = noSniff
		_, _ = w.Write(openapi.Spec)
	case "/v1/clients":
		a.clients(w, r)
	case "/v1/policies":
		a.policies(w, r)
	case "/v1/top":
		a.top(w, r)
	default:
		writeError(w, http.StatusNotFound, "no such path")
	}
}

func (a *Admin) readOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header()["Allow"] = allowGet
	writeError(w, http.StatusMethodNotAllowed, "use GET")
	return false
}

// StatusAnswer is the body of /healthz and /readyz: Failed maps each failed readiness check to
// its error. With /readyz?verbose, Checks maps every check, readiness and status checks alike,
// to "ok" or its error.
type StatusAnswer struct {
	Status string            `json:"status"`
	Failed map[string]string `json:"failed,omitempty"`
	Checks map[string]string `json:"checks,omitempty"`
}

// checkOK is a passing check in StatusAnswer.Checks; checkFailed a failing one, for a caller
// not authorized to see its error.
const (
	checkOK     = "ok"
	checkFailed = "failed"
)

// ReadinessDetailsPath is the non-resource path a caller must be allowed to "get" to read the
// errors of the checks in /readyz: Kubernetes' default role system:public-info-viewer grants
// /readyz to every identity, but not /readyz/verbose; system:monitoring grants /readyz/*.
const ReadinessDetailsPath = "/readyz/verbose"

// detailsAllowed reports whether the caller of r may read the checks' errors. It answers
// nothing: a caller without credentials, or not authorized, gets the answer without errors,
// and a review that cannot be had counts as a refusal.
func (a *Admin) detailsAllowed(r *http.Request) bool {
	if a.auth == nil {
		return false
	}
	u, err := a.auth.Authenticate(r)
	if err != nil {
		return false
	}
	allowed, _, err := a.auth.Authorize(r.Context(), adminauth.Path(u, "get", ReadinessDetailsPath))
	if err != nil {
		a.log.Warn("readiness details not authorized", "user", u.GetName(), "error", err)
	}
	return allowed && err == nil
}

// redact replaces every error text of answer by checkFailed.
func redact(answer *StatusAnswer) {
	for _, m := range []map[string]string{answer.Failed, answer.Checks} {
		for name, text := range m {
			if text != checkOK {
				m[name] = checkFailed
			}
		}
	}
}

func (a *Admin) readyz(w http.ResponseWriter, r *http.Request) {
	verbose := r.URL.Query().Has("verbose")
	answer := StatusAnswer{Status: "ready"}
	if verbose {
		answer.Checks = make(map[string]string, len(a.checks)+len(a.status))
	}
	run := func(c ReadinessCheck) error {
		ctx, cancel := context.WithTimeout(r.Context(), a.timeout)
		defer cancel()
		err := c.Check(ctx)
		if verbose {
			answer.Checks[c.Name] = checkOK
			if err != nil {
				answer.Checks[c.Name] = err.Error()
			}
		}
		return err
	}
	for _, c := range a.checks {
		if err := run(c); err != nil {
			if answer.Failed == nil {
				answer.Failed = make(map[string]string)
			}
			answer.Failed[c.Name] = err.Error()
		}
	}
	if verbose { // a status check never fails readiness, so it runs only when asked for
		for _, c := range a.status {
			_ = run(c)
		}
	}
	if (verbose || len(answer.Failed) > 0) && !a.detailsAllowed(r) {
		redact(&answer)
	}
	if len(answer.Failed) > 0 {
		answer.Status = "not ready"
		writeJSON(w, http.StatusServiceUnavailable, answer, a.log)
		return
	}
	writeJSON(w, http.StatusOK, answer, a.log)
}

// ClientAnswer is the body of GET /v1/clients: what a one-unit decision would answer now.
// Limit and Remaining are null for a tier without a limit.
type ClientAnswer struct {
	Policy            v1alpha1.PolicyID `json:"policy"`
	Tier              string            `json:"tier"`
	Allowed           bool              `json:"allowed"`
	Limit             *int64            `json:"limit"`
	Remaining         *int64            `json:"remaining"`
	ResetAfterSeconds int64             `json:"resetAfterSeconds"`
	RetryAfterSeconds int64             `json:"retryAfterSeconds"`
	// Limits are a stacked tier's limits (the top-level fields are those of the one closest to
	// exhaustion); absent for a tier of one limit.
	Limits []ClientLimit `json:"limits,omitempty"`
}

// ClientLimit is one limit of a stacked tier in a ClientAnswer.
type ClientLimit struct {
	Name              string `json:"name"`
	Allowed           bool   `json:"allowed"`
	Limit             int64  `json:"limit"`
	Remaining         int64  `json:"remaining"`
	ResetAfterSeconds int64  `json:"resetAfterSeconds"`
}

func (a *Admin) clients(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		w.Header()["Allow"] = allowGetDelete
		writeError(w, http.StatusMethodNotAllowed, "use GET or DELETE")
		return
	}
	u, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	policyID, key, err := decodeClientQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// The policy is named before authorization and acted on by that name, so that a swap in
	// between cannot make the request act on a policy it was not authorized for.
	id, err := a.policyNamed(policyID)
	if err != nil {
		a.writeError(w, err)
		return
	}
	if !a.authorize(w, r, adminauth.PolicyClients(u, verbOf(r), id.Namespace(), id.Name())) {
		return
	}
	if r.Method == http.MethodDelete {
		if err := a.engine.Reset(r.Context(), id, key); err != nil {
			a.writeError(w, err)
			return
		}
		a.log.Info("client state reset", "user", u.GetName(), "policy", id, "key", key)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	res, err := a.engine.Peek(r.Context(), id, key)
	if err != nil {
		a.writeError(w, err)
		return
	}
	answer := ClientAnswer{
		Policy:            res.Policy.ID,
		Tier:              res.Tier.Name,
		Allowed:           res.Allowed,
		ResetAfterSeconds: ratelimitheaders.Seconds(res.ResetAfter),
	}
	if !res.Allowed {
		answer.RetryAfterSeconds = ratelimitheaders.RetryAfterSeconds(res.RetryAfter)
	}
	if res.Tier.Limited() {
		answer.Limit, answer.Remaining = &res.Limit, &res.Remaining
	}
	for i, l := range res.Limits {
		answer.Limits = append(answer.Limits, ClientLimit{Name: res.Tier.Stack.Name(i), Allowed: l.Allowed, Limit: l.Limit,
			Remaining: l.Remaining, ResetAfterSeconds: ratelimitheaders.Seconds(l.ResetAfter)})
	}
	writeJSON(w, http.StatusOK, answer, a.log)
}

// policyNamed returns the policy a request names: id parsed, or the only loaded policy's ID
// when id is "". Its errors are the engine's: an id that cannot name a policy is
// engine.ErrUnknownPolicy.
func (a *Admin) policyNamed(id string) (v1alpha1.PolicyID, error) {
	set := a.engine.Policies()
	switch {
	case set == nil:
		return "", engine.ErrNotReady
	case id != "":
		parsed, err := v1alpha1.ParsePolicyID(id)
		if err != nil {
			return "", fmt.Errorf("%w %q", engine.ErrUnknownPolicy, id)
		}
		return parsed, nil
	case set.Len() == 1:
		return set.All()[0].ID, nil
	case set.Len() == 0:
		return "", fmt.Errorf("%w: none is loaded", engine.ErrUnknownPolicy)
	}
	return "", engine.ErrPolicyRequired
}

// writeError answers an engine error; an error the engine does not classify comes from the
// store.
func (a *Admin) writeError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, engine.ErrNotReady), errors.Is(err, engine.ErrUnknownPolicy),
		errors.Is(err, engine.ErrPolicyRequired), errors.Is(err, engine.ErrInvalidCost):
		writeError(w, engineErrorStatus(err, a.log), err.Error())
	default:
		a.log.Error("client state not reached", "error", err)
		writeError(w, http.StatusServiceUnavailable, err.Error())
	}
}

// decodeClientQuery reads policy and key from an admin query, with the bounds of the decisions
// API (a key of any length names the client the decisions API decides for it, see
// engine.ClientKey); unknown or repeated parameters are rejected.
func decodeClientQuery(rawQuery string) (policyID, key string, err error) {
	values, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", "", errRequest("malformed query")
	}
	for name, v := range values {
		if name != "policy" && name != "key" {
			return "", "", errRequest("unknown query parameter (known: policy, key)")
		}
		if len(v) > 1 {
			return "", "", errRequest("query names " + name + " twice")
		}
	}
	policyID, key = values.Get("policy"), values.Get("key")
	switch {
	case key == "":
		return "", "", errKeyMissing
	case !utf8.ValidString(key):
		return "", "", errKeyUTF8
	case len(policyID) > MaxPolicyBytes:
		return "", "", errPolicyTooLong
	}
	return policyID, key, nil
}
