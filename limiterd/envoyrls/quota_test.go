package envoyrls

import (
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// mustZone loads an IANA zone or fails the test.
func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestQuotaStatusOverGRPC decides a quota of 2 per period over gRPC from an instant inside a
// period until the next one starts: current_limit is the limit per one calendar unit,
// duration_until_reset and Retry-After count to the period's end in the quota's zone, exact to
// the nanosecond, whatever the period's length (a 23- or 25-hour day, a month of 28 days), and
// the first request of the next period is admitted, its reset the whole next period.
func TestQuotaStatusOverGRPC(t *testing.T) {
	const (
		day   = rlsv3.RateLimitResponse_RateLimit_DAY
		week  = rlsv3.RateLimitResponse_RateLimit_WEEK
		month = rlsv3.RateLimitResponse_RateLimit_MONTH
		year  = rlsv3.RateLimitResponse_RateLimit_YEAR
	)
	ny, tokyo, auckland := mustZone(t, "America/New_York"), mustZone(t, "Asia/Tokyo"), mustZone(t, "Pacific/Auckland")
	for _, c := range []struct {
		name   string
		period v1alpha1.CalendarPeriod
		zone   string
		now    time.Time // the first request
		end    time.Time // the end of its period
		next   time.Duration
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		// 2026-03-08 in New York lasts 23 hours (clocks go from 02:00 to 03:00), 2026-11-01 25.
		{"spring day", v1alpha1.CalendarPeriodDay, "America/New_York", time.Date(2026, 3, 8, 0, 30, 0, 0, ny),
			time.Date(2026, 3, 9, 0, 0, 0, 0, ny), 24 * time.Hour, day},
		{"23-hour day", v1alpha1.CalendarPeriodDay, "America/New_York", time.Date(2026, 3, 7, 12, 0, 0, 0, ny),
			time.Date(2026, 3, 8, 0, 0, 0, 0, ny), 23 * time.Hour, day},
		{"25-hour day", v1alpha1.CalendarPeriodDay, "America/New_York", time.Date(2026, 10, 31, 23, 59, 59, 500, ny),
			time.Date(2026, 11, 1, 0, 0, 0, 0, ny), 25 * time.Hour, day},
		// 2026-12-28 is a Monday; a week from Wednesday ends then.
		{"ISO week", v1alpha1.CalendarPeriodWeek, "", time.Date(2026, 12, 23, 8, 0, 0, 0, time.UTC),
			time.Date(2026, 12, 28, 0, 0, 0, 0, time.UTC), 7 * 24 * time.Hour, week},
		// January in Tokyo ends at 15:00 UTC on the 31st; February 2027 has 28 days.
		{"month", v1alpha1.CalendarPeriodMonth, "Asia/Tokyo", time.Date(2027, 1, 31, 14, 0, 0, 0, time.UTC),
			time.Date(2027, 2, 1, 0, 0, 0, 0, tokyo), 28 * 24 * time.Hour, month},
		// 2027 starts in Auckland (UTC+13 in summer) at 11:00 UTC on 31 December 2026; 2027 has
		// 365 days, and Auckland is on daylight time at both of its ends.
		{"year", v1alpha1.CalendarPeriodYear, "Pacific/Auckland", time.Date(2026, 12, 31, 10, 0, 0, 0, time.UTC),
			time.Date(2027, 1, 1, 0, 0, 0, 0, auckland), 365 * 24 * time.Hour, year},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := testsupport.NewClock()
			clock.Advance(c.now.Sub(clock.Now()))
			cl := dial(t, newEngine(t, clock, newPolicy("default", "api", testsupport.QuotaTier("plan", 2, c.period, c.zone))))
			decide := func() *rlsv3.RateLimitResponse {
				t.Helper()
				resp, err := cl.ShouldRateLimit(t.Context(), request("api", entries("k", "alice")))
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			check := func(i int, resp *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, remaining uint32, reset time.Duration) {
				t.Helper()
				st := resp.GetStatuses()[0]
				if resp.GetOverallCode() != code || st.GetCode() != code {
					t.Errorf("request %d: %v, want %v", i, st.GetCode(), code)
				}
				if cl := st.GetCurrentLimit(); cl.GetName() != "plan" || cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != c.unit || cl.GetUnitMultiplier() != nil {
					t.Errorf("request %d: current_limit %v, want 2 per 1 %v", i, cl, c.unit)
				}
				if st.GetLimitRemaining() != remaining {
					t.Errorf("request %d: remaining %d, want %d", i, st.GetLimitRemaining(), remaining)
				}
				if got := st.GetDurationUntilReset().AsDuration(); got != reset {
					t.Errorf("request %d: duration_until_reset %v, want %v", i, got, reset)
				}
			}
			toEnd := c.end.Sub(c.now)
			check(0, decide(), ok, 1, toEnd)
			check(1, decide(), ok, 0, toEnd)
			over := decide()
			check(2, over, overLimit, 0, toEnd)
			secs := strconv.FormatInt((int64(toEnd)+int64(time.Second)-1)/int64(time.Second), 10)
			if h := headerMap(t, over); h["Retry-After"] != secs || h["Ratelimit"] != `"plan";r=0;t=`+secs {
				t.Errorf("over limit: headers %q, want Retry-After and t of %s s", h, secs)
			}
			// The last instant of the period is still rejected; the first of the next admits.
			clock.Advance(toEnd - time.Nanosecond)
			check(3, decide(), overLimit, 0, time.Nanosecond)
			clock.Advance(time.Nanosecond)
			check(4, decide(), ok, 1, c.next)
		})
	}
}

// TestStackedQuotaStatus checks a tier of a burst limit and a monthly quota: the quota, closest
// to exhaustion, is the binding limit, so current_limit names it, per MONTH, and its reset and a
// rejection by it count to the month's end, although the burst has tokens.
func TestStackedQuotaStatus(t *testing.T) {
	clock := testsupport.NewClock() // 2030-01-02 03:04:05 UTC
	tier := testsupport.StackedTier("pro",
		testsupport.TokenBucketLimit("burst", 10, 10, time.Second),
		testsupport.QuotaLimit("monthly", 2, v1alpha1.CalendarPeriodMonth, ""))
	cl := dial(t, newEngine(t, clock, newPolicy("default", "api", tier)))
	toFebruary := time.Date(2030, 2, 1, 0, 0, 0, 0, time.UTC).Sub(clock.Now())
	for i, want := range []struct {
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{{ok, 1}, {ok, 0}, {overLimit, 0}} {
		resp, err := cl.ShouldRateLimit(t.Context(), request("api", entries("k", "bob")))
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()[0]
		if st.GetCode() != want.code {
			t.Fatalf("request %d: %v, want %v", i, st.GetCode(), want.code)
		}
		if cl := st.GetCurrentLimit(); cl.GetName() != "pro/monthly" || cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MONTH {
			t.Errorf("request %d: current_limit %v, want pro/monthly 2 per MONTH", i, cl)
		}
		if st.GetLimitRemaining() != want.remaining || st.GetDurationUntilReset().AsDuration() != toFebruary {
			t.Errorf("request %d: remaining %d, reset %v, want %d and %v", i, st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration(), want.remaining, toFebruary)
		}
	}
}
