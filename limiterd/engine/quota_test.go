package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// TestQuotaTier decides on a tier of 3 a day in Europe/Berlin through the memory store: it
// admits 3, then rejects with a retry at the next local midnight (not UTC's), admits 3 again
// from there, and counts the 23-hour day of the spring change (29 March 2026) to its end.
func TestQuotaTier(t *testing.T) {
	now := time.Date(2026, 3, 28, 22, 30, 0, 0, time.UTC) // 23:30 in Berlin (CET, UTC+1)
	e := engine.New(engine.Options{Clock: func() time.Time { return now }})
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Tiers[0] = testsupport.QuotaTier("free", 3, v1alpha1.CalendarPeriodDay, "Europe/Berlin")
	})))
	toMidnight := 30 * time.Minute // Berlin's midnight is 23:00 UTC
	for i := range 3 {
		r, err := e.Decide(ctx, "team/a", "k", 1)
		if err != nil || !r.Allowed || r.Remaining != int64(2-i) || r.Limit != 3 || r.ResetAfter != toMidnight {
			t.Fatalf("decision %d: %+v %v; want admitted, %d left, whole again at Berlin's midnight", i, r, err, 2-i)
		}
	}
	r, err := e.Decide(ctx, "team/a", "k", 1)
	if err != nil || r.Allowed || r.Outcome != engine.Rejected || r.Remaining != 0 || r.RetryAfter != toMidnight {
		t.Fatalf("the 4th: %+v %v; want rejected until Berlin's midnight, in %v", r, err, toMidnight)
	}
	if r, _ := e.Decide(ctx, "team/a", "k", 4); r.Allowed || r.RetryAfter != 0 {
		t.Fatalf("a cost above the limit: %+v; want rejected, no retry time", r)
	}
	if r, _ := e.Decide(ctx, "team/a", "other", 0); !r.Allowed || r.Remaining != 3 || r.ResetAfter != 0 {
		t.Fatalf("a peek of a fresh client: %+v", r)
	}

	// Berlin's midnight: the whole allowance is back, for a day of 23 hours (clocks spring
	// from 02:00 to 03:00), which ends at 22:00 UTC.
	now = now.Add(toMidnight)
	r, err = e.Decide(ctx, "team/a", "k", 3)
	if err != nil || !r.Allowed || r.Remaining != 0 || r.ResetAfter != 23*time.Hour {
		t.Fatalf("at Berlin's midnight: %+v %v; want 3 admitted, whole again in 23h", r, err)
	}
	now = time.Date(2026, 3, 29, 12, 0, 0, 0, time.UTC) // 14:00 CEST
	r, err = e.Decide(ctx, "team/a", "k", 1)
	if err != nil || r.Allowed || r.RetryAfter != 10*time.Hour {
		t.Fatalf("at noon UTC of the short day: %+v %v; want rejected for 10h, to midnight CEST", r, err)
	}

	// A raised limit gives the difference at once; the count is kept.
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Tiers[0] = testsupport.QuotaTier("free", 5, v1alpha1.CalendarPeriodDay, "Europe/Berlin")
	})))
	if got := allowedN(t, e, "team/a", "k", 3); got != 2 {
		t.Fatalf("after the limit was raised to 5: admitted %d of 3, want the 2 more", got)
	}
}

// TestStackedQuota decides on a stack of a burst bucket and a monthly quota of New York: the
// quota binds once spent, and a rejection waits for New York's 1st of the month.
func TestStackedQuota(t *testing.T) {
	now := time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC) // 18:00 in New York (EST, UTC-5)
	e := engine.New(engine.Options{Clock: func() time.Time { return now }})
	e.Swap(set(t, compile(t, "a", func(s *v1alpha1.RateLimitPolicySpec) {
		s.Tiers[0] = testsupport.StackedTier("free", testsupport.TokenBucketLimit("burst", 10, 1, time.Second),
			testsupport.QuotaLimit("monthly", 3, v1alpha1.CalendarPeriodMonth, "America/New_York"))
	})))
	r, err := e.Decide(ctx, "team/a", "k", 3)
	if err != nil || !r.Allowed || fmt.Sprint(remaining(r)) != "[7 0]" || r.Binding != 1 || r.ResetAfter != 6*time.Hour {
		t.Fatalf("3 units: %+v %v; want both charged, the quota binding, whole at New York's midnight", r, err)
	}
	r, err = e.Decide(ctx, "team/a", "k", 1)
	if err != nil || r.Allowed || fmt.Sprint(remaining(r)) != "[7 0]" || r.Binding != 1 || r.RetryAfter != 6*time.Hour {
		t.Fatalf("the 4th: %+v %v; want rejected by the quota until 1 February in New York, the bucket uncharged", r, err)
	}
	now = now.Add(6 * time.Hour)
	if got := allowedN(t, e, "team/a", "k", 4); got != 3 {
		t.Fatalf("in February: admitted %d of 4, want the new month's 3", got)
	}
}
