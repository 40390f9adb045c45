// Package client asks limiterd's HTTP decisions API whether a workload's request may proceed.
//
//	c, err := client.New("http://limiterd:8080", client.WithPolicy("shop/api"))
//	d, err := c.Allow(ctx, "alice")
//	if err == nil && !d.Allowed { /* wait d.RetryAfter */ }
//
// A Client keeps its connections to limiterd alive and reuses them (one http.Transport with
// up to 64 idle connections to limiterd), and bounds each call by a timeout (DefaultTimeout
// unless WithTimeout says otherwise). It is safe for concurrent use. Package
// client/middleware limits an http.Handler with it.
//
// AllowBatch asks for up to MaxBatchItems decisions in one call (POST /v1/allow:batch), which
// costs limiterd far less than one call each: for workers that decide for many clients at once.
// A BatchItem's zero Cost spends 1, as Allow does; BatchItem.Peek looks without spending.
//
// On a tier with a concurrency limit (at most N of a client's requests in flight), an admitted
// Decision carries a Lease that holds its places: Release it when the work is done, Extend it
// while the work goes on; limiterd frees the places of a lease never released at its expiry.
//
//	d, err := c.Allow(ctx, "alice")
//	if err == nil && d.Allowed {
//		defer c.Release(context.WithoutCancel(ctx), d.Lease) // a release outlives ctx's cancellation
//		...
//	}
//
// A client key is any non-empty string of valid UTF-8. The Client refuses a key that is not
// (ErrKeyNotUTF8) before sending anything, rather than let JSON turn its invalid bytes into
// U+FFFD, which would make distinct keys share one budget. To key by binary data (a digest, an
// identifier in raw bytes), encode it first, e.g. "device:"+hex.EncodeToString(sum[:]) or
// base64.RawURLEncoding.EncodeToString(b): each value then has a key of its own.
//
// The package depends on the standard library only.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"
)

// DefaultTimeout bounds a call when WithTimeout is not given.
const DefaultTimeout = time.Second

// maxAnswerBytes bounds an answer body read from limiterd.
const maxAnswerBytes = 64 << 10

// Decision is limiterd's answer to one request.
type Decision struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Limit is the client's quota: a token bucket's capacity or a sliding window's limit; 0 when
	// its tier has no limit (then Remaining is 0 too).
	Limit int64
	// Remaining is how many more units the client could spend now.
	Remaining int64
	// ResetAfter is how long until the quota is whole again, in milliseconds rounded up (whole
	// seconds from a limiterd that does not answer resetAfterMs).
	ResetAfter time.Duration
	// RetryAfter is, for a rejected request, how long to wait before the same cost could be
	// admitted, in milliseconds rounded up (whole seconds from a limiterd that does not answer
	// retryAfterMs); 0 when allowed, and 0 for a rejection that no wait cures: a cost above
	// the tier's limit (Limit).
	RetryAfter time.Duration
	// Limits are the limits of a stacked tier, in the tier's order; nil for a tier of one
	// limit. A stacked tier admits a request only if every limit admits it, and charges none
	// when one rejects it; Limit, Remaining and ResetAfter above are then those of the limit
	// closest to exhaustion (of a rejection, the one that must wait longest), and RetryAfter the
	// wait until every limit admits the cost.
	Limits []Limit
	// RateLimitPolicy and RateLimit are the values of the header fields of the same names that
	// limiterd answered (draft-ietf-httpapi-ratelimit-headers-10), "" when absent, for a
	// workload to pass on to its own clients. RateLimitPolicy lists every limit of a stacked
	// tier.
	RateLimitPolicy, RateLimit string
	// Reservation names what an admitted decision charged, for Refund: set when the decision's
	// policy enables refunds (spec.refunds), the request was admitted, its cost was above 0 and
	// its tier has a limit; "" otherwise. It is opaque and signed by limiterd.
	Reservation string
	// Lease is the hold an admitted decision took on the places of its tier's concurrency limit
	// (a Concurrency tier, or a stack with a Concurrency limit): end it with Release when the
	// work is done, or keep it with Extend while the work goes on. It is the zero Lease when
	// no lease was taken: a rejection, a peek, a tier without a concurrency limit, or a lease
	// that a failure mode's fallback took, which no token names.
	Lease Lease
}

// Lease is the hold of an admitted request on the places of a concurrency limit ("at most N of
// a client's requests in flight"). limiterd frees the places when the lease is released
// (Client.Release) or, if it never is, at ExpiresAt, so that a caller that crashed holds
// nothing for ever; Client.Extend keeps them for another Timeout under a new Lease. The policy
// sets the timeout: the caller cannot choose it.
type Lease struct {
	// Token is the lease's opaque token, signed by limiterd; "" for no lease. It releases only
	// the places of the policy, client and tier that took it, once.
	Token string
	// ExpiresAt is when the places are freed if the lease is neither released nor extended, on
	// limiterd's clock.
	ExpiresAt time.Time
	// Timeout is the tier's lease timeout: how long a lease holds from its issue or extension.
	Timeout time.Duration
}

// Limit is one limit of a stacked tier in a Decision.
type Limit struct {
	// Name is the limit's name in its tier.
	Name string
	// Allowed reports whether this limit alone admits the request (for a rejected request, the
	// limits that would have admitted it were not charged either).
	Allowed bool
	// Limit is the limit's quota: a token bucket's capacity or a sliding window's limit.
	Limit int64
	// Remaining is how many more units this limit would admit now.
	Remaining int64
	// ResetAfter is how long until this limit's quota is whole again, in milliseconds rounded
	// up.
	ResetAfter time.Duration
}

// Error is an answer of limiterd that is not a decision: a 4xx or 5xx status with its message.
type Error struct {
	// StatusCode is the HTTP status, e.g. 404 for an unknown policy.
	StatusCode int
	// Message is limiterd's error message, or a description of an answer that was not one.
	Message string
}

// Error returns the status and message.
func (e *Error) Error() string {
	return fmt.Sprintf("limiterd answered %d %s: %s", e.StatusCode, http.StatusText(e.StatusCode), e.Message)
}

// Unavailable reports whether err says that limiterd could not decide for a reason of its own
// availability: it could not be reached or did not answer in time (the error of a failed
// connection, a timeout, a body cut short), or it answered a 5xx status (an *Error: not ready,
// its store failed). Such a failure is not the request's doing and may pass on a retry; it is
// what a caller may choose to fail open on.
//
// It is false for nil, for a 4xx answer (an *Error: the request was malformed or named an
// unknown policy, and fails the same way every time) and for an answer that is not a decision
// (whatever answers at limiterd's address is not limiterd, or not the version this package
// reads): a caller must not admit a request on such an error, since whoever chooses what
// the request carries could then choose to pass.
func Unavailable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.StatusCode >= 500 && e.StatusCode <= 599
	}
	var u *unavailableError
	return errors.As(err, &u)
}

// ErrKeyNotUTF8 is the error, wrapped, of a client key that is not valid UTF-8: the Client
// refuses it before asking limiterd (a batch refuses that item alone, in its Result.Err), and
// nothing is decided or consumed. JSON has no way to carry such a key (it would arrive with each
// invalid byte replaced by U+FFFD, so that distinct keys shared one budget), and limiterd
// refuses one. It is not Unavailable: it fails the same way every time, and a caller must not
// admit the request on it. Derive a key from binary data with an encoding that is UTF-8, such as
// hex.EncodeToString or base64.RawURLEncoding.EncodeToString.
var ErrKeyNotUTF8 = errors.New("client key is not valid UTF-8")

// checkKey returns an error wrapping ErrKeyNotUTF8 when key is not valid UTF-8. The error says
// where the key goes wrong but not what it holds: a key may be a secret (an API key).
func checkKey(key string) error {
	for i := 0; i < len(key); {
		r, size := utf8.DecodeRuneInString(key[i:])
		if r == utf8.RuneError && size <= 1 {
			return fmt.Errorf("%w: byte %d of %d is not part of a UTF-8 sequence (encode binary keys as hex or base64)",
				ErrKeyNotUTF8, i, len(key))
		}
		i += size
	}
	return nil
}

// unavailableError is an error of the transport: no answer was had.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// Client asks limiterd for decisions. Create it with New.
type Client struct {
	allowURL   string
	refundURL  string
	releaseURL string
	policy     string
	timeout    time.Duration
	tls        *tls.Config
	http       *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithPolicy names the policy decisions are made under: "<namespace>/<name>", or "<name>" in
// namespace default. Without it, limiterd decides under its only policy, and answers 400 when
// several are loaded.
func WithPolicy(id string) Option { return func(c *Client) { c.policy = id } }

// WithTimeout bounds each call, including connecting and reading the answer (0: no bound but
// the context's).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithTLSConfig makes calls over https:// with cfg on the Client's own tuned transport: the CA
// that signed limiterd's certificate (RootCAs), and the client certificate limiterd asks for
// under mutual TLS (Certificates or GetClientCertificate). cfg is cloned; a certificate it
// returns from GetClientCertificate may change over time. Ignored with WithHTTPClient.
func WithTLSConfig(cfg *tls.Config) Option { return func(c *Client) { c.tls = cfg.Clone() } }

// WithHTTPClient makes calls with hc instead of the Client's own tuned transport, e.g. for TLS
// settings. Its Timeout, if any, applies as well.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// New returns a client of the limiterd whose decisions API is at baseURL ("http://host:port",
// optionally with a path prefix).
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("limiterd base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("limiterd base URL %q: want http://host[:port] or https://host[:port]", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("limiterd base URL %q: must have no query or fragment", baseURL)
	}
	c := &Client{allowURL: u.JoinPath("v1", "allow").String(), refundURL: u.JoinPath("v1", "refund").String(),
		releaseURL: u.JoinPath("v1", "release").String(), timeout: DefaultTimeout}
	for _, o := range opts {
		o(c)
	}
	if c.timeout < 0 {
		return nil, fmt.Errorf("limiterd client timeout %v is negative", c.timeout)
	}
	if c.http == nil {
		t := newTransport()
		t.TLSClientConfig = c.tls
		c.http = &http.Client{Transport: t}
	}
	return c, nil
}

// newTransport returns a transport tuned for many small requests to one host: connections are
// kept alive and up to 64 idle ones are kept for reuse (net/http's default keeps 2, so that
// concurrent callers keep opening new connections).
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          64,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // answers are a hundred bytes
	}
}

// Allow asks whether the client key may make one request: AllowN with cost 1. A key is any
// non-empty string of UTF-8 (see ErrKeyNotUTF8).
func (c *Client) Allow(ctx context.Context, key string) (Decision, error) {
	return c.AllowN(ctx, key, 1)
}

// allowRequest is the body of POST /v1/allow.
type allowRequest struct {
	Policy string `json:"policy,omitempty"`
	Key    string `json:"key"`
	Cost   int64  `json:"cost"`
}

// answer is the body of a decision; limit and remaining are null for a tier without a limit.
type answer struct {
	Allowed           *bool  `json:"allowed"`
	Limit             *int64 `json:"limit"`
	Remaining         *int64 `json:"remaining"`
	ResetAfterSeconds int64  `json:"resetAfterSeconds"`
	RetryAfterSeconds int64  `json:"retryAfterSeconds"`
	ResetAfterMs      *int64 `json:"resetAfterMs"`
	RetryAfterMs      *int64 `json:"retryAfterMs"`
	// Limits are a stacked tier's limits.
	Limits []limitAnswer `json:"limits"`
	// Reservation names what an admitted decision charged.
	Reservation string `json:"reservation"`
	// Lease, LeaseExpiresAt and LeaseTimeoutMs are the lease an admitted decision of a tier with
	// a concurrency limit took, or an extension's new lease.
	Lease          string `json:"lease"`
	LeaseExpiresAt string `json:"leaseExpiresAt"`
	LeaseTimeoutMs *int64 `json:"leaseTimeoutMs"`
}

// limitAnswer is one limit of a stacked tier in a decision.
type limitAnswer struct {
	Name              string `json:"name"`
	Allowed           *bool  `json:"allowed"`
	Limit             int64  `json:"limit"`
	Remaining         int64  `json:"remaining"`
	ResetAfterSeconds int64  `json:"resetAfterSeconds"`
	ResetAfterMs      *int64 `json:"resetAfterMs"`
}

// Peek reports what a one-unit request of the client key would get now, consuming nothing:
// AllowN with cost 0.
func (c *Client) Peek(ctx context.Context, key string) (Decision, error) {
	return c.AllowN(ctx, key, 0)
}

// AllowN asks whether the client key may spend cost units; a cost of 0 peeks (see Peek). It
// returns an error wrapping ErrKeyNotUTF8, without asking limiterd, for a key that is not valid
// UTF-8; an *Error when limiterd answers with an error status (the request was not decided and
// consumed nothing); and another error when limiterd could not be asked or answered something
// that is not a decision. Unavailable tells the failures of limiterd's availability from the
// others.
func (c *Client) AllowN(ctx context.Context, key string, cost int64) (Decision, error) {
	if err := checkKey(key); err != nil {
		return Decision{}, err
	}
	body, err := json.Marshal(allowRequest{Policy: c.policy, Key: key, Cost: cost})
	if err != nil { // unreachable: strings and integers always marshal
		return Decision{}, fmt.Errorf("encode decision request: %w", err)
	}
	return c.post(ctx, c.allowURL, body)
}

// refundRequest is the body of POST /v1/refund.
type refundRequest struct {
	Reservation string `json:"reservation"`
	Cost        int64  `json:"cost,omitempty"`
}

// Refund gives back cost units (0: all) of the admitted decision whose Reservation it names,
// for example the part of an estimated cost that was not used, and returns the client's state
// after it as Peek would. limiterd refunds a reservation at most once, at most its cost, only
// while its units still count, and only when the decision's policy enables refunds
// (spec.refunds); it clamps the refund so that the allowance never exceeds its limit.
//
// A refund is idempotent: after an error whose outcome is unknown (a timeout, a 503), call
// Refund again with the same reservation. An *Error with StatusCode 409 then means the refund
// was made before and nothing more was refunded; 400, 403 and 410 mean it will never be made
// (malformed or past its cost, not issued by this limiterd or refunds disabled, expired).
func (c *Client) Refund(ctx context.Context, reservation string, cost int64) (Decision, error) {
	body, err := json.Marshal(refundRequest{Reservation: reservation, Cost: cost})
	if err != nil { // unreachable: strings and integers always marshal
		return Decision{}, fmt.Errorf("encode refund request: %w", err)
	}
	return c.post(ctx, c.refundURL, body)
}

// ErrNoLease is the error, wrapped, of Release or Extend given the zero Lease (the Lease of a
// Decision that took none): the Client refuses it without asking limiterd.
var ErrNoLease = errors.New("no lease: the decision took none (a rejection, a peek, or a tier without a concurrency limit)")

// releaseRequest is the body of POST /v1/release.
type releaseRequest struct {
	Lease  string `json:"lease"`
	Extend bool   `json:"extend"`
}

// Release ends lease, the Lease of an admitted Decision, freeing its places at once: call it
// when the request's work is done (package middleware does, when the handler returns). It
// returns an error wrapping ErrNoLease, without asking limiterd, for the zero Lease, and an
// *Error when limiterd refuses the release, which then changed nothing:
//
//   - 400: the token is malformed (or is a refund's reservation);
//   - 403: limiterd did not sign it (forged, altered, or another deployment's);
//   - 404: the lease's policy is no longer loaded;
//   - 409: the lease was released or extended before (after an extension, only the new lease
//     releases), or the policies served no longer hold it (its client changed tier, the tier's
//     lease timeout changed, the policy was re-created or the replica restarted since);
//   - 410: the lease expired, or its client was reset since: its places are free already;
//   - 503: the store failed, and the release may or may not have been made.
//
// The Client never retries a call, a release no more than a decision. A release is safe to
// retry with the same lease, since limiterd releases a lease once: after an error whose outcome
// is unknown (Unavailable: a timeout, a lost connection, a 503), call Release again; a 409 then
// means the first call released it. Not retrying is safe too: the places are freed at the
// lease's ExpiresAt.
func (c *Client) Release(ctx context.Context, lease Lease) error {
	_, err := c.release(ctx, lease, false)
	return err
}

// Extend keeps the places of lease for the tier's lease timeout from now, under the new Lease
// it returns; lease is then spent (a Release or Extend of it answers 409): release or extend
// the new one. Call it while the work goes on, before lease.ExpiresAt. Its errors are those of
// Release, with the same meaning; the lease is kept only on success.
//
// An extension is not safe to retry blindly: if its answer is lost (Unavailable: a timeout, a
// lost connection, a 503), limiterd may have extended the lease under a new token that nobody
// holds. Extend with the same lease again: a new Lease means the first call had not extended
// it; a 409 means it had, and the places stay held, by the lost lease, until a lease timeout
// after that call, with no token left to release them sooner.
func (c *Client) Extend(ctx context.Context, lease Lease) (Lease, error) {
	d, err := c.release(ctx, lease, true)
	if err != nil {
		return Lease{}, err
	}
	if d.Lease.Token == "" {
		return Lease{}, errors.New("limiterd's extension answered no lease")
	}
	return d.Lease, nil
}

// release POSTs a release or extension of lease and reads its answer: a peek after it, with the
// new lease of an extension.
func (c *Client) release(ctx context.Context, lease Lease, extend bool) (Decision, error) {
	if lease.Token == "" {
		return Decision{}, ErrNoLease
	}
	body, err := json.Marshal(releaseRequest{Lease: lease.Token, Extend: extend})
	if err != nil { // unreachable: strings and booleans always marshal
		return Decision{}, fmt.Errorf("encode release request: %w", err)
	}
	ans, err := c.send(ctx, c.releaseURL, body, maxAnswerBytes)
	if err != nil {
		return Decision{}, err
	}
	if ans.status != http.StatusOK {
		return Decision{}, errorOf(ans.status, ans.data)
	}
	// The answer is a peek after the release or extension, 200 whatever it says: a peek at a
	// limit whose places an extension kept says allowed false.
	return decodeAnswer(ans)
}

// post sends a JSON request and reads limiterd's decision.
func (c *Client) post(ctx context.Context, target string, body []byte) (Decision, error) {
	ans, err := c.send(ctx, target, body, maxAnswerBytes)
	if err != nil {
		return Decision{}, err
	}
	switch ans.status {
	case http.StatusOK, http.StatusTooManyRequests:
		return decode(ans)
	}
	return Decision{}, errorOf(ans.status, ans.data)
}

// httpAnswer is an answer of limiterd, read whole.
type httpAnswer struct {
	status int
	header http.Header
	data   []byte
}

// send POSTs a JSON body within the Client's timeout and reads the answer, of at most limit
// bytes, whole.
func (c *Client) send(ctx context.Context, target string, body []byte, limit int64) (httpAnswer, error) {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return httpAnswer{}, fmt.Errorf("limiterd request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return httpAnswer{}, &unavailableError{fmt.Errorf("ask limiterd: %w", err)}
	}
	// The answer is read whole, or abandoned on an error that is the one to report: an error
	// closing the body cannot change the outcome.
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return httpAnswer{}, &unavailableError{fmt.Errorf("read limiterd's answer: %w", err)}
	}
	if int64(len(data)) > limit {
		if resp.StatusCode >= 500 { // a proxy's error page, say: still a failure of the service
			return httpAnswer{}, &Error{StatusCode: resp.StatusCode, Message: fmt.Sprintf("an answer larger than %d bytes", limit)}
		}
		return httpAnswer{}, fmt.Errorf("limiterd's answer (%d) is larger than %d bytes", resp.StatusCode, limit)
	}
	return httpAnswer{status: resp.StatusCode, header: resp.Header, data: data}, nil
}

// decode reads a decision answered with status 200 or 429.
func decode(ans httpAnswer) (Decision, error) {
	d, err := decodeAnswer(ans)
	if err != nil {
		return Decision{}, err
	}
	if d.Allowed != (ans.status == http.StatusOK) {
		return Decision{}, fmt.Errorf("limiterd's decision says allowed=%t with status %d", d.Allowed, ans.status)
	}
	return d, nil
}

// decodeAnswer reads the decision of an answer, whatever its status.
func decodeAnswer(ans httpAnswer) (Decision, error) {
	var a answer
	if err := json.Unmarshal(ans.data, &a); err != nil {
		return Decision{}, fmt.Errorf("decode limiterd's decision (%d): %w", ans.status, err)
	}
	d, err := a.decision()
	if err != nil {
		return Decision{}, fmt.Errorf("limiterd's decision (%d) %w", ans.status, err)
	}
	d.RateLimitPolicy = ans.header.Get("RateLimit-Policy")
	d.RateLimit = ans.header.Get("RateLimit")
	return d, nil
}

// decision checks a decision's JSON and returns it, without header fields.
func (a *answer) decision() (Decision, error) {
	switch {
	case a.Allowed == nil:
		return Decision{}, errors.New("has no \"allowed\"")
	case a.ResetAfterSeconds < 0 || a.RetryAfterSeconds < 0,
		a.ResetAfterMs != nil && *a.ResetAfterMs < 0, a.RetryAfterMs != nil && *a.RetryAfterMs < 0:
		return Decision{}, errors.New("has a negative duration")
	}
	d := Decision{
		Allowed:     *a.Allowed,
		ResetAfter:  duration(a.ResetAfterSeconds, a.ResetAfterMs),
		RetryAfter:  duration(a.RetryAfterSeconds, a.RetryAfterMs),
		Reservation: a.Reservation,
	}
	if a.Lease != "" {
		expires, err := time.Parse(time.RFC3339Nano, a.LeaseExpiresAt)
		switch {
		case err != nil:
			return Decision{}, fmt.Errorf("has a lease without a valid \"leaseExpiresAt\": %w", err)
		case a.LeaseTimeoutMs == nil || *a.LeaseTimeoutMs < 0:
			return Decision{}, errors.New("has a lease without a valid \"leaseTimeoutMs\"")
		}
		d.Lease = Lease{Token: a.Lease, ExpiresAt: expires, Timeout: milliseconds(*a.LeaseTimeoutMs)}
	}
	if a.Limit != nil {
		d.Limit = *a.Limit
	}
	if a.Remaining != nil {
		d.Remaining = *a.Remaining
	}
	for i, l := range a.Limits {
		switch {
		case l.Name == "" || l.Allowed == nil:
			return Decision{}, fmt.Errorf("has a limit (%d) without a name or \"allowed\"", i)
		case l.ResetAfterSeconds < 0 || l.ResetAfterMs != nil && *l.ResetAfterMs < 0:
			return Decision{}, fmt.Errorf("has a limit (%q) with a negative duration", l.Name)
		}
		d.Limits = append(d.Limits, Limit{Name: l.Name, Allowed: *l.Allowed, Limit: l.Limit, Remaining: l.Remaining,
			ResetAfter: duration(l.ResetAfterSeconds, l.ResetAfterMs)})
	}
	return d, nil
}

// duration reads one of an answer's durations: its milliseconds when the answer has them, else
// its whole seconds.
func duration(s int64, ms *int64) time.Duration {
	if ms != nil {
		return milliseconds(*ms)
	}
	return seconds(s)
}

// seconds converts whole seconds to a duration, saturating instead of overflowing.
func seconds(s int64) time.Duration {
	if s > int64(time.Duration(1<<63-1)/time.Second) {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(s) * time.Second
}

// milliseconds converts whole milliseconds to a duration, saturating instead of overflowing.
func milliseconds(ms int64) time.Duration {
	if ms > int64(time.Duration(1<<63-1)/time.Millisecond) {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(ms) * time.Millisecond
}

// errorOf describes an error answer.
func errorOf(status int, data []byte) *Error {
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(data, &e); err == nil && e.Error != "" {
		return &Error{StatusCode: status, Message: e.Error}
	}
	msg := string(bytes.TrimSpace(data))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	if msg == "" {
		msg = "(no body)"
	}
	return &Error{StatusCode: status, Message: "not a limiterd error answer: " + strconv.Quote(msg)}
}
