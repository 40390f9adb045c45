package envoyrls

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// MaxCallsInFlight bounds the calls a server built with ServerOptions holds at once, over all
// its connections: past it, a new call is refused with ResourceExhausted as soon as its
// headers arrive, before its message is read or decoded. A call holds at most its message
// (MaxRequestBytes, 64 KiB), the decoded request and its answer: a held call of the largest
// request decoded in full (MaxDescriptors descriptors) measured about 300 KiB of heap, server
// and client of a loopback test together (TestBurstOfMaximalCallsHoldsBoundedHeap, which
// asserts at most 512 KiB each), so the calls in flight hold at most about 75 MiB, 128 MiB
// with room, within the chart's memory limit (256 Mi). Before this bound, 100 calls of 1.7 MB
// requests on one connection held about 1.1 GiB.
// Envoy sends a call per request it rate-limits and waits a few milliseconds for each, so 256
// in flight serves tens of thousands of decisions per second per replica.
//
// Health's streaming Watch is not counted: it holds no more than its small request for as
// long as it lasts, and counting it would let watchers hold the slots of rate-limit calls.
const MaxCallsInFlight = 256

// errOverloaded is the status of a call refused past MaxCallsInFlight.
var errOverloaded = status.Errorf(codes.ResourceExhausted, "envoyrls: more than %d calls in flight", MaxCallsInFlight)

// inFlight counts a server's calls in flight and refuses those past max. Its InTapHandle
// reserves a slot for a call before grpc-go reads its message, and puts the slot in the
// call's context; its stats handler releases the slot when the call ends (stats.End, which
// grpc-go delivers after every stats.Begin). A call that never begins (its stream failed, or
// its method is unknown) releases its slot when its stream's context is done, which grpc-go
// does for every stream when it ends.
type inFlight struct {
	max   int64
	count atomic.Int64
}

// The states of a slot: reserved by the tap, begun (released at stats.End), released.
const (
	slotReserved int32 = iota
	slotBegun
	slotReleased
)

// slot is one call's place among the calls in flight.
type slot struct {
	state atomic.Int32
}

type slotKey struct{}

var _ stats.Handler = (*inFlight)(nil)

// tap reserves a slot for the call, or refuses it with errOverloaded when max are in flight.
func (f *inFlight) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName == healthpb.Health_Watch_FullMethodName {
		return ctx, nil
	}
	if f.count.Add(1) > f.max {
		f.count.Add(-1)
		return nil, errOverloaded
	}
	s := &slot{}
	// A call that never begins is released when its stream ends; one that began is released
	// at stats.End, whether or not its context is done first.
	context.AfterFunc(ctx, func() {
		if s.state.CompareAndSwap(slotReserved, slotReleased) {
			f.count.Add(-1)
		}
	})
	return context.WithValue(ctx, slotKey{}, s), nil
}

// HandleRPC marks the call's slot begun at stats.Begin and releases it at stats.End.
func (f *inFlight) HandleRPC(ctx context.Context, st stats.RPCStats) {
	s, ok := ctx.Value(slotKey{}).(*slot)
	if !ok {
		return
	}
	switch st.(type) {
	case *stats.Begin:
		s.state.CompareAndSwap(slotReserved, slotBegun)
	case *stats.End:
		if s.state.CompareAndSwap(slotBegun, slotReleased) {
			f.count.Add(-1)
		}
	}
}

// TagRPC returns ctx.
func (*inFlight) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// TagConn returns ctx.
func (*inFlight) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn does nothing.
func (*inFlight) HandleConn(context.Context, stats.ConnStats) {}
