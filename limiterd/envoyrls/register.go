package envoyrls

import (
	"context"
	"errors"
	"slices"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Register registers rls on srv as rlsv3.RegisterRateLimitServiceServer does, except that a
// request the server's Codec refuses past MaxDescriptors or MaxDescriptorEntries fails with
// InvalidArgument, whose message names the bound. grpc-go answers any error of a codec with
// Internal, which reads as a fault of the server; registered the generated way, such a request
// fails with Internal. The bounds are the caller's to keep, whatever the server's state, so
// InvalidArgument (not ResourceExhausted, which is for a quota or resource that may free up).
func Register(srv grpc.ServiceRegistrar, rls rlsv3.RateLimitServiceServer) {
	desc := boundedDesc(&rlsv3.RateLimitService_ServiceDesc, "ShouldRateLimit", func(v any) (any, *error) {
		req, ok := v.(*rlsv3.RateLimitRequest)
		if !ok {
			return v, nil
		}
		b := &boundedRequest{RateLimitRequest: req}
		return b, &b.err
	})
	srv.RegisterService(&desc, rls)
}

// RegisterAuthorization registers authz on srv as authv3.RegisterAuthorizationServer does,
// except that a check the server's Codec refuses past MaxCheckHeaders fails with
// InvalidArgument, whose message names the bound, not Internal (see Register).
func RegisterAuthorization(srv grpc.ServiceRegistrar, authz authv3.AuthorizationServer) {
	desc := boundedDesc(&authv3.Authorization_ServiceDesc, "Check", func(v any) (any, *error) {
		req, ok := v.(*authv3.CheckRequest)
		if !ok {
			return v, nil
		}
		b := &boundedCheck{CheckRequest: req}
		return b, &b.err
	})
	srv.RegisterService(&desc, authz)
}

// boundedRequest is what Register's handler has the Codec decode a RateLimitRequest into: past
// a bound, the Codec decodes nothing, sets err and returns no error (grpc-go would answer that
// with Internal before the handler sees it), and the handler answers err with InvalidArgument.
// It is a proto.Message (the request's), so another codec decodes it as the request.
type boundedRequest struct {
	*rlsv3.RateLimitRequest
	err error
}

// boundedCheck is boundedRequest for an ext_authz CheckRequest.
type boundedCheck struct {
	*authv3.CheckRequest
	err error
}

// boundedDesc returns a copy of desc whose method decodes its request through wrap: wrap
// returns the message to decode into and where the Codec records a bound the request is past,
// which the call then fails with as InvalidArgument, before any interceptor or the service.
func boundedDesc(desc *grpc.ServiceDesc, method string, wrap func(v any) (any, *error)) grpc.ServiceDesc {
	d := *desc
	d.Methods = slices.Clone(desc.Methods)
	found := false
	for i, m := range d.Methods {
		if m.MethodName != method {
			continue
		}
		found = true
		handler := m.Handler
		d.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return handler(srv, ctx, func(v any) error {
				msg, refused := wrap(v)
				if err := dec(msg); err != nil {
					return err
				}
				if refused != nil && *refused != nil { // the Codec decoded nothing
					return status.Error(codes.InvalidArgument, (*refused).Error())
				}
				return nil
			}, ic)
		}
	}
	if !found {
		panic(errors.New("envoyrls: " + desc.ServiceName + " has no method " + method))
	}
	return d
}
