// Package envoyrls serves limiterd's decisions as Envoy's global rate-limit service:
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over gRPC, so that Envoy's
// ratelimit HTTP or network filter can ask limiterd directly.
//
// # Domain
//
// A request's domain names the policy: "<namespace>/<name>", or "<name>" for a policy of the
// namespace "default" (as in a policy file document without a namespace), as the HTTP decision
// API's "policy" does (v1alpha1.RequestedPolicyID). The mapping never
// depends on which other policies are loaded. An empty domain is InvalidArgument; a domain that
// names no loaded policy is NotFound.
//
// # Descriptors
//
// Each descriptor is decided on its own as one client of the policy, with the policy's
// spec.envoy.descriptorKey saying which client:
//
//   - descriptorKey set: the client key is the value of the first entry with that key, so
//     [("remote_address", "10.0.0.1")] is the client "10.0.0.1", exactly as an HTTP decision
//     request for key "10.0.0.1" (the policy's overrides apply to both alike). A descriptor
//     without such an entry is not limited by this policy: its status is OK with no
//     current_limit, and nothing is consumed — as Envoy's reference service answers for a
//     descriptor that matches no configured limit.
//   - descriptorKey empty (the default): the client key is the whole descriptor, its entries in
//     order as key=value joined by '&', with '%', '&' and '=' in keys and values written %25,
//     %26 and %3D: [("generic_key", "api"), ("remote_address", "10.0.0.1")] is the client
//     "generic_key=api&remote_address=10.0.0.1". Distinct descriptors are distinct clients.
//
// A client key's content never fails a request, since a descriptor's values can come from the
// client (a header Envoy copies, say), and Envoy's failure_mode_deny: false admits a request
// the service fails:
//
//   - a key of any length is a client: one longer than 1024 bytes (v1alpha1.MaxClientKeyBytes)
//     is kept under the SHA-256 digest of the whole key, as in the HTTP API (engine.ClientKey),
//     with the tier its overrides give it;
//   - an empty value of the descriptorKey entry is the client "" (one client for every such
//     descriptor), which no override can name: it has the default tier.
//
// A descriptor's cost is its own hits_addend when set, else the request's hits_addend when not
// 0, else 1 (Envoy defines a request's hits_addend of 0 as 1). A cost above 1000000000
// (v1alpha1.MaxCapacity, also Envoy's bound, above every tier's limit) is admitted by no tier:
// that descriptor alone is OVER_LIMIT, without current_limit, and consumes nothing (a dry-run
// tier does not admit it either), while the request's other descriptors are decided.
//
// A descriptor whose own hits_addend is set to 0 is a peek, as in Envoy's reference service
// ("check only, no increment"): its status describes the client's state as a one-unit request
// would see it (OVER_LIMIT when one unit would be rejected now) and nothing is consumed. This
// is the only way to peek over gRPC, since the request's hits_addend cannot say 0.
//
// A descriptor's limit override ("limit") is ignored: the policy's tiers are the limits.
//
// # Refunds: is_negative_hits is refused
//
// A descriptor with is_negative_hits asks to give units back, but cannot name the reservation
// of the admitted decision that charged them, which is what makes a refund bound (POST
// /v1/refund, see package server): anyone could otherwise refill anyone. So it is refused, and
// nothing is refunded: its status has code UNKNOWN (neither OK nor OVER_LIMIT: not decided)
// and no current_limit, whatever its policy's spec.refunds. Refusing it never fails the
// request: the request's other descriptors are decided as usual, and overall_code is theirs
// (OVER_LIMIT when any of them is; OK otherwise). Refunds go through the HTTP API.
//
// Every descriptor is checked before any is decided, so a request that is refused as a whole
// (any error status) consumes nothing.
//
// # Bounds and bytes
//
// A request holds at most MaxDescriptors (1000, as an HTTP batch) descriptors of at most
// MaxDescriptorEntries (64) entries each, in at most MaxRequestBytes (64 KiB, the bound of one
// HTTP request's body). Served with ServerOptions, the server holds at most MaxCallsInFlight
// (256) calls at once over all its connections, and refuses one past it with
// ResourceExhausted before reading its message; Envoy treats that as any failed call, so its
// failure_mode_deny decides, as for an HTTP 503. Served with ServerOptions, the server's Codec refuses a request past a count
// as it reads it, before it allocates any of its messages: registered with Register, the call
// fails with InvalidArgument and a message naming the bound (registered the generated way,
// with Internal, the code grpc-go gives any error of a codec, which reads as a server fault), and
// grpc-go refuses a larger message with ResourceExhausted from its length alone; through
// another codec, the service refuses past a count with InvalidArgument. The Codec keeps
// strings as sent: a descriptor's keys and values (and the domain) need not be UTF-8, as
// Envoy copies header values, which may hold bytes above 0x7F, into entries; such a value is
// a client like any other, distinct from every other byte string.
//
// # Several descriptors
//
// Several descriptors in one request are decided in order, independently, each consuming its
// cost when it is under its limit even if another one is over — what Envoy's reference service
// does; descriptors of one client are decided one after the other, each on the state the one
// before left. overall_code is OVER_LIMIT when any descriptor is; statuses has one entry per
// descriptor, in order. They are decided as one batch, as the HTTP API's batch is
// (engine.DecideBatch): on Redis, in pieces of bounded work each within the store timeout,
// the pieces after one that timed out sent only if Redis answers a health check (the
// descriptors not sent are answered by the policy's failure mode), and scripts Redis lost
// loaded once for the request. So a request of any number of descriptors waits for a stalled
// Redis at most about twice the store timeout, where one decision per descriptor waited the
// timeout for each until the circuit breaker opened (an 8-descriptor request waited out a
// 6 s pause at a timeout of 1 s).
//
// # Answer
//
// A descriptor's status carries its code, and for a tier with a limit: current_limit (name: the
// tier; requests_per_unit: the limit; unit and unit_multiplier: the window the limit is
// expressed over — a token bucket's full refill, a sliding window's window — rounded up to whole
// seconds and written in the largest of DAY, HOUR, MINUTE, SECOND that divides it; for a
// calendar quota, the period's own unit: DAY, WEEK, MONTH or YEAR, without unit_multiplier),
// limit_remaining and duration_until_reset (for a quota, the time until its period ends in its
// zone). A tier without a limit (Unlimited) has no
// current_limit. A dry-run tier's status is always OK and describes the decision that would
// have been enforced.
//
// A descriptor whose client resolves to a stacked tier is decided as an HTTP request is: all
// or nothing, over every limit of the tier. Its status reports the binding limit, the one the
// HTTP API's RateLimit field reports (closest to exhaustion, or of a rejection the one that
// waits longest): current_limit is that limit's quota and window, named "<tier>/<limit>", and
// limit_remaining and duration_until_reset are its own; the code is OVER_LIMIT when any limit
// rejects. The other limits appear in the RateLimit-Policy header field (below), which lists
// every limit of the tier. The status has room for one limit only, so the binding one is the
// one Envoy's filters and statistics see.
//
// response_headers_to_add carries the header fields of the HTTP API (package
// ratelimitheaders) for the most restrictive descriptor — the over-limit one that must wait
// longest, else the limited one with the least remaining quota — so that Envoy passes them on:
// RateLimit-Policy and RateLimit (when that descriptor's tier has a limit), and Retry-After
// (OVER_LIMIT only). For a single descriptor they are exactly those of the HTTP API's answer.
//
// # Errors
//
// A request that cannot be decided gets a gRPC error status and consumes nothing:
// InvalidArgument for a malformed request, NotFound for an unknown domain, Unavailable before any
// policy is loaded. Envoy counts any error as a failure of the rate-limit service and lets its
// failure_mode_deny decide: false (Envoy's default) admits the request unlimited, true answers
// it 500. limiterd never answers the UNKNOWN code as a request's overall_code or error, which Envoy
// would take as OK (only a refused refund descriptor's own status is UNKNOWN). Nothing a
// client of Envoy can put in a descriptor (a key's length or bytes, an empty value, a cost)
// makes a request an error; what can is Envoy's configuration (a descriptor without entries, a
// domain naming no loaded policy) and limiterd's own state.
//
// # Envoy configuration
//
// limiterd serves this on --grpc-addr in plaintext HTTP/2, or over TLS (1.2 or later) when
// --tls-cert-file and --tls-key-file are set: the decisions API's certificate and key, reloaded
// when the files change. --tls-client-ca-file adds mutual TLS: a client without a certificate
// signed by one of its CAs fails the handshake. With TLS, Envoy's cluster needs a TLS transport
// socket (an UpstreamTlsContext, holding Envoy's client certificate under mutual TLS). To limit
// each client address under the policy edge/per-ip, whose spec.envoy.descriptorKey is
// remote_address:
//
//	http_filters:
//	- name: envoy.filters.http.ratelimit
//	  typed_config:
//	    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
//	    domain: edge/per-ip
//	    failure_mode_deny: true           # refuse (500) when limiterd cannot answer
//	    rate_limit_service:
//	      transport_api_version: V3
//	      grpc_service: {envoy_grpc: {cluster_name: limiterd}}   # an HTTP/2 cluster
//	# on the route or virtual host:
//	rate_limits:
//	- actions: [{remote_address: {}}]   # descriptor [("remote_address", "<client address>")]
//
// failure_mode_deny says what Envoy does when limiterd cannot answer (unreachable, a timeout,
// an error status): true refuses the request, false admits it with no limit at all. Whoever
// can make limiterd fail, or wait for it to, then passes unlimited; so set it to true wherever
// the limit protects something (a backend's capacity, a login endpoint, a paid quota), and
// false only where availability matters more than the limit and a limiterd outage is
// acceptable as no limit. limiterd's own failure modes (spec.failureMode: Open, Closed, Local)
// decide what happens while its store fails; failure_mode_deny only covers limiterd itself.
//
// Overrides see the values of descriptors: name in them only values the client cannot choose
// (remote_address as Envoy derives it from a connection or trusted hops, a header your own
// authentication set after verifying the caller), never a header the client sends as it likes.
package envoyrls

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/ratelimitheaders"
)

// MaxCost bounds the cost of one descriptor.
const MaxCost = v1alpha1.MaxCapacity

// Service implements rlsv3.RateLimitServiceServer for an engine. Register it with
// rlsv3.RegisterRateLimitServiceServer. It is safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	engine *engine.Engine
	log    *slog.Logger
}

// New returns the rate-limit service of e. log receives unexpected failures only (nil:
// slog.Default); a decision logs nothing.
func New(e *engine.Engine, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{engine: e, log: log}
}

// item is one descriptor, checked.
type item struct {
	key     string
	cost    int64
	limited bool // false: the descriptor has no entry of the policy's descriptorKey
	refund  bool // is_negative_hits: refused (it names no reservation)
	overMax bool // its cost is above MaxCost: rejected (OVER_LIMIT) without a decision
}

// decided reports whether the item needs a decision: limited, neither a refund nor over MaxCost.
func (it *item) decided() bool { return it.limited && !it.refund && !it.overMax }

// ShouldRateLimit decides a request's descriptors (see the package documentation).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	domain := req.GetDomain()
	if domain == "" {
		return nil, status.Errorf(codes.InvalidArgument, "domain is required: it names the policy, <namespace>/<name>")
	}
	descriptors := req.GetDescriptors()
	switch {
	case len(descriptors) == 0:
		return nil, status.Errorf(codes.InvalidArgument, "at least one descriptor is required")
	case len(descriptors) > MaxDescriptors: // decoded by another codec than Codec
		return nil, status.Errorf(codes.InvalidArgument, "%v", ErrTooManyDescriptors)
	}
	set := s.engine.Policies()
	if set == nil {
		return nil, status.Errorf(codes.Unavailable, "%v", engine.ErrNotReady)
	}
	id := v1alpha1.RequestedPolicyID(domain)
	p, ok := set.Get(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%v %q (domain %q)", engine.ErrUnknownPolicy, id, domain)
	}
	var descriptorKey string
	if e := p.Source.Spec.Envoy; e != nil {
		descriptorKey = e.DescriptorKey
	}
	items := make([]item, len(descriptors))
	for i, d := range descriptors {
		if len(d.GetEntries()) > MaxDescriptorEntries {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, ErrTooManyEntries)
		}
		it, err := check(d, descriptorKey, req.GetHitsAddend())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		items[i] = it
	}

	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items)),
	}
	var one [1]engine.BatchResult
	results, err := s.decide(ctx, id, items, one[:0])
	if err != nil {
		return nil, err
	}
	var (
		pick    *engine.Result // the most restrictive decision, for the headers (nil: none yet)
		retries bool           // pick was rejected
	)
	for i, it := range items {
		if !it.limited {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
			continue
		}
		if it.refund { // refused: see the package documentation
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_UNKNOWN}
			continue
		}
		if it.overMax { // no tier admits it: rejected, nothing consumed, the others decided
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		}
		res := &results[0].Result // in place: a Result is some 160 bytes
		results = results[1:]
		resp.Statuses[i] = descriptorStatus(res)
		if !res.Allowed {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if moreRestrictive(res, pick, pick != nil, retries) {
			pick, retries = res, !res.Allowed
		}
	}
	if pick != nil {
		resp.ResponseHeadersToAdd = HeaderValues(pick)
	}
	return resp, nil
}

// decide decides the items that need a decision (item.decided), in order, and returns their results, appended to out; an item that cannot be decided fails
// the request with its status. Several items are one batch (engine.DecideBatch), as an HTTP
// batch is: on Redis, pieces of bounded work each within the store timeout, and after a
// piece that timed out, the rest only if Redis answers a health check, so that a request of
// many descriptors waits for a stalled Redis at most about twice the store timeout instead of
// the timeout once per descriptor; and scripts Redis lost are loaded once for the request.
func (s *Service) decide(ctx context.Context, id v1alpha1.PolicyID, items []item, out []engine.BatchResult) ([]engine.BatchResult, error) {
	n, first := 0, -1
	for i := range items {
		if items[i].decided() {
			n++
			if first < 0 {
				first = i
			}
		}
	}
	switch n {
	case 0:
		return out, nil
	case 1: // the common request, decided in place
		out = append(out, engine.BatchResult{})
		if err := s.engine.DecideInto(ctx, id, items[first].key, items[first].cost, &out[len(out)-1].Result); err != nil {
			return nil, s.decideError(err, id)
		}
		return out, nil
	}
	batch := make([]engine.BatchItem, 0, n)
	for _, it := range items[first:] {
		if it.decided() {
			batch = append(batch, engine.BatchItem{Policy: id, Key: it.key, Cost: it.cost})
		}
	}
	out = slices.Grow(out[:0], n)[:n]
	if err := s.engine.DecideBatch(ctx, batch, out); err != nil {
		return nil, s.decideError(err, id)
	}
	for i := range out {
		if out[i].Err != nil {
			return nil, s.decideError(out[i].Err, id)
		}
	}
	return out, nil
}

// moreRestrictive reports whether res should replace pick (valid when picked) as the decision
// the headers describe: a rejection beats an admission and the longer wait beats the shorter,
// a rejection that no wait cures (RetryAfter 0: a cost above the limit) being the longest;
// among admissions, the smaller remaining quota of a limited tier wins. Ties keep pick.
func moreRestrictive(res, pick *engine.Result, picked, pickRejected bool) bool {
	switch {
	case !res.Allowed:
		return !pickRejected || (pick.RetryAfter > 0 && (res.RetryAfter == 0 || res.RetryAfter > pick.RetryAfter))
	case pickRejected || !res.Tier.Limited():
		return false
	case !picked || !pick.Tier.Limited():
		return true
	}
	return res.Remaining < pick.Remaining
}

// check reads a descriptor's client key and cost; it returns an error the client can be shown
// only for what no client of Envoy can send (a descriptor without entries). What a client can
// choose never fails the request: a key of any length or none is a client (engine.ClientKey),
// and a cost above MaxCost rejects the descriptor alone.
func check(d *ratelimitv3.RateLimitDescriptor, descriptorKey string, requestHits uint32) (item, error) {
	entries := d.GetEntries()
	if len(entries) == 0 {
		return item{}, errors.New("has no entries")
	}
	it := item{cost: 1, limited: true, refund: d.GetIsNegativeHits()}
	switch h := d.GetHitsAddend(); {
	case h.GetValue() > MaxCost:
		it.overMax = true
	case h != nil:
		it.cost = int64(h.GetValue()) // 0: a peek
	case requestHits > MaxCost:
		it.overMax = true
	case requestHits > 0:
		it.cost = int64(requestHits)
	}
	if descriptorKey != "" {
		it.limited = false
		for _, e := range entries {
			if e.GetKey() == descriptorKey {
				it.key, it.limited = e.GetValue(), true
				break
			}
		}
		return it, nil
	}
	it.key = JoinEntries(entries)
	return it, nil
}

// JoinEntries returns the client key of a whole descriptor: its entries in order as key=value
// joined by '&', with '%', '&' and '=' in keys and values written %25, %26 and %3D. Distinct
// entry lists give distinct keys.
func JoinEntries(entries []*ratelimitv3.RateLimitDescriptor_Entry) string {
	var b strings.Builder
	n := 0
	for _, e := range entries {
		n += len(e.GetKey()) + len(e.GetValue()) + 2
	}
	b.Grow(n)
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('&')
		}
		writeEscaped(&b, e.GetKey())
		b.WriteByte('=')
		writeEscaped(&b, e.GetValue())
	}
	return b.String()
}

func writeEscaped(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b.WriteString("%25")
		case '&':
			b.WriteString("%26")
		case '=':
			b.WriteString("%3D")
		default:
			b.WriteByte(c)
		}
	}
}

// decideError maps an engine error to a gRPC status.
func (s *Service) decideError(err error, id v1alpha1.PolicyID) error {
	switch {
	case errors.Is(err, engine.ErrUnknownPolicy): // unloaded since the lookup
		return status.Errorf(codes.NotFound, "%v %q", engine.ErrUnknownPolicy, id)
	case errors.Is(err, engine.ErrNotReady):
		return status.Errorf(codes.Unavailable, "%v", err)
	case errors.Is(err, engine.ErrInvalidCost), errors.Is(err, engine.ErrPolicyRequired):
		return status.Errorf(codes.InvalidArgument, "%v", err)
	}
	s.log.Error("decision failed", "policy", id, "error", err)
	return status.Errorf(codes.Internal, "decision failed")
}

// statusMessages are the messages of one descriptor's status, allocated together.
type statusMessages struct {
	status   rlsv3.RateLimitResponse_DescriptorStatus
	limit    rlsv3.RateLimitResponse_RateLimit
	duration durationpb.Duration
}

// descriptorStatus describes one decision.
func descriptorStatus(res *engine.Result) *rlsv3.RateLimitResponse_DescriptorStatus {
	m := &statusMessages{}
	st := &m.status
	st.Code = rlsv3.RateLimitResponse_OK
	if !res.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if res.Tier.Limited() {
		st.CurrentLimit = fillCurrentLimit(&m.limit, res.Tier, res.Binding)
		st.LimitRemaining = uint32(min(max(res.Remaining, 0), math.MaxUint32))
		reset := max(res.ResetAfter, 0)
		m.duration.Seconds, m.duration.Nanos = int64(reset/time.Second), int32(reset%time.Second) // durationpb.New
		st.DurationUntilReset = &m.duration
	}
	return st
}

// fillCurrentLimit describes limit i of a tier with a limit as an Envoy rate limit, into rl,
// which it returns: its limit per the window the limit is expressed over, rounded up to whole
// seconds and written in the largest of DAY, HOUR, MINUTE and SECOND that divides it
// (unit_multiplier unset when 1), named as in header fields (the tier, or "<tier>/<limit>" for a
// limit of a stack). It is the quota and window of the limit's item of the RateLimit-Policy
// header field, except for a calendar quota: its limit per one calendar unit (calendarUnit).
// A concurrency limit's window is its lease timeout: Envoy's rate-limit API has no release, so
// over gRPC an admission holds its places until the lease times out, and the limit admits at
// most its limit per lease timeout, a rate, which is what current_limit says. (The unit is
// approximate only as a window's is: rounded up to whole seconds.)
func fillCurrentLimit(rl *rlsv3.RateLimitResponse_RateLimit, t *policy.Tier, i int) *rlsv3.RateLimitResponse_RateLimit {
	limit := t.Limit(i)
	rl.Name = t.HeaderName(i)
	rl.RequestsPerUnit = uint32(min(max(limit.Limit(), 0), math.MaxUint32))
	if q, ok := limit.(*limiter.Quota); ok {
		rl.Unit = calendarUnit(q)
		return rl
	}
	seconds := max(1, ratelimitheaders.Seconds(limit.Window()))
	var unit int64
	switch {
	case seconds%(24*60*60) == 0:
		rl.Unit, unit = rlsv3.RateLimitResponse_RateLimit_DAY, 24*60*60
	case seconds%(60*60) == 0:
		rl.Unit, unit = rlsv3.RateLimitResponse_RateLimit_HOUR, 60*60
	case seconds%60 == 0:
		rl.Unit, unit = rlsv3.RateLimitResponse_RateLimit_MINUTE, 60
	default:
		rl.Unit, unit = rlsv3.RateLimitResponse_RateLimit_SECOND, 1
	}
	if n := seconds / unit; n != 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(uint32(min(n, math.MaxUint32)))
	}
	return rl
}

// calendarUnit returns the Envoy unit of a quota's period: its limit is per one DAY, WEEK,
// MONTH or YEAR, a calendar one of the quota's zone, which is what these units name. They are
// not a number of seconds (a month or a day varies in length), so unit_multiplier stays unset;
// the window in seconds is the RateLimit-Policy header field's w (the longest the period
// lasts), and the time to the period's end is duration_until_reset.
func calendarUnit(q *limiter.Quota) rlsv3.RateLimitResponse_RateLimit_Unit {
	_, period, _ := q.Params()
	switch period {
	case limiter.PeriodWeek:
		return rlsv3.RateLimitResponse_RateLimit_WEEK
	case limiter.PeriodMonth:
		return rlsv3.RateLimitResponse_RateLimit_MONTH
	case limiter.PeriodYear:
		return rlsv3.RateLimitResponse_RateLimit_YEAR
	}
	return rlsv3.RateLimitResponse_RateLimit_DAY
}

// headerMessages are the header fields of an answer, allocated together.
type headerMessages struct {
	values [3]corev3.HeaderValue
	ptrs   [3]*corev3.HeaderValue
}

// HeaderValues returns the header fields describing res, as the HTTP API writes them:
// RateLimit-Policy and RateLimit for a tier with a limit, Retry-After for a rejection that a
// wait admits; nil when there are none.
func HeaderValues(res *engine.Result) []*corev3.HeaderValue {
	m := &headerMessages{}
	out := m.ptrs[:0]
	add := func(key, value string) {
		h := &m.values[len(out)]
		h.Key, h.Value = key, value
		out = append(out, h)
	}
	var buf [128]byte
	all := buf[:0]
	policyEnd, limitEnd := 0, 0
	if t := res.Tier; t.Limited() {
		all = t.AppendRateLimitPolicy(all)
		policyEnd = len(all)
		all = ratelimitheaders.AppendLimit(all, t.HeaderName(res.Binding), res.Remaining, res.ResetAfter)
		limitEnd = len(all)
	}
	retry := !res.Allowed && res.RetryAfter > 0 // none when no wait admits the cost
	if retry {
		all = ratelimitheaders.AppendRetryAfter(all, res.RetryAfter)
	}
	values := string(all) // one string holds every value
	if res.Tier.Limited() {
		add(ratelimitheaders.RateLimitPolicy, values[:policyEnd])
		add(ratelimitheaders.RateLimit, values[policyEnd:limitEnd])
	}
	if retry {
		add(ratelimitheaders.RetryAfter, values[limitEnd:])
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
