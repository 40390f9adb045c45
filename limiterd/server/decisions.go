// Package server is limiterd's HTTP layer: the decisions API (Decisions) and the admin API
// (Admin), each an http.Handler served on its own port.
//
// # Decisions
//
// The decisions API reveals no configuration: the loaded policies are listed by the admin API,
// to callers it authorizes.
//
//	POST /v1/allow   {"policy": "<namespace>/<name>", "key": "<client key>", "cost": 1}
//	GET  /v1/allow?policy=<namespace>/<name>&key=<client key>&cost=1
//
// A key is any non-empty UTF-8 string the request holds: one over MaxKeyBytes (1024) bytes is
// decided like any other, as the client named by its SHA-256 digest (engine.ClientKey), so its
// length never decides whether a request is limited.
//
// policy may be omitted when exactly one policy is loaded, and "<name>" names the policy of
// namespace "default", as an Envoy domain does (v1alpha1.RequestedPolicyID); cost defaults to
// 1. A cost of 0 is a peek: it consumes nothing and answers what a one-unit request would get
// now (allowed, the status and Retry-After say whether and when one unit would be admitted).
// The answer is 200 (allowed) or 429 (rejected) with the body
//
//	{"allowed":true,"limit":10,"remaining":9,"resetAfterSeconds":2,"retryAfterSeconds":0,
//	 "resetAfterMs":1500,"retryAfterMs":0}
//
// and the header fields of draft-ietf-httpapi-ratelimit-headers-10, named after the client's
// tier:
//
//	RateLimit-Policy: "<tier>";q=<limit>;w=<window seconds>
//	RateLimit: "<tier>";r=<remaining>;t=<seconds until reset>
//	Retry-After: <seconds>            (429 only, unless no wait admits the cost)
//
// Durations are whole seconds rounded up, so waiting that long is always enough; Retry-After is
// at least 1. resetAfterMs and retryAfterMs are the same durations in milliseconds, rounded up:
// exact for tiers whose windows are shorter than a second (a 100 ms window answers a wait of
// 70 ms as "retryAfterMs":70, where the seconds say 1).
//
// A stacked tier (spec limits) admits a request only if every limit admits it, and then charges
// its cost to each; a request that any limit rejects charges none. Its answer lists every limit
// in RateLimit-Policy and in the body's "limits", in the tier's order, each item of the header
// named "<tier>/<limit>":
//
//	RateLimit-Policy: "paid/burst";q=20;w=2, "paid/daily";q=10000;w=86400
//	RateLimit: "paid/daily";r=0;t=3600
//	{"allowed":false,"limit":10000,"remaining":0,...,"limits":[
//	 {"name":"burst","allowed":true,"limit":20,"remaining":19,"resetAfterSeconds":1,"resetAfterMs":100},
//	 {"name":"daily","allowed":false,"limit":10000,"remaining":0,"resetAfterSeconds":3600,"resetAfterMs":3600000}]}
//
// The RateLimit field and the body's top-level limit, remaining and reset are those of the
// binding limit: the one closest to exhaustion (the least remaining, then the longest until
// whole again), or of a rejection the rejecting limit that must wait longest. Retry-After and
// the retry fields are the wait until every limit admits the cost (the longest of the
// rejecting limits' waits; none when a limit can never admit it). A limit's "allowed" says
// whether it alone admits the request; one that does, in a rejected request, was not charged
// and describes its state as it is. Peeks and refunds answer so too; a refund returns its
// units to every limit, each clamped to its own limit.
//
// A cost above the tier's limit can never be admitted: it answers 429 with "retryAfterSeconds":0,
// "retryAfterMs":0 and no Retry-After, and consumes nothing; the other fields describe the
// client's state as it is. A tier without a limit (Unlimited) answers 200 with "limit" and
// "remaining" null and no RateLimit fields, since it has no quota to advertise. A dry-run tier always answers
// 200 with "allowed":true and never Retry-After; its other fields (limit, remaining, resets,
// RateLimit) describe the state as enforcing it would, and it adds
//
//	"dryRun":true,"wouldAllow":false,"wouldRetryAfterSeconds":2,"wouldRetryAfterMs":1500
//
// and the header field Limiterd-Dry-Run: would-reject (would-allow when it would have admitted
// the request): wouldAllow is the decision enforcing the tier would have made, and the would
// retry fields its retry time (0 when it would admit, or when no wait would). The answer never
// says which algorithm decided.
//
// # Refunds
//
//	POST /v1/refund  {"reservation": "<reservation>", "cost": 3}
//
// gives back cost units (1 to the reservation's cost; absent or null: all of them) of the
// admitted decision whose answer carried reservation: the answer to an admitted decision of a
// cost above 0, of a tier with a limit, of a policy with spec.refunds Enabled, decided by the
// store (not a failure mode), has a "reservation" field (batch items too). A reservation refunds
// once, only while its units still count, and only the policy, client and tier it names (see
// engine.Refund); the units come back clamped to the limit: a token bucket's tokens exactly (to
// the fraction), a sliding window's newest admitted units still in its window. The answer is
// 200 with the body and header fields of a peek after the refund, plus "refunded": the units
// that came back, as the store counted them in the refund (engine.Result.Refunded: how many
// more units the limit admits right after it than right before), the binding limit's at the
// top and each limit's in "limits". Errors refund nothing: 400
// for a malformed request or reservation, or a cost past the reservation's; 403 for a
// reservation not signed by this service's key, or a policy without refunds; 404 for a policy
// no longer loaded; 409 for a reservation refunded before, or whose client changed tier; 410
// for an expired reservation. A 503 means the store failed and the refund may or may not have
// been made: a retry of the same reservation is safe (it answers 200 or 409).
//
// # Leases
//
//	POST /v1/release  {"lease": "<lease>", "extend": false}
//
// ends the lease that an admitted decision of a tier with a concurrency limit took: such an
// answer has a "lease" field (batch items too), the header field Limiterd-Lease with the same
// token, "leaseExpiresAt" (RFC 3339, UTC) and "leaseTimeoutMs" (the tier's lease timeout, which
// the policy sets: a caller cannot choose it). The lease holds its places until it is released
// or its timeout passes. A release frees its places at once and answers 200 with the body of a
// peek after it plus "released": the places freed. With "extend": true the places stay held,
// until a lease timeout from now, under a new lease: the answer carries the new "lease" and
// its expiry, plus "extended": the places kept; the old token is spent. A lease releases or
// extends once, only while it has not expired, and only the policy, client and tier it names
// (see engine.Release). Errors change nothing: 400 for a malformed request or lease (a refund's
// reservation is none), or a field that would choose a timeout; 403 for a lease not signed by
// this service's key, or altered (another policy, client or expiry written in); 404 for a
// policy no longer loaded; 409 for a lease released or extended before, or that the policies
// served do not hold (its client changed tier, the tier's lease timeout changed, or the policy
// was re-created or the replica restarted since); 410 for an expired lease (or one whose client
// was reset since: its places are free). A 503 means the store failed: a release may be retried
// (409 once made).
//
// Errors answer {"error": "..."} and consume nothing: 400 for a malformed request (see
// DecodeAllowRequest and DecodeAllowQuery: unknown fields and parameters are rejected so that a
// typo never goes unnoticed) and for an omitted policy while several are loaded, 404 for an
// unknown policy or path, 405 for another method, 413 for a body over 64 KiB, 503 before any
// policy is loaded, and 503 with Retry-After when the server holds too many request bodies
// (WithBodyBudget).
//
// # Forward auth
//
//	<any method> /v1/forward-auth/<namespace>/<name>[?deny=403]
//
// answers the "may this request pass?" of a gateway that asks an outside service before it
// proxies a request: nginx auth_request, Traefik ForwardAuth, Caddy forward_auth. The policy
// must have spec.gateway, whose key sources derive the client key from the headers the gateway
// sends (the original request's, X-Forwarded-For, X-Forwarded-Host, X-Forwarded-Method,
// X-Forwarded-Uri or nginx's X-Original-URI; see v1alpha1.KeySource); the request is decided at
// cost 1 for that key. The body, if any, is not read, and the method is any: the gateways send
// the original one (nginx) or GET with X-Forwarded-Method (Traefik, Caddy).
//
// Allowed: 200 with the body and header fields of a decision (RateLimit-Policy, RateLimit),
// which a gateway may copy to the request or the client. Rejected: 429 with Retry-After and the
// same fields, which Traefik and Caddy return to the client as they are. nginx's auth_request
// understands only 2xx, 401 and 403 and turns any other status into 500: with ?deny=403 a
// rejection answers 403 instead (with Retry-After all the same), which an nginx location turns
// back into 429 (docs/gateways.md). A request from which no key source yields a key
// follows the policy's missingKey: Reject answers the deny status (429 or 403) without
// Retry-After, Allow answers 200 {"allowed":true} and charges nothing, Shared decides for the
// key "anonymous".
//
// Errors answer {"error": "..."} and charge nothing: 400 for a header the key is read from that
// is given more than once, a JWTClaim source's token that is malformed (policy.ErrMalformedJWT),
// or a query other than deny=403 or deny=429; 404 for a path that
// names no policy, or a policy that is not loaded; 409 for a policy without spec.gateway; 431
// for a header the key is read from longer than v1alpha1.MaxGatewayHeaderBytes (4096 bytes);
// 503 before any policy is loaded. nginx shows each of them to its client as 500. The checks
// for browsers below do not apply (the Origin and Sec-Fetch-Site a forward-auth request
// carries are the forwarded request's), so the forward-auth path should be reachable by the
// gateways only; the Host check of WithAllowedHosts does.
//
// # Browsers
//
// A web page can make a browser on the network send requests to the decisions API without
// asking first (CORS): GETs (an <img>), and POSTs of a form or text. These are refused, so that
// a page cannot spend or refund a client's allowance:
//
//   - A request a browser marks as sent on behalf of another site answers 403 whatever its
//     method (GET /v1/allow included), and spends nothing: one whose Sec-Fetch-Site is not
//     same-origin or none, or, without Sec-Fetch-Site, whose Origin is null, not an origin, or
//     of another host than the request's. Clients other than browsers send neither header and
//     are served. Browsers that send neither on a GET are not detected, and their cross-site
//     GETs are decided: Sec-Fetch-Site came with Chrome 76, Edge 79, Firefox 90 and Safari 16.4
//     (2019 to 2023), and browsers send no Origin on a plain GET.
//   - A POST (allow, batch, refund, release) must send Content-Type application/json (parameters
//     allowed) or none: the types a page may send to any site without asking first
//     (text/plain, application/x-www-form-urlencoded, multipart/form-data), and every other,
//     answer 415. curl -d sends a form type: use --json, or -H 'Content-Type: application/json'.
//   - With WithAllowedHosts, a request whose Host is not an IP address, localhost or a listed
//     name answers 421: a page can make a browser send same-origin requests, and read their
//     answers, to a name of its own that resolves to limiterd's address (DNS rebinding).
//
// # Batches
//
//	POST /v1/allow:batch   {"items": [{"policy": "...", "key": "...", "cost": 1}, ...]}
//
// decides up to MaxBatchItems (1000) items in one call and answers 200 with
//
//	{"results": [<one result per item, in the order of the items>]}
//
// where each result is the body a single call would answer for the item (its "allowed" says
// what its status would have been), or {"error": "...", "status": 400} for an item that is no
// valid request (DecodeAllowRequest) or names no policy while several are loaded, and
// {"error": "...", "status": 404} for an unknown policy. A bad item consumes nothing and fails
// alone. Items are decided in order, on one snapshot of the policies and at one instant: items
// on one client key are decided as successive single calls would be. The answer has no
// RateLimit or Retry-After fields (they would describe one item). The whole batch is refused,
// and nothing is decided, for a malformed body, a body that is not an object with the one field
// "items" holding an array (400), more than MaxBatchItems items or a body over
// MaxBatchBodyBytes (2 MiB) (413), another method than POST (405), and before any policy is
// loaded (503).
package server

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/httphost"
	"github.com/limiterd/limiterd/limiterd/ratelimitheaders"
)

// Shared header values; net/http never modifies them.
var (
	jsonContentType = []string{"application/json"}
	allowGetPost    = []string{"GET, POST"}
	allowPost       = []string{"POST"}
	allowGet        = []string{"GET"}
	allowGetDelete  = []string{"GET, DELETE"}
	noSniff         = []string{"nosniff"}
	// The Limiterd-Dry-Run values of a dry-run tier's answer.
	dryRunWouldAllow  = []string{"would-allow"}
	dryRunWouldReject = []string{"would-reject"}
)

// Canonical header keys, so values can be set on the map directly.
const (
	headerRateLimitPolicy = ratelimitheaders.RateLimitPolicy
	headerRateLimit       = ratelimitheaders.RateLimit
	headerRetryAfter      = ratelimitheaders.RetryAfter
	headerDryRun          = "Limiterd-Dry-Run"
	headerLease           = "Limiterd-Lease"
)

// Decisions serves the decisions API for an engine.
type Decisions struct {
	engine *engine.Engine
	log    *slog.Logger
	legacy bool // also send the X-RateLimit-* header fields
	// hosts holds the names WithAllowedHosts admits besides IP literals and localhost, in lower
	// case without a trailing dot; nil admits every Host.
	hosts map[string]struct{}
	// bodies bounds the bytes of request bodies held at once (WithBodyBudget); nil: no bound.
	bodies *bodyBudget
}

// DecisionsOption configures the decisions API.
type DecisionsOption func(*Decisions)

// WithLegacyHeaders makes every answer of a tier with a limit also carry the legacy header
// fields many clients still read (the names and meaning of GitHub's and express-rate-limit's):
//
//	X-RateLimit-Limit: <limit>
//	X-RateLimit-Remaining: <remaining>
//	X-RateLimit-Reset: <Unix time in seconds, rounded up, when the allowance is whole again>
//
// The reset is an instant, not a delay as in the RateLimit field, computed on the engine's clock.
func WithLegacyHeaders() DecisionsOption { return func(h *Decisions) { h.legacy = true } }

// WithAllowedHosts makes the API answer only requests whose Host is an IP address literal,
// localhost, or one of names (DNS names, IDNs in their xn-- form), in any case, with any port
// or none, with or without a trailing dot; any other request, whatever its method and path, is
// answered 421 (Misdirected Request) with an error naming limiterd's --allowed-hosts flag, and
// spends nothing. A Host httphost.Parse refuses (an empty one among them) is refused too.
//
// It keeps DNS rebinding out: a web page can make a browser send same-origin requests, whose
// answers it reads, to a name of its own that resolves to limiterd's address; such a request
// names that name in its Host. Rebinding needs a name, so IP literals are always answered.
// names may be nil: IP literals and localhost only. Checking a Host allocates nothing.
func WithAllowedHosts(names []string) DecisionsOption {
	set := make(map[string]struct{}, len(names))
	for _, n := range names {
		set[strings.ToLower(strings.TrimSuffix(n, "."))] = struct{}{}
	}
	return func(h *Decisions) { h.hosts = set }
}

// maxHostName is the longest DNS name, without its trailing dot (RFC 1035).
const maxHostName = 253

// allowedHost reports whether hostport, a request's Host, is one WithAllowedHosts admits.
func (h *Decisions) allowedHost(hostport string) bool {
	name, ip, ok := httphost.Parse(hostport)
	switch {
	case !ok:
		return false
	case ip.IsValid():
		return true
	case strings.EqualFold(name, "localhost"):
		return true
	}
	if _, ok := h.hosts[name]; ok {
		return true
	}
	// Browsers send host names in lower case; other clients may not. A name is folded into a
	// buffer on the stack: the conversion of a map key allocates nothing.
	if len(name) > maxHostName {
		return false
	}
	var lower [maxHostName]byte
	upper := false
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
			upper = true
		}
		lower[i] = c
	}
	if !upper {
		return false
	}
	_, ok = h.hosts[string(lower[:len(name)])]
	return ok
}

// NewDecisions returns the decisions API of e. log receives unexpected failures only (nil:
// slog.Default); a decision logs nothing.
func NewDecisions(e *engine.Engine, log *slog.Logger, opts ...DecisionsOption) *Decisions {
	if log == nil {
		log = slog.Default()
	}
	h := &Decisions{engine: e, log: log}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Legacy header fields (WithLegacyHeaders), canonical.
const (
	headerXLimit     = "X-Ratelimit-Limit"
	headerXRemaining = "X-Ratelimit-Remaining"
	headerXReset     = "X-Ratelimit-Reset"
)

// setLegacyHeaders sets the X-RateLimit-* fields of an answer, when enabled and its tier has a
// limit. Call it before the answer is written.
func (h *Decisions) setLegacyHeaders(w http.ResponseWriter, res *engine.Result) {
	if !h.legacy || !res.Tier.Limited() {
		return
	}
	reset := h.engine.Now().Add(res.ResetAfter)
	sec := reset.Unix()
	if reset.Nanosecond() > 0 {
		sec++
	}
	hdr := w.Header()
	hdr[headerXLimit] = []string{strconv.FormatInt(res.Limit, 10)}
	hdr[headerXRemaining] = []string{strconv.FormatInt(res.Remaining, 10)}
	hdr[headerXReset] = []string{strconv.FormatInt(sec, 10)}
}

// ServeHTTP implements http.Handler.
func (h *Decisions) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.hosts != nil && !h.allowedHost(r.Host) {
		writeError(w, http.StatusMisdirectedRequest, errMisdirected+strconv.Quote(r.Host))
		return
	}
	var serve func(*Decisions, http.ResponseWriter, *http.Request)
	switch r.URL.Path {
	case "/v1/allow":
		serve = (*Decisions).allow
	case "/v1/refund":
		serve = (*Decisions).refund
	case "/v1/release":
		serve = (*Decisions).release
	case "/v1/allow:batch":
		serve = (*Decisions).batch
	default:
		if isForwardAuth(r.URL.Path) {
			// Any method, and no browser checks: the method and the headers are those of the
			// request the gateway forwards, and a browser's Origin or Sec-Fetch-Site in them
			// is about that request, not this one.
			h.forwardAuth(w, r)
			return
		}
		writeError(w, http.StatusNotFound, "no such path")
		return
	}
	if msg := crossSite(r); msg != "" {
		writeError(w, http.StatusForbidden, msg)
		return
	}
	if r.Method == http.MethodPost && !acceptContentType(w, r) {
		return
	}
	serve(h, w, r)
}

// errMisdirected begins the error of a request refused for its Host; the Host follows, quoted.
const errMisdirected = "misdirected request: this service answers requests to an IP address, localhost " +
	"or a name of its --allowed-hosts only (add the name there), not to "

// Why crossSite refuses a request.
const (
	errSecFetchSite  = "cross-site request refused: Sec-Fetch-Site is not same-origin"
	errOrigin        = "cross-site request refused: Origin is not this request's host"
	errOriginInvalid = "cross-site request refused: Origin is null or not an origin"
)

// crossSite returns why r was sent by a browser on behalf of another site, or "" when it was
// not: with Sec-Fetch-Site, when that is not same-origin or none (the user's own navigation);
// without it, when Origin is null, not a serialised origin ("scheme://host[:port]"), or of
// another host than r's (case aside). A header given twice counts as another site. Requests of
// clients other than browsers carry neither header and pass; so do the GETs of browsers without
// Sec-Fetch-Site (before Chrome 76, Firefox 90, Safari 16.4), which send no Origin on a GET
// either. The server's header keys are canonical, so a request with neither header costs two
// map reads and allocates nothing.
//
// Every method is checked, unlike http.CrossOriginProtection, which lets GET through: a GET
// /v1/allow spends allowance, and a web page can make a browser send one to any address (an
// <img>), without asking first.
func crossSite(r *http.Request) string {
	if v := r.Header["Sec-Fetch-Site"]; len(v) > 0 {
		if len(v) == 1 && (v[0] == "same-origin" || v[0] == "none") {
			return ""
		}
		return errSecFetchSite
	}
	v := r.Header["Origin"]
	switch {
	case len(v) == 0:
		return ""
	case len(v) > 1:
		return errOrigin
	}
	_, host, ok := strings.Cut(v[0], "://")
	switch {
	case !ok || host == "" || strings.ContainsAny(host, "/?#@"):
		return errOriginInvalid
	case !strings.EqualFold(host, r.Host):
		return errOrigin
	}
	return ""
}

// acceptContentType checks the Content-Type of a POST of the decisions API before its body is
// read, or answers and returns false. A web page can make a browser POST to any address without
// asking it first (CORS) only with a form or text content type, or none: its Content-Type must
// be application/json (parameters such as charset allowed) or absent, else 415.
func acceptContentType(w http.ResponseWriter, r *http.Request) bool {
	if ct := r.Header["Content-Type"]; len(ct) > 0 && (len(ct) > 1 || !isJSONMediaType(ct[0])) {
		w.Header()["Accept-Post"] = jsonContentType
		writeError(w, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
		return false
	}
	return true
}

// isJSONMediaType reports whether a Content-Type value is application/json, in any case, with
// or without parameters.
func isJSONMediaType(v string) bool {
	const want = "application/json"
	if v == want {
		return true
	}
	if i := strings.IndexByte(v, ';'); i >= 0 {
		v = v[:i]
	}
	return strings.EqualFold(strings.TrimSpace(v), want)
}

// buffer is a pooled scratch buffer for request bodies and answers.
type buffer struct{ b []byte }

var buffers = sync.Pool{New: func() any { return &buffer{b: make([]byte, 0, 1024)} }}

func (h *Decisions) allow(w http.ResponseWriter, r *http.Request) {
	var (
		req AllowRequest
		err error
	)
	switch r.Method {
	case http.MethodPost:
		buf := buffers.Get().(*buffer)
		defer buffers.Put(buf)
		var (
			status int
			taken  int64
		)
		buf.b, taken, status, err = h.readBody(w, r, buf.b[:0])
		defer h.bodies.give(taken)
		if err != nil {
			writeError(w, status, err.Error())
			return
		}
		req, err = DecodeAllowRequest(buf.b)
	case http.MethodGet:
		req, err = DecodeAllowQuery(r.URL.RawQuery)
	default:
		w.Header()["Allow"] = allowGetPost
		writeError(w, http.StatusMethodNotAllowed, "use GET or POST")
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var res engine.Result
	if err = h.engine.DecideInto(r.Context(), v1alpha1.RequestedPolicyID(req.Policy), req.Key, req.Cost, &res); err != nil {
		h.writeEngineError(w, err)
		return
	}
	h.setLegacyHeaders(w, &res)
	writeDecision(w, &res)
}

// readBody reads a request body of at most MaxBodyBytes into buf, within the budget of bodies
// (readBodyInBudget): the bytes taken are to be given back once the request is answered.
func (h *Decisions) readBody(w http.ResponseWriter, r *http.Request, buf []byte) ([]byte, int64, int, error) {
	return h.readBodyInBudget(w, r, buf, MaxBodyBytes, errBodyTooLarge)
}

// readBodyUpTo reads a request body of at most limit bytes into buf; tooLarge is the error of
// a larger one. buf never grows past what the body may hold: a body of declared length
// (Content-Length) is read into a buffer of that length, allocated once, and may not exceed it
// (http.MaxBytesReader stops it there, whatever the client sends); one of unknown length
// (chunked) grows by doubling from 1 KiB, each step capped at limit. A pooled buf with room
// enough is used as it is.
func readBodyUpTo(w http.ResponseWriter, r *http.Request, buf []byte, limit int64, tooLarge error) ([]byte, int, error) {
	if r.ContentLength > limit {
		return buf, http.StatusRequestEntityTooLarge, tooLarge
	}
	most := bodyBytes(r, limit)
	body := http.MaxBytesReader(w, r.Body, most)
	if r.ContentLength >= 0 {
		buf = growTo(buf, int(most))
	}
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= most {
				// Full: one more read to see the body's end. The reader is at its limit, so
				// it reads nothing into probe, only EOF or the error of a larger body.
				var probe [1]byte
				for {
					if _, err := body.Read(probe[:]); err != nil {
						return endOfBody(buf, err)
					}
				}
			}
			buf = growTo(buf, int(min(int64(max(2*cap(buf), 1024)), most)))
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			return endOfBody(buf, err)
		}
	}
}

// bodyBytes returns the most bytes r's body may hold under limit: its declared length, or limit
// when it declares none (chunked).
func bodyBytes(r *http.Request, limit int64) int64 {
	if r.ContentLength >= 0 {
		return min(r.ContentLength, limit)
	}
	return limit
}

// growTo returns buf with a capacity of at least n, allocating exactly n when it has less.
func growTo(buf []byte, n int) []byte {
	if cap(buf) >= n {
		return buf
	}
	grown := make([]byte, len(buf), n)
	copy(grown, buf)
	return grown
}

// endOfBody answers the error that ended the read of a body into buf: none at its end.
func endOfBody(buf []byte, err error) ([]byte, int, error) {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		return buf, 0, nil
	case errors.As(err, &tooLarge):
		return buf, http.StatusRequestEntityTooLarge, tooLarge
	default:
		return buf, http.StatusBadRequest, errRequest("cannot read the body: " + err.Error())
	}
}

// errBodyTooLarge is an error, not an errRequest, so that passing it to readBodyUpTo does not
// box its text anew for each request.
var errBodyTooLarge error = errRequest("body is larger than " + strconv.Itoa(MaxBodyBytes) + " bytes")

// writeEngineError answers a request the engine refused to decide.
func (h *Decisions) writeEngineError(w http.ResponseWriter, err error) {
	writeError(w, engineErrorStatus(err, h.log), err.Error())
}

func engineErrorStatus(err error, log *slog.Logger) int {
	switch {
	case errors.Is(err, engine.ErrNotReady):
		return http.StatusServiceUnavailable
	case errors.Is(err, engine.ErrUnknownPolicy):
		return http.StatusNotFound
	case errors.Is(err, engine.ErrPolicyRequired), errors.Is(err, engine.ErrInvalidCost), errors.Is(err, engine.ErrInvalidAmount),
		errors.Is(err, engine.ErrInvalidReservation), errors.Is(err, engine.ErrInvalidLease):
		return http.StatusBadRequest
	case errors.Is(err, engine.ErrForgedReservation), errors.Is(err, engine.ErrRefundsDisabled), errors.Is(err, engine.ErrForgedLease):
		return http.StatusForbidden
	case errors.Is(err, engine.ErrRefunded), errors.Is(err, engine.ErrReservationStale), errors.Is(err, engine.ErrLeaseReleased),
		errors.Is(err, engine.ErrUnknownLease):
		return http.StatusConflict
	case errors.Is(err, engine.ErrReservationExpired), errors.Is(err, engine.ErrLeaseExpired):
		return http.StatusGone
	case errors.Is(err, engine.ErrRefundUncertain), errors.Is(err, engine.ErrTooManyRefunds), errors.Is(err, engine.ErrReleaseUncertain):
		return http.StatusServiceUnavailable
	}
	log.Error("request failed", "error", err)
	return http.StatusInternalServerError
}

// writeDecision writes a decision's answer: 200 when allowed, else 429.
func writeDecision(w http.ResponseWriter, res *engine.Result) {
	status := http.StatusOK
	if !res.Allowed {
		status = http.StatusTooManyRequests
	}
	writeAnswer(w, res, status)
}

// writeAnswer writes a decision's JSON and header fields with status, with one allocation for
// the header values. Retry-After is sent with a rejection's status only (429, or the 403 a
// forward-auth request may ask for), never with a 200.
func writeAnswer(w http.ResponseWriter, res *engine.Result, status int) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	buf := buffers.Get().(*buffer)
	defer buffers.Put(buf)
	b := buf.b[:0]
	limited := res.Tier.Limited()
	// A rejection without a retry time (a cost above the limit) has no Retry-After: no wait
	// admits it.
	retry := status != http.StatusOK && res.RetryAfter > 0
	if limited || retry {
		// Header values: RateLimit-Policy, RateLimit, Retry-After, in one string.
		var ends [3]int
		n := 0
		if limited {
			b = res.Tier.AppendRateLimitPolicy(b)
			ends[n] = len(b)
			n++
			b = ratelimitheaders.AppendLimit(b, res.Tier.HeaderName(res.Binding), res.Remaining, res.ResetAfter)
			ends[n] = len(b)
			n++
		}
		if retry {
			b = ratelimitheaders.AppendRetryAfter(b, res.RetryAfter)
			ends[n] = len(b)
			n++
		}
		all := string(b)
		values := make([]string, n)
		start := 0
		for i := range n {
			values[i] = all[start:ends[i]]
			start = ends[i]
		}
		if limited {
			h[headerRateLimitPolicy] = values[0:1:1]
			h[headerRateLimit] = values[1:2:2]
		}
		if retry {
			h[headerRetryAfter] = values[n-1 : n : n]
		}
		b = b[:0]
	}
	if res.Tier.DryRun {
		if res.Outcome == engine.DryRunRejected {
			h[headerDryRun] = dryRunWouldReject
		} else {
			h[headerDryRun] = dryRunWouldAllow
		}
	}
	if res.LeaseToken != "" {
		h[headerLease] = []string{res.LeaseToken}
	}
	b = appendDecision(b, res, retry)
	b = append(b, '\n')
	buf.b = b
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// appendDecision appends the JSON object that answers a decision, the body of a single call and
// an item of a batch's results; retry says whether it names a retry time.
func appendDecision(b []byte, res *engine.Result, retry bool) []byte {
	limited := res.Tier.Limited()
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, res.Allowed)
	if limited {
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, res.Limit, 10)
		b = append(b, `,"remaining":`...)
		b = strconv.AppendInt(b, res.Remaining, 10)
	} else {
		b = append(b, `,"limit":null,"remaining":null`...)
	}
	b = append(b, `,"resetAfterSeconds":`...)
	b = strconv.AppendInt(b, ratelimitheaders.Seconds(res.ResetAfter), 10)
	b = append(b, `,"retryAfterSeconds":`...)
	if retry {
		b = ratelimitheaders.AppendRetryAfter(b, res.RetryAfter)
	} else {
		b = append(b, '0')
	}
	b = append(b, `,"resetAfterMs":`...)
	b = strconv.AppendInt(b, milliseconds(res.ResetAfter), 10)
	b = append(b, `,"retryAfterMs":`...)
	if retry {
		b = strconv.AppendInt(b, milliseconds(res.RetryAfter), 10)
	} else {
		b = append(b, '0')
	}
	if res.Tier.DryRun {
		// A dry-run tier admits every request: say so, and what enforcing it would answer.
		wouldAllow := res.Outcome != engine.DryRunRejected
		wouldRetry := !wouldAllow && res.RetryAfter > 0
		b = append(b, `,"dryRun":true,"wouldAllow":`...)
		b = strconv.AppendBool(b, wouldAllow)
		b = append(b, `,"wouldRetryAfterSeconds":`...)
		if wouldRetry {
			b = ratelimitheaders.AppendRetryAfter(b, res.RetryAfter)
		} else {
			b = append(b, '0')
		}
		b = append(b, `,"wouldRetryAfterMs":`...)
		if wouldRetry {
			b = strconv.AppendInt(b, milliseconds(res.RetryAfter), 10)
		} else {
			b = append(b, '0')
		}
	}
	if res.Refunded != nil { // a refund's answer: what it gave back (the binding limit's)
		b = append(b, `,"refunded":`...)
		b = strconv.AppendInt(b, res.Refunded[res.Binding], 10)
	}
	if res.Limits != nil {
		b = append(b, `,"limits":[`...)
		for i := range res.Limits {
			l := &res.Limits[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"name":`...)
			b = strconv.AppendQuote(b, res.Tier.Stack.Name(i)) // a DNS label: nothing to escape
			b = append(b, `,"allowed":`...)
			b = strconv.AppendBool(b, l.Allowed)
			b = append(b, `,"limit":`...)
			b = strconv.AppendInt(b, l.Limit, 10)
			b = append(b, `,"remaining":`...)
			b = strconv.AppendInt(b, l.Remaining, 10)
			b = append(b, `,"resetAfterSeconds":`...)
			b = strconv.AppendInt(b, ratelimitheaders.Seconds(l.ResetAfter), 10)
			b = append(b, `,"resetAfterMs":`...)
			b = strconv.AppendInt(b, milliseconds(l.ResetAfter), 10)
			if i < len(res.Refunded) {
				b = append(b, `,"refunded":`...)
				b = strconv.AppendInt(b, res.Refunded[i], 10)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if res.Reservation != "" {
		b = append(b, `,"reservation":"`...)
		b = append(b, res.Reservation...) // base64url: nothing to escape
		b = append(b, '"')
	}
	switch { // a release's answer: what it did
	case res.Released > 0:
		b = append(b, `,"released":`...)
		b = strconv.AppendInt(b, res.Released, 10)
	case res.Extended > 0:
		b = append(b, `,"extended":`...)
		b = strconv.AppendInt(b, res.Extended, 10)
	}
	if res.LeaseToken != "" {
		b = append(b, `,"lease":"`...)
		b = append(b, res.LeaseToken...) // base64url: nothing to escape
		b = append(b, `","leaseExpiresAt":"`...)
		b = res.LeaseExpiry.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, `","leaseTimeoutMs":`...)
		b = strconv.AppendInt(b, milliseconds(leaseTimeout(res)), 10)
	}
	return append(b, '}')
}

// leaseTimeout returns how long the lease of an answer holds its places from its issue: the
// tier's lease timeout (the shortest of its concurrency limits'), which the policy sets.
func leaseTimeout(res *engine.Result) time.Duration {
	var zero time.Time
	return res.Tier.Stack.LeaseExpiry(zero).Sub(zero)
}

// milliseconds returns d in whole milliseconds rounded up (0 for d <= 0), so that waiting that
// long is always enough.
func milliseconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Millisecond) + 1
}

// writeError answers {"error": msg} with status.
func writeError(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h["X-Content-Type-Options"] = noSniff
	body, err := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	if err != nil { // unreachable: a string always marshals
		body = []byte(`{"error":"internal error"}`)
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any, log *slog.Logger) {
	body, err := json.Marshal(v)
	if err != nil {
		log.Error("answer not encoded", "error", err)
		writeError(w, http.StatusInternalServerError, "answer not encoded")
		return
	}
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// AppendDecision appends the JSON object that answers a decision, as the body of /v1/allow and
// of forward-auth requests: with a retry time when res is a rejection that a wait admits.
func AppendDecision(b []byte, res *engine.Result) []byte {
	return appendDecision(b, res, !res.Allowed && res.RetryAfter > 0)
}
