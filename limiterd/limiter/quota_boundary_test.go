package limiter_test

import (
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// TestQuotaResetIsExactAtTheBoundary spends a quota of 3 in a period and decides at the
// period's last nanosecond and at its end, for the calendar cases: New York's 23- and
// 25-hour days (2026-03-08, 2026-11-01) and the days around them, months of 28, 29, 30 and 31
// days (February 2027 and 2028), the end of a year, zones east of UTC whose day, week or year
// starts on the previous UTC date (Tokyo, Auckland, including Auckland's own daylight saving
// changes), and ISO weeks, which start on Monday. The last request of a period is rejected when
// the quota is spent, with a retry after 1 ns; the first of the next period is admitted, reset
// after the next period's whole length; the last instant of that period still counts in it.
// Expected instants and lengths are written out, not computed by the quota's code; each case
// runs on the strategy and through the memory store.
func TestQuotaResetIsExactAtTheBoundary(t *testing.T) {
	const (
		h   = time.Hour
		day = 24 * h
	)
	ny, tokyo, auckland := mustZone(t, "America/New_York"), mustZone(t, "Asia/Tokyo"), mustZone(t, "Pacific/Auckland")
	cases := []struct {
		name   string
		period limiter.CalendarPeriod
		loc    *time.Location
		at     time.Time     // the spending request, within the period
		end    time.Time     // the period's end
		next   time.Duration // the length of the period after
	}{
		// New York, 2026: clocks go from 02:00 to 03:00 on 8 March, from 02:00 to 01:00 on 1 November.
		{"New York, the day before the 23-hour day", limiter.PeriodDay, ny, time.Date(2026, 3, 7, 9, 0, 0, 0, ny), time.Date(2026, 3, 8, 0, 0, 0, 0, ny), 23 * h},
		{"New York, the 23-hour day", limiter.PeriodDay, ny, time.Date(2026, 3, 8, 1, 59, 59, 0, ny), utc(2026, 3, 9, 4, 0), day},
		{"New York, the day before the 25-hour day", limiter.PeriodDay, ny, time.Date(2026, 10, 31, 9, 0, 0, 0, ny), utc(2026, 11, 1, 4, 0), 25 * h},
		// 06:30 UTC is the second 01:30 of 1 November, in EST.
		{"New York, the 25-hour day, after the change", limiter.PeriodDay, ny, utc(2026, 11, 1, 6, 30), utc(2026, 11, 2, 5, 0), day},
		// Month lengths.
		{"January 2026, 31 days, then February, 28", limiter.PeriodMonth, time.UTC, utc(2026, 1, 31, 23, 0), utc(2026, 2, 1, 0, 0), 28 * day},
		{"April 2026, 30 days, then May, 31", limiter.PeriodMonth, time.UTC, utc(2026, 4, 10, 0, 0), utc(2026, 5, 1, 0, 0), 31 * day},
		{"February 2027, 28 days", limiter.PeriodMonth, time.UTC, utc(2027, 2, 1, 0, 0), utc(2027, 3, 1, 0, 0), 31 * day},
		{"January 2028, then February, 29 days", limiter.PeriodMonth, time.UTC, utc(2028, 1, 15, 12, 0), utc(2028, 2, 1, 0, 0), 29 * day},
		// New York's March 2028 holds the spring change (12 March): an hour short.
		{"February 2028 in New York, 29 days", limiter.PeriodMonth, ny, time.Date(2028, 2, 29, 23, 59, 59, 999_999_999, ny), utc(2028, 3, 1, 5, 0), 31*day - h},
		// The end of a year.
		{"New York, 31 December, a day", limiter.PeriodDay, ny, time.Date(2026, 12, 31, 23, 0, 0, 0, ny), utc(2027, 1, 1, 5, 0), day},
		{"UTC, December 2027, a month", limiter.PeriodMonth, time.UTC, utc(2027, 12, 31, 12, 0), utc(2028, 1, 1, 0, 0), 31 * day},
		{"New York, 2026, a year", limiter.PeriodYear, ny, time.Date(2026, 12, 31, 23, 59, 59, 0, ny), utc(2027, 1, 1, 5, 0), 365 * day},
		{"UTC, 2027, then 2028, leap", limiter.PeriodYear, time.UTC, utc(2027, 7, 1, 0, 0), utc(2028, 1, 1, 0, 0), 366 * day},
		// East of UTC: Tokyo's day starts at 15:00 UTC on the previous date; Auckland's (UTC+12,
		// +13 in summer) at 11:00 or 12:00 UTC.
		{"Tokyo, a day", limiter.PeriodDay, tokyo, utc(2026, 12, 2, 14, 59), utc(2026, 12, 2, 15, 0), day},
		{"Tokyo, 2027 starts on 31 December 2026 UTC", limiter.PeriodYear, tokyo, utc(2026, 12, 31, 14, 0), utc(2026, 12, 31, 15, 0), 365 * day},
		{"Auckland, 2027 starts on 31 December 2026 UTC", limiter.PeriodYear, auckland, utc(2026, 3, 1, 0, 0), utc(2026, 12, 31, 11, 0), 365 * day},
		// 5 April 2026: Auckland's clocks go from 03:00 to 02:00; 27 September: from 02:00 to 03:00.
		{"Auckland, the day before its 25-hour day", limiter.PeriodDay, auckland, utc(2026, 4, 4, 10, 59), utc(2026, 4, 4, 11, 0), 25 * h},
		{"Auckland, the day before its 23-hour day", limiter.PeriodDay, auckland, utc(2026, 9, 26, 11, 0), utc(2026, 9, 26, 12, 0), 23 * h},
		{"Auckland, October starts on 30 September UTC", limiter.PeriodMonth, auckland, utc(2026, 9, 30, 10, 0), utc(2026, 9, 30, 11, 0), 31 * day},
		// ISO weeks start on Monday: 2 March 2026 and 7 December 2026 are Mondays.
		{"New York, a week, then the week of the 23-hour day", limiter.PeriodWeek, ny, time.Date(2026, 3, 1, 23, 59, 0, 0, ny), utc(2026, 3, 2, 5, 0), 7*day - h},
		{"Tokyo, Monday starts on Sunday UTC", limiter.PeriodWeek, tokyo, utc(2026, 12, 6, 14, 0), utc(2026, 12, 6, 15, 0), 7 * day},
	}
	for _, c := range cases {
		q := mustQuota(t, 3, c.period, c.loc)
		steps := []struct {
			at   time.Time
			cost int64
			want limiter.Decision
		}{
			{c.at, 3, limiter.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: c.end.Sub(c.at)}},
			{c.end.Add(-1), 1, limiter.Decision{Limit: 3, Remaining: 0, ResetAfter: 1, RetryAfter: 1}},
			{c.end, 1, limiter.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: c.next}},
			{c.end.Add(c.next - 1), 2, limiter.Decision{Allowed: true, Limit: 3, Remaining: 0, ResetAfter: 1}},
			{c.end.Add(c.next - 1), 1, limiter.Decision{Limit: 3, Remaining: 0, ResetAfter: 1, RetryAfter: 1}},
			{c.end.Add(c.next), 1, limiter.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: -1}}, // -1: any
		}
		check := func(t *testing.T, decide func(at time.Time, cost int64) limiter.Decision) {
			for i, st := range steps {
				got := decide(st.at, st.cost)
				if st.want.ResetAfter < 0 {
					st.want.ResetAfter = got.ResetAfter
				}
				if got.Allowed {
					got.RetryAfter = 0 // not specified for an admission
				}
				if got != st.want {
					t.Fatalf("step %d at %v (%v), cost %d: %+v, want %+v", i, st.at.In(c.loc), st.at.UTC(), st.cost, got, st.want)
				}
			}
		}
		t.Run(c.name+"/strategy", func(t *testing.T) {
			var s limiter.State
			check(t, func(at time.Time, cost int64) limiter.Decision { return q.Decide(&s, at, cost) })
		})
		t.Run(c.name+"/memory", func(t *testing.T) {
			m := limiter.NewMemory(nil)
			defer m.Close()
			st := limitertest.One(q)
			check(t, func(at time.Time, cost int64) limiter.Decision {
				d, err := m.Decide(t.Context(), "client", st, at, cost, nil)
				if err != nil {
					t.Fatal(err)
				}
				return d
			})
		})
	}
}
