package envoyrls

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// concurrencyTier returns a tier of one concurrency limit.
func concurrencyTier(name string, limit int64, leaseTimeout time.Duration) v1alpha1.Tier {
	return v1alpha1.Tier{Name: name, Algorithm: v1alpha1.AlgorithmConcurrency,
		Concurrency: &v1alpha1.Concurrency{Limit: limit, LeaseTimeout: metav1.Duration{Duration: leaseTimeout}}}
}

// TestConcurrencyTierOverGRPC: Envoy's rate-limit API has no release, so an admission of a
// concurrency tier over gRPC holds its place until the lease's timeout. The answer says so as
// a rate: current_limit is limit per leaseTimeout, which is exactly what the tier enforces
// there. It admits up to the limit, answers OVER_LIMIT until the first lease times out, and
// admits again once it has.
func TestConcurrencyTierOverGRPC(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("edge", "llm", concurrencyTier("inflight", 2, time.Minute)))
	c := dial(t, e)
	req := request("edge/llm", entries("client", "alice"))
	wantLimit := &rlsv3.RateLimitResponse_RateLimit{
		Name: "inflight", RequestsPerUnit: 2, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	}
	decide := func(what string, code rlsv3.RateLimitResponse_Code, remaining uint32, reset time.Duration) {
		t.Helper()
		resp, err := c.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		want := &rlsv3.RateLimitResponse{
			OverallCode: code,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
				Code: code, CurrentLimit: wantLimit, LimitRemaining: remaining,
				DurationUntilReset: durationpb.New(reset),
			}},
		}
		got := proto.Clone(resp).(*rlsv3.RateLimitResponse)
		got.ResponseHeadersToAdd = nil
		if !proto.Equal(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", what, got, want)
		}
	}
	decide("first", ok, 1, time.Minute)
	clock.Advance(10 * time.Second)
	decide("second, 10 s later", ok, 0, time.Minute)
	decide("third", overLimit, 0, time.Minute)
	// Nothing releases the places: at 59.999 s the first is still held; at 60 s it is free.
	clock.Advance(50*time.Second - time.Millisecond)
	decide("before the first lease's timeout", overLimit, 0, 10*time.Second+time.Millisecond)
	clock.Advance(time.Millisecond)
	decide("at the first lease's timeout", ok, 0, time.Minute)
	decide("once its place is taken again", overLimit, 0, time.Minute)
	clock.Advance(10 * time.Second)
	decide("at the second lease's timeout", ok, 0, time.Minute)
}
