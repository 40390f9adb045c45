package envoyrls

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// MaxCallsInFlight bounds the calls a server built with ServerOptions holds at once, over all
// its connections: past it, a new call is refused with ResourceExhausted as soon as its
// headers arrive, before its message is read or decoded. A call holds at most its headers
// (MaxHeaderBytes, 16 KiB), its message (MaxRequestBytes, 64 KiB), the decoded request and its
// answer: a held call of the largest request decoded in full (MaxDescriptors descriptors)
// measured about 300 KiB of heap, server and client of a loopback test together
// (TestBurstOfMaximalCallsHoldsBoundedHeap, which asserts at most 512 KiB each), so the calls
// in flight hold at most about 75 MiB, 128 MiB with room, within the chart's memory limit
// (256 Mi). Before this bound, 100 calls of 1.7 MB requests on one connection held about
// 1.1 GiB.
// Envoy sends a call per request it rate-limits and waits a few milliseconds for each, so 256
// in flight serves tens of thousands of decisions per second per replica.
//
// Health's streaming Watch is counted apart (MaxWatches): a watch lasts as long as its client
// wants, and counting watches with the rate-limit calls would let watchers hold their places.
const MaxCallsInFlight = 256

// MaxWatches bounds the health Watch streams a server built with ServerOptions holds at once;
// past it, a new one is refused with ResourceExhausted. Each holds at most its headers and its
// request (a service name), and probes and load balancers watch a few at a time.
const MaxWatches = 64

// MaxHeaderBytes bounds the headers (metadata) of a call, as grpc-go counts them: Envoy's
// rate-limit calls carry a few hundred bytes. grpc-go's default, 16 MiB, let each call in
// flight hold that much.
const MaxHeaderBytes = 16 << 10

// errOverloaded is the status of a call refused past MaxCallsInFlight or MaxWatches.
var errOverloaded = status.Errorf(codes.ResourceExhausted, "envoyrls: more than %d calls (or %d health watches) in flight", MaxCallsInFlight, MaxWatches)

// callLimits are a server's tables of calls in flight: the unary calls', and the health
// watches'. Its tap reserves a slot of the call's table before grpc-go reads the call's
// message, and gives the call a context that names the slot; the server's interceptors take
// the slot over when the call reaches its method.
type callLimits struct {
	calls, watches *inFlight
}

func newCallLimits() callLimits {
	return callLimits{calls: newInFlight(MaxCallsInFlight), watches: newInFlight(MaxWatches)}
}

// tap reserves a slot for the call in its table, or refuses it with errOverloaded when every
// slot is taken by a call that is not over.
func (l callLimits) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	f := l.calls
	if info.FullMethodName == healthpb.Health_Watch_FullMethodName {
		f = l.watches
	}
	return f.reserve(ctx)
}

// inFlight counts calls in flight in a table of max slots, and refuses a call when every slot
// is taken. A call's slot is reserved when its headers arrive (callLimits.tap), taken over
// when the call reaches its method (interceptUnary, interceptStream) and freed when the method
// returns, whether or not the call's context is done first: a client cancelling its call frees
// no slot while the service still holds the request.
//
// A call that never reaches a method (its message was refused or never arrived, its method is
// unknown, its stream was reset) leaves its slot reserved; grpc-go cancels every stream's
// context as the stream ends, so such a slot is one whose context's Done channel is closed,
// and reserve reclaims those when it finds no free slot. A slot keeps that channel only, never
// the context, which holds the call's headers. A call that reaches its method after its slot
// was reclaimed is refused there (errCallEnded) without being served. So at most max calls are
// past the tap at once and not yet over, where over means that their stream ended and they
// will never be served.
//
// A call costs one small allocation, three short lock operations and no goroutine: the whole
// count costs a call 4 allocations (164 a decision over loopback against 160 without it). The
// stats handler it replaces (grpc-go feeds one seven events a call, and it released slots
// through context.AfterFunc, a goroutine a call) cost 26, and the service served 0.81 of the
// empty server's decisions per second instead of 0.92 (make bench-grpc).
type inFlight struct {
	mu    sync.Mutex
	slots []slot  // by index
	free  []int32 // the indexes of the free slots
}

// slot is one call's place among the calls in flight.
type slot struct {
	done  <-chan struct{} // the call's context's, while reserved: closed once its stream ended
	gen   uint64          // counts the calls that have had the slot, so a call knows it is still its own
	state slotState
}

type slotState uint8

const (
	slotFree     slotState = iota
	slotReserved           // by the tap, for a call not yet in its method
	slotHeld               // by a call in its method
)

func newInFlight(max int) *inFlight {
	f := &inFlight{slots: make([]slot, max), free: make([]int32, max)}
	for i := range f.free {
		f.free[i] = int32(max - 1 - i)
	}
	return f
}

// callContext is a call's context, naming the slot it reserved.
type callContext struct {
	context.Context
	calls *inFlight
	index int32
	gen   uint64
}

type callContextKey struct{}

// Value returns c for callContextKey, and the call's other values from the context it wraps.
func (c *callContext) Value(key any) any {
	if key == (callContextKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// errCallEnded is the status of a call whose stream ended before its service method began.
var errCallEnded = status.Errorf(codes.Canceled, "envoyrls: the call ended before it was served")

// reserve reserves a slot for the call of ctx, or refuses it with errOverloaded when every
// slot is taken by a call that is not over.
func (f *inFlight) reserve(ctx context.Context) (context.Context, error) {
	f.mu.Lock()
	if len(f.free) == 0 {
		f.reclaimLocked()
		if len(f.free) == 0 {
			f.mu.Unlock()
			return nil, errOverloaded
		}
	}
	i := f.free[len(f.free)-1]
	f.free = f.free[:len(f.free)-1]
	s := &f.slots[i]
	s.gen++
	s.done, s.state = ctx.Done(), slotReserved
	gen := s.gen
	f.mu.Unlock()
	return &callContext{Context: ctx, calls: f, index: i, gen: gen}, nil
}

// reclaimLocked frees the reserved slots of calls whose stream has ended.
func (f *inFlight) reclaimLocked() {
	for i := range f.slots {
		if s := &f.slots[i]; s.state == slotReserved && closed(s.done) {
			f.freeLocked(int32(i))
		}
	}
}

func closed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

func (f *inFlight) freeLocked(i int32) {
	s := &f.slots[i]
	s.done, s.state = nil, slotFree
	f.free = append(f.free, i)
}

// takeOver holds the call's slot until release, and reports whether it could: false when the
// slot was reclaimed (the call's stream ended while its message was read or decoded).
func (c *callContext) takeOver() bool {
	f := c.calls
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &f.slots[c.index]
	if s.gen != c.gen || s.state != slotReserved {
		return false
	}
	s.done, s.state = nil, slotHeld
	return true
}

func (c *callContext) release() {
	c.calls.mu.Lock()
	c.calls.freeLocked(c.index)
	c.calls.mu.Unlock()
}

// interceptUnary serves a unary call holding its slot until the method returns. A call whose
// slot was reclaimed is not served.
func interceptUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c, ok := ctx.Value(callContextKey{}).(*callContext)
	if !ok {
		return handler(ctx, req)
	}
	if !c.takeOver() {
		return nil, errCallEnded
	}
	defer c.release()
	return handler(ctx, req)
}

// interceptStream serves a streaming call (a health Watch) holding its slot until the method
// returns. A call whose slot was reclaimed is not served.
func interceptStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c, ok := ss.Context().Value(callContextKey{}).(*callContext)
	if !ok {
		return handler(srv, ss)
	}
	if !c.takeOver() {
		return errCallEnded
	}
	defer c.release()
	return handler(srv, ss)
}
