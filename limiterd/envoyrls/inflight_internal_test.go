package envoyrls

import (
	"context"
	"runtime"
	"testing"
	"weak"

	"google.golang.org/grpc/tap"
)

// heavyValue stands for the headers a call's context holds.
type heavyValue [1 << 20]byte

type heavyKey struct{}

// endCallBeforeItsMethod reserves a slot of f for a call whose context holds a heavy value,
// and ends the call (its stream's context is cancelled) before any method takes the slot
// over; it returns a weak pointer to the value.
func endCallBeforeItsMethod(t *testing.T, f callLimits) weak.Pointer[heavyValue] {
	v := &heavyValue{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), heavyKey{}, v))
	if _, err := f.tap(ctx, &tap.Info{FullMethodName: "/envoy.service.ratelimit.v3.RateLimitService/NoSuchMethod"}); err != nil {
		t.Fatal(err)
	}
	cancel()
	return weak.Make(v)
}

// TestEndedCallsKeepNothingOfTheirContext: a slot whose call ended before its method keeps
// its place until the table runs out, but nothing of the call's context, which holds the
// call's headers. Before, it kept the context: 40 ended calls of 4 MiB headers each held
// 160 MiB until the table filled.
func TestEndedCallsKeepNothingOfTheirContext(t *testing.T) {
	limits := newCallLimits()
	w := endCallBeforeItsMethod(t, limits)
	runtime.GC()
	if w.Value() != nil {
		t.Error("the table of calls in flight keeps the context of a call that ended before its method")
	}
	// The slot is still reserved, and is reclaimed when the table runs out.
	for i := range MaxCallsInFlight {
		if _, err := limits.tap(context.Background(), &tap.Info{FullMethodName: "/x.Y/Z"}); err != nil {
			t.Fatalf("call %d of %d, with one ended call's slot to reclaim: %v", i+1, MaxCallsInFlight, err)
		}
	}
	if _, err := limits.tap(context.Background(), &tap.Info{FullMethodName: "/x.Y/Z"}); err == nil {
		t.Errorf("call %d accepted", MaxCallsInFlight+1)
	}
}
