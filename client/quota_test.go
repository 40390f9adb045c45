package client_test

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/limiterd/limiterd/client"
)

// quotaPolicy is default/plans whose tier "pro" stacks a burst bucket of 10 refilled by 10 a
// second and a yearly quota of 2 in Tokyo.
const quotaPolicy = `
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: plans
spec:
  defaultTier: pro
  tiers:
    - name: pro
      limits:
        - name: burst
          algorithm: TokenBucket
          tokenBucket: {capacity: 10, refillRate: 10}
        - name: yearly
          algorithm: Quota
          quota: {limit: 2, period: Year, timeZone: Asia/Tokyo}
`

// TestQuotaDecisions checks that the client decodes a calendar quota's answers from limiterd:
// the client has nothing algorithm-specific, but a quota's durations are long (here most of a
// year, to the zone's next 1 January) and its limit is binding in a stack although another
// limit admits, so the top-level fields, the limits and the header fields must agree.
func TestQuotaDecisions(t *testing.T) {
	c, err := client.New(startLimiterd(t, quotaPolicy).URL, client.WithPolicy("default/plans"))
	if err != nil {
		t.Fatal(err)
	}
	// The engine's clock is 2030-01-02 03:04:05 UTC; 2031 starts in Tokyo at 15:00 UTC on 31
	// December 2030.
	toYear := time.Date(2030, 12, 31, 15, 0, 0, 0, time.UTC).Sub(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	secs := strconv.FormatInt(int64(toYear/time.Second), 10)
	policy := `"pro/burst";q=10;w=1, "pro/yearly";q=2;w=31622400`
	for i, want := range []client.Decision{
		{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: toYear, RateLimitPolicy: policy, RateLimit: `"pro/yearly";r=1;t=` + secs,
			Limits: []client.Limit{{"burst", true, 10, 9, 100 * time.Millisecond}, {"yearly", true, 2, 1, toYear}}},
		{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: toYear, RateLimitPolicy: policy, RateLimit: `"pro/yearly";r=0;t=` + secs,
			Limits: []client.Limit{{"burst", true, 10, 8, 200 * time.Millisecond}, {"yearly", true, 2, 0, toYear}}},
		// The quota rejects until 2031 in Tokyo; the burst, which would admit, is not charged.
		{Allowed: false, Limit: 2, Remaining: 0, ResetAfter: toYear, RetryAfter: toYear, RateLimitPolicy: policy, RateLimit: `"pro/yearly";r=0;t=` + secs,
			Limits: []client.Limit{{"burst", true, 10, 8, 200 * time.Millisecond}, {"yearly", false, 2, 0, toYear}}},
	} {
		got, err := c.Allow(t.Context(), "alice")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got.Reservation = ""
		if !reflect.DeepEqual(got, want) {
			t.Errorf("request %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
}
