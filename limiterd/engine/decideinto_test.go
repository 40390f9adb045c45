package engine_test

import (
	"fmt"
	"net/http"
	"reflect"
	"testing"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// sameResult fails unless got is want, a reservation standing for a reservation: each engine
// signs its own (its epoch is its own).
func sameResult(t *testing.T, what string, got, want engine.Result) {
	t.Helper()
	if (got.Reservation == "") != (want.Reservation == "") {
		t.Fatalf("%s: reservation %q, want one: %v", what, got.Reservation, want.Reservation != "")
	}
	got.Reservation, want.Reservation = "", ""
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got  %+v\n want %+v", what, got, want)
	}
}

// dirty returns a Result with every field set, as a reused one holds an earlier answer.
func dirty() engine.Result {
	return engine.Result{
		Decision: limiter.Decision{Allowed: true, Limit: 9, Remaining: 9, ResetAfter: 9, RetryAfter: 9, Lease: 9},
		Limits:   make([]limiter.Decision, 3), Binding: 2, Outcome: engine.DryRunRejected,
		Policy: &policy.Policy{}, Tier: &policy.Tier{}, StoreError: errDown, Reservation: "stale", Refunded: []int64{9},
	}
}

// TestDecideIntoOverwritesResult decides the same requests on two engines built alike, one
// with DecideInto into one Result reused from a dirty start, the other with Decide, and
// requires the same answers: DecideInto overwrites all of *r, and on an error leaves the zero
// Result. DecideForwarded writes its Result alike, and the zero Result when nothing is decided.
func TestDecideIntoOverwritesResult(t *testing.T) {
	byKey := func(s *v1alpha1.RateLimitPolicySpec) {
		withStack(s)
		s.Refunds = v1alpha1.RefundsEnabled
		s.Gateway = &v1alpha1.Gateway{MissingKey: v1alpha1.MissingKeyAllow,
			KeySources: []v1alpha1.KeySource{{Type: v1alpha1.KeySourceHeader, Header: "X-Api-Key"}}}
	}
	into, serial := engine.New(engine.Options{Clock: fixedClock()}), engine.New(engine.Options{Clock: fixedClock()})
	into.Swap(set(t, compile(t, "a", byKey)))
	serial.Swap(set(t, compile(t, "a", byKey)))
	r := dirty()
	for i, it := range []engine.BatchItem{
		{Policy: "team/a", Key: "k", Cost: 2},     // stacked, admitted, a reservation
		{Policy: "team/a", Key: "boss", Cost: 1},  // unlimited: no limits, no reservation
		{Policy: "team/a", Key: "k", Cost: 5},     // rejected
		{Policy: "team/a", Key: "k", Cost: -1},    // ErrInvalidCost
		{Policy: "team/x", Key: "k", Cost: 1},     // ErrUnknownPolicy
		{Policy: "team/a", Key: "try-1", Cost: 1}, // a dry-run stack
		{Policy: "team/a", Key: "k", Cost: 0},     // a peek
	} {
		err := into.DecideInto(ctx, it.Policy, it.Key, it.Cost, &r)
		want, werr := serial.Decide(ctx, it.Policy, it.Key, it.Cost)
		what := fmt.Sprintf("item %d %+v", i, it)
		if fmt.Sprint(err) != fmt.Sprint(werr) {
			t.Fatalf("%s: error %v, want %v", what, err, werr)
		}
		sameResult(t, what, r, want)
	}

	forward := func(e *engine.Engine, key string, res *engine.Result) bool {
		t.Helper()
		fr := policy.ForwardedRequest{Header: http.Header{}, Method: http.MethodGet}
		if key != "" {
			fr.Header.Set("X-Api-Key", key)
		}
		decided, err := e.DecideForwarded(ctx, "team/a", &fr, nil, res)
		if err != nil {
			t.Fatal(err)
		}
		return decided
	}
	r = dirty()
	var want engine.Result
	if !forward(into, "k", &r) || !forward(serial, "k", &want) {
		t.Fatal("forwarded with a key: not decided")
	}
	sameResult(t, "forwarded", r, want)
	r = dirty()
	if forward(into, "", &r) {
		t.Fatal("forwarded without a key under missingKey Allow: decided")
	}
	sameResult(t, "forwarded undecided", r, engine.Result{})
}
