package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// TestAllowAtTheBounds drives the decisions API at the largest costs it accepts (MaxCost) and
// just past them, on tiers at the corners of the CRD's bounds: a bucket of the largest capacity
// refilled at the largest rate over the longest period, the same over the shortest period, one
// whose full refill takes almost a year, the largest sliding window and the largest quota. A
// limit's worth is admitted once, nothing past it, a batch of MaxCost items (their costs
// summing far past the limit) admits no more than the limit, a refund of MaxCost gives back no
// more than was charged, and costs past MaxCost or negative are 400 (issue 34).
func TestAllowAtTheBounds(t *testing.T) {
	maxCost := strconv.Itoa(MaxCost)
	slowest := int64(v1alpha1.MaxCapacity/366 + 1) // a full refill of just under 366 days
	for name, tier := range map[string]v1alpha1.Tier{
		"bucket, max period":     testsupport.TokenBucketTier("t", v1alpha1.MaxCapacity, v1alpha1.MaxCapacity, v1alpha1.MaxPeriod),
		"bucket, min period":     testsupport.TokenBucketTier("t", v1alpha1.MaxCapacity, v1alpha1.MaxCapacity, v1alpha1.MinPeriod),
		"bucket, slowest refill": testsupport.TokenBucketTier("t", v1alpha1.MaxCapacity, slowest, v1alpha1.MaxPeriod),
		"window":                 testsupport.SlidingWindowTier("t", v1alpha1.MaxWindowLimit, v1alpha1.MaxPeriod),
		"quota":                  testsupport.QuotaTier("t", v1alpha1.MaxQuotaLimit, v1alpha1.CalendarPeriodYear, "Pacific/Kiritimati"),
	} {
		t.Run(name, func(t *testing.T) {
			refunds := tier.Algorithm == v1alpha1.AlgorithmTokenBucket // the only one with refunds
			p := newPolicy("api", tier)
			if refunds {
				p = withRefunds(p)
			}
			h := NewDecisions(newEngine(t, testsupport.NewClock(), p), nil)
			limit := remaining(t, h, "default/api", "fresh")
			allow := func(key, cost string) answer {
				return serve(t, h, http.MethodPost, "/v1/allow", `{"key":"`+key+`","cost":`+cost+`}`)
			}
			for _, cost := range []string{"1000000001", "9223372036854775807", "9223372036854775808", "18446744073709551616", "-1", "-9223372036854775808", "1e9", "1000000000.0"} {
				if a := allow("fresh", cost); a.status != 400 {
					t.Errorf("cost %s: %d %s, want 400", cost, a.status, a.body)
				}
			}
			// A limit's worth, once.
			a := allow("k", limit)
			rsv := reservationOf(t, a.body)
			if a.status != 200 || !strings.Contains(a.body, `"remaining":0,`) || (rsv == "") == refunds {
				t.Fatalf("cost %s (the limit): %d %s, want admitted (with a reservation: %t)", limit, a.status, a.body, refunds)
			}
			for _, cost := range []string{"1", limit, maxCost} {
				if a := allow("k", cost); a.status != 429 {
					t.Fatalf("cost %s after the limit's worth: %d %s, want 429", cost, a.status, a.body)
				}
			}
			// A refund of MaxCost: past the reservation's cost (400) unless that is MaxCost;
			// then of the whole reservation. Either gives back the limit's worth, no more.
			refund := func(body string) answer {
				return serve(t, h, http.MethodPost, "/v1/refund", body)
			}
			switch {
			case !refunds:
				// Nothing to refund: a fresh key takes the limit's worth below.
			case limit == maxCost:
				if a := refund(`{"reservation":"` + rsv + `","cost":` + maxCost + `}`); a.status != 200 {
					t.Fatalf("refund of %s: %d %s, want 200", maxCost, a.status, a.body)
				}
			default:
				if a := refund(`{"reservation":"` + rsv + `","cost":` + maxCost + `}`); a.status != 400 {
					t.Fatalf("refund of %s past a reservation of %s: %d %s, want 400", maxCost, limit, a.status, a.body)
				}
				if a := refund(`{"reservation":"` + rsv + `"}`); a.status != 200 {
					t.Fatalf("refund of the reservation: %d %s, want 200", a.status, a.body)
				}
			}
			if got := remaining(t, h, "default/api", "k"); refunds && got != limit {
				t.Fatalf("after the refund: remaining %s, want %s", got, limit)
			}
			// A batch of MaxCost items on one key: as many admitted as the limit holds.
			items := make([]string, 40)
			for i := range items {
				items[i] = `{"policy":"default/api","key":"b","cost":` + maxCost + `}`
			}
			results := batchAnswer(t, serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[`+strings.Join(items, ",")+`]}`))
			var admitted int64
			for i, raw := range results {
				var r struct {
					Allowed bool `json:"allowed"`
				}
				if err := json.Unmarshal(raw, &r); err != nil {
					t.Fatalf("item %d: %s: %v", i, raw, err)
				}
				if r.Allowed {
					admitted += MaxCost
				}
			}
			if limit == maxCost && admitted != MaxCost {
				t.Fatalf("a batch of %d items of %s on a fresh key admitted %d units, want the first item's", len(items), maxCost, admitted)
			}
			if l, _ := strconv.ParseInt(limit, 10, 64); admitted > l {
				t.Fatalf("a batch of %d items of %s admitted %d units, limit %s", len(items), maxCost, admitted, limit)
			}
		})
	}
}
