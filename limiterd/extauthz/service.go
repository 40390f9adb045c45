// Package extauthz serves limiterd's decisions as Envoy's external authorization service:
// envoy.service.auth.v3.Authorization/Check over gRPC, which Envoy's ext_authz HTTP filter
// calls before it proxies a request (and Istio's CUSTOM authorization provider and Envoy
// Gateway's SecurityPolicy extAuth configure). It answers the same "may this request pass?" as
// the decisions API's forward-auth path (package server), with the same key sources.
//
// # Which policy
//
// A check names its policy in the context extensions that Envoy sends with it
// (CheckRequest attributes.context_extensions), which the filter's per-route configuration
// sets (ExtAuthzPerRoute check_settings.context_extensions):
//
//	namespace: <the policy's namespace>
//	policy:    <the policy's name>
//
// Both are required: a check without either is denied (never admitted), as is one naming no
// loaded policy.
//
// # The client key
//
// The policy's spec.gateway derives the client key, with the same code as forward-auth
// (policy.KeyExtractor), from what Envoy reports of the request (policy.CheckedRequest):
//
//   - Header: attributes.request.http.headers, by the header's name in lower case. Envoy
//     joins a field given several times into one value with commas, so a repeated field is
//     one value here, not an error.
//   - ClientAddress: the entry trustedHops from the right of the x-forwarded-for header,
//     or, with trustedHops 0 or no x-forwarded-for, the request's source address
//     (attributes.source.address.socket_address.address): Envoy's peer. Under Envoy's
//     use_remote_address: true, Envoy appends its peer to x-forwarded-for, so trustedHops 1
//     is the peer Envoy sees, and entries a client sent are further left and never read.
//   - Host, Method, Path: the request's own :authority (in lower case), :method and :path
//     (without the query), never X-Forwarded-Host, X-Forwarded-Method or X-Forwarded-Uri,
//     which a client would set as it likes.
//
// Envoy sends the headers either as a map (by default; a field given several times arrives
// joined with commas, and bytes that are not UTF-8 replaced with '!'), or, under the filter's
// encode_raw_headers: true (which Envoy recommends), as header_map, one entry per field with
// its bytes as sent. limiterd reads header_map when headers is empty, joining the values of a
// name given several times with commas as Envoy does for the map, so that both encodings give
// the same keys (except for bytes that are not UTF-8, which header_map keeps).
//
// # Answers
//
// Every answer is a CheckResponse, with a DeniedHttpResponse (the status, header fields and
// JSON body Envoy returns to the client) whenever the status is not OK, and never a failed
// call for anything a client or the policy can cause: Envoy would let failure_mode_allow decide
// a failed call, and with failure_mode_allow: true admit it unlimited. So a rejection, a store
// failure under spec.failureMode Closed, bad input and a policy that cannot be used are all
// denials, as forward-auth answers them:
//
//   - admitted: status OK, OkHttpResponse with RateLimit-Policy and RateLimit (for a tier with
//     a limit) as response_headers_to_add, which Envoy adds to the client's answer;
//   - rejected: RESOURCE_EXHAUSTED, HTTP 429 with RateLimit-Policy, RateLimit, Retry-After
//     (unless no wait admits the cost) and the decision's JSON body (as /v1/allow answers);
//   - no key and missingKey Reject: PERMISSION_DENIED, 429 without Retry-After; missingKey
//     Allow: OK with no header fields, nothing charged; Shared: decided for "anonymous".
//
// Each check is one decision of cost 1. Errors answer {"error": "..."}, and charge nothing:
//
//   - INVALID_ARGUMENT, 404: no namespace or policy context extension;
//   - NOT_FOUND, 404: no such policy loaded;
//   - FAILED_PRECONDITION, 409: the policy has no spec.gateway;
//   - INVALID_ARGUMENT, 431: a header (or the host or path) a key source reads is longer than
//     v1alpha1.MaxGatewayHeaderBytes (4096 bytes);
//   - INVALID_ARGUMENT, 431: more than envoyrls.MaxCheckHeaders header fields in header_map
//     (only through another server than limiterd's, whose codec refuses them before);
//   - UNAVAILABLE, 503: no policy loaded yet;
//   - INTERNAL, 500: an unexpected failure (logged).
//
// A check fails as a call (and Envoy's failure_mode_allow decides) only for what the gRPC
// server refuses before it reaches this service: a message over 64 KiB
// (envoyrls.MaxRequestBytes, which bounds every call of limiterd's gRPC server; do not send
// the request body, with_request_body), more than envoyrls.MaxCheckHeaders (512) header fields
// (Envoy itself refuses a request of more than 100 unless its max_request_headers_count is
// raised), more calls in flight than envoyrls.MaxCallsInFlight, and a message that is not
// valid protobuf (grpc-go refuses a string of the headers map that is not UTF-8, which Envoy
// never sends). So a check costs the server a bounded amount: a decoded check of 512
// headers in 64 KiB held 93 KiB of heap (TestLargestCheckHoldsBoundedHeap), where 7,426
// one-byte headers in the same bytes held 709 KiB before the header bound. A client can make a
// check fail so (a request near Envoy's header size limit makes a check over 64 KiB), so set
// failure_mode_allow: false (Envoy's default) wherever the limit protects something.
package extauthz

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/envoyrls"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/server"
)

// The context extensions that name a check's policy.
const (
	ExtensionNamespace = "namespace"
	ExtensionPolicy    = "policy"
)

// Messages of denied checks.
const (
	errNoPolicy   = "ext_authz: the route's context_extensions must name the policy: namespace and policy"
	errRawTooMany = "ext_authz: too many header fields in header_map"
)

// Service implements authv3.AuthorizationServer for an engine. Register it with
// authv3.RegisterAuthorizationServer, on a server built with envoyrls.ServerOptions (its
// message and call bounds). It is safe for concurrent use.
type Service struct {
	authv3.UnimplementedAuthorizationServer
	engine *engine.Engine
	log    *slog.Logger
}

// New returns the authorization service of e. log receives unexpected failures only (nil:
// slog.Default); a decision logs nothing.
func New(e *engine.Engine, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{engine: e, log: log}
}

// Check decides a request Envoy asks about (see the package documentation).
func (s *Service) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	attrs := req.GetAttributes()
	ext := attrs.GetContextExtensions()
	ns, name := ext[ExtensionNamespace], ext[ExtensionPolicy]
	if ns == "" || name == "" {
		return denyError(codes.InvalidArgument, http.StatusNotFound, errNoPolicy), nil
	}
	id := v1alpha1.PolicyID(ns + "/" + name)

	h := attrs.GetRequest().GetHttp()
	headers := h.GetHeaders()
	if raw := h.GetHeaderMap().GetHeaders(); len(headers) == 0 && len(raw) > 0 {
		if len(raw) > envoyrls.MaxCheckHeaders {
			return denyError(codes.InvalidArgument, http.StatusRequestHeaderFieldsTooLarge, errRawTooMany), nil
		}
		headers = joinRaw(raw)
	}
	fr := policy.ForwardedRequest{Checked: &policy.CheckedRequest{
		Headers: headers, Host: h.GetHost(), Method: h.GetMethod(), Path: h.GetPath(),
	}}
	if a, err := netip.ParseAddr(attrs.GetSource().GetAddress().GetSocketAddress().GetAddress()); err == nil {
		fr.Peer = a
	}
	var buf [256]byte
	var res engine.Result
	decided, err := s.engine.DecideForwarded(ctx, id, &fr, buf[:0], &res)
	switch {
	case err != nil:
		return s.refusal(err, id), nil
	case !decided: // missingKey Allow
		return &authv3.CheckResponse{
			Status:       &rpcstatus.Status{Code: int32(codes.OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
		}, nil
	}
	return answer(&res), nil
}

// joinRaw returns the header fields of header_map as Envoy's headers map has them: by name,
// the values of a name given several times joined with commas, in order. A field's value is
// its raw_value (value when that is empty).
func joinRaw(raw []*corev3.HeaderValue) map[string]string {
	values := make(map[string][]string, len(raw))
	for _, f := range raw {
		v := string(f.GetRawValue())
		if v == "" {
			v = f.GetValue()
		}
		values[f.GetKey()] = append(values[f.GetKey()], v)
	}
	out := make(map[string]string, len(values))
	for k, vs := range values {
		out[k] = strings.Join(vs, ",")
	}
	return out
}

// answer describes a decision.
func answer(res *engine.Result) *authv3.CheckResponse {
	fields := envoyrls.HeaderValues(res)
	if res.Allowed {
		return &authv3.CheckResponse{
			Status:       &rpcstatus.Status{Code: int32(codes.OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{ResponseHeadersToAdd: options(fields)}},
		}
	}
	body := append(server.AppendDecision(nil, res), '\n')
	return deny(codes.ResourceExhausted, http.StatusTooManyRequests, "rate limited", options(fields), string(body))
}

// options wraps header fields as Envoy adds them: appended to those of the same name.
func options(fields []*corev3.HeaderValue) []*corev3.HeaderValueOption {
	if len(fields) == 0 {
		return nil
	}
	out := make([]*corev3.HeaderValueOption, len(fields), len(fields)+1)
	opts := make([]corev3.HeaderValueOption, len(fields))
	for i, f := range fields {
		opts[i].Header = f
		out[i] = &opts[i]
	}
	return out
}

// jsonContentType is the Content-Type of a denial's body.
var jsonContentType = &corev3.HeaderValueOption{
	Header:       &corev3.HeaderValue{Key: "content-type", Value: "application/json"},
	AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
}

// deny answers a denial with the gRPC code (not OK), and the HTTP status, header fields and
// body Envoy sends the client.
func deny(code codes.Code, status int, msg string, fields []*corev3.HeaderValueOption, body string) *authv3.CheckResponse {
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code), Message: msg},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: append(fields, jsonContentType),
			Body:    body,
		}},
	}
}

// denyError answers a check that is not decided: {"error": msg} with status.
func denyError(code codes.Code, status int, msg string) *authv3.CheckResponse {
	body, err := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	if err != nil { // unreachable: a string always marshals
		body = []byte(`{"error":"internal error"}`)
	}
	return deny(code, status, msg, nil, string(body)+"\n")
}

// refusal answers a check that engine.DecideForwarded could not decide.
func (s *Service) refusal(err error, id v1alpha1.PolicyID) *authv3.CheckResponse {
	var he *policy.HeaderError
	switch {
	case errors.Is(err, engine.ErrNoKey):
		return denyError(codes.PermissionDenied, http.StatusTooManyRequests, err.Error())
	case errors.Is(err, engine.ErrNoGateway):
		return denyError(codes.FailedPrecondition, http.StatusConflict, err.Error())
	case errors.Is(err, policy.ErrHeaderTooLarge):
		return denyError(codes.InvalidArgument, http.StatusRequestHeaderFieldsTooLarge, err.Error())
	case errors.As(err, &he):
		return denyError(codes.InvalidArgument, http.StatusBadRequest, err.Error())
	case errors.Is(err, engine.ErrUnknownPolicy):
		return denyError(codes.NotFound, http.StatusNotFound, err.Error())
	case errors.Is(err, engine.ErrNotReady):
		return denyError(codes.Unavailable, http.StatusServiceUnavailable, err.Error())
	}
	s.log.Error("decision failed", "policy", id, "error", err)
	return denyError(codes.Internal, http.StatusInternalServerError, "decision failed")
}
