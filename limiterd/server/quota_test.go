package server

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// TestAllowQuotaTierAnswersAndHeaders checks a calendar quota's answers: RateLimit-Policy's window
// is the longest its period lasts (31 days for a month), whatever the day; RateLimit's t and
// Retry-After count to the end of the period, the zone's next 1st of the month at midnight.
func TestAllowQuotaTierAnswersAndHeaders(t *testing.T) {
	clock := testsupport.NewClock() // 2030-01-02 03:04:05 UTC: 12:04:05 in Tokyo
	h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.QuotaTier("monthly", 2, v1alpha1.CalendarPeriodMonth, "Asia/Tokyo"))), nil)
	// February starts in Tokyo (UTC+9) at 15:00 UTC on 31 January.
	toFebruary := time.Date(2030, 1, 31, 15, 0, 0, 0, time.UTC).Sub(clock.Now())
	secs := strconv.FormatInt(int64(toFebruary/time.Second), 10)
	ms := strconv.FormatInt(toFebruary.Milliseconds(), 10)
	for i, step := range []struct {
		status     int
		body       string
		rateLimit  string
		retryAfter string
	}{
		{200, `{"allowed":true,"limit":2,"remaining":1,"resetAfterSeconds":` + secs + `,"retryAfterSeconds":0,"resetAfterMs":` + ms + `,"retryAfterMs":0}`,
			`"monthly";r=1;t=` + secs, ""},
		{200, `{"allowed":true,"limit":2,"remaining":0,"resetAfterSeconds":` + secs + `,"retryAfterSeconds":0,"resetAfterMs":` + ms + `,"retryAfterMs":0}`,
			`"monthly";r=0;t=` + secs, ""},
		{429, `{"allowed":false,"limit":2,"remaining":0,"resetAfterSeconds":` + secs + `,"retryAfterSeconds":` + secs + `,"resetAfterMs":` + ms + `,"retryAfterMs":` + ms + `}`,
			`"monthly";r=0;t=` + secs, secs},
	} {
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice"}`)
		if a.status != step.status || strings.TrimSpace(a.body) != step.body {
			t.Fatalf("request %d: %d %s\n want %d %s", i, a.status, a.body, step.status, step.body)
		}
		if got := a.header.Get("RateLimit-Policy"); got != `"monthly";q=2;w=2678400` {
			t.Errorf("request %d: RateLimit-Policy = %q, want the window of 31 days", i, got)
		}
		if got := a.header.Get("RateLimit"); got != step.rateLimit {
			t.Errorf("request %d: RateLimit = %q, want %q", i, got, step.rateLimit)
		}
		if got := a.header.Get("Retry-After"); got != step.retryAfter {
			t.Errorf("request %d: Retry-After = %q, want %q", i, got, step.retryAfter)
		}
	}
	// On February's first instant in Tokyo, the allowance is whole again.
	clock.Advance(toFebruary)
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice"}`); a.status != 200 || a.header.Get("RateLimit") != `"monthly";r=1;t=2419200` {
		t.Fatalf("in February: %d %q, want admitted, whole again in 28 days", a.status, a.header.Get("RateLimit"))
	}
}

// TestQuotaHeadersAcrossDSTDays checks a Day quota's header fields in America/New_York around
// the days of 23 hours (2026-03-08) and 25 hours (2026-11-01): RateLimit-Policy's w stays 86400
// (the draft wants it constant; a day's length on a clock without offset changes), while
// RateLimit's t and Retry-After count to the zone's next midnight, whatever the day's length,
// rounded up to the second; at that midnight the first request is admitted.
func TestQuotaHeadersAcrossDSTDays(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		now, end time.Time
		next     time.Duration // the length of the day after
	}{
		// From 23:00 the day before: the next day is 23 hours long.
		{"before the 23-hour day", time.Date(2026, 3, 7, 23, 0, 0, 0, ny), time.Date(2026, 3, 8, 0, 0, 0, 0, ny), 23 * time.Hour},
		// Within it, at 01:30 EST: 21.5 hours left, not 22.5.
		{"within the 23-hour day", time.Date(2026, 3, 8, 1, 30, 0, 0, ny), time.Date(2026, 3, 9, 0, 0, 0, 0, ny), 24 * time.Hour},
		{"before the 25-hour day", time.Date(2026, 10, 31, 23, 0, 0, 0, ny), time.Date(2026, 11, 1, 0, 0, 0, 0, ny), 25 * time.Hour},
		// At the first 01:30 (EDT), 23.5 hours are left, not 22.5; a partial second rounds up.
		{"within the 25-hour day", time.Date(2026, 11, 1, 5, 30, 0, 250_000_000, time.UTC), time.Date(2026, 11, 2, 0, 0, 0, 0, ny), 24 * time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := testsupport.NewClock()
			clock.Advance(c.now.Sub(clock.Now()))
			h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.QuotaTier("daily", 1, v1alpha1.CalendarPeriodDay, "America/New_York"))), nil)
			toEnd := c.end.Sub(c.now)
			secs := strconv.FormatInt(int64((toEnd+time.Second-1)/time.Second), 10)
			for i, step := range []struct {
				status     int
				rateLimit  string
				retryAfter string
			}{
				{200, `"daily";r=0;t=` + secs, ""},
				{429, `"daily";r=0;t=` + secs, secs},
			} {
				a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice"}`)
				if a.status != step.status || a.header.Get("RateLimit") != step.rateLimit || a.header.Get("Retry-After") != step.retryAfter {
					t.Errorf("request %d: %d RateLimit %q Retry-After %q, want %d %q %q", i, a.status,
						a.header.Get("RateLimit"), a.header.Get("Retry-After"), step.status, step.rateLimit, step.retryAfter)
				}
				if got := a.header.Get("RateLimit-Policy"); got != `"daily";q=1;w=86400` {
					t.Errorf("request %d: RateLimit-Policy = %q, want w=86400", i, got)
				}
			}
			// The last nanosecond of the day is still rejected; midnight admits.
			clock.Advance(toEnd - time.Nanosecond)
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice"}`); a.status != 429 || a.header.Get("Retry-After") != "1" {
				t.Errorf("last instant of the day: %d Retry-After %q, want 429 1", a.status, a.header.Get("Retry-After"))
			}
			clock.Advance(time.Nanosecond)
			want := `"daily";r=0;t=` + strconv.FormatInt(int64(c.next/time.Second), 10)
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice"}`); a.status != 200 || a.header.Get("RateLimit") != want {
				t.Errorf("at midnight: %d %q, want 200 %q", a.status, a.header.Get("RateLimit"), want)
			}
		})
	}
}

// TestStackedQuotaHeaders checks a tier of a burst and a monthly quota over HTTP: RateLimit-Policy
// lists the quota with the window of 31 days, and once the quota is spent it is the binding
// limit: RateLimit and Retry-After count to the month's end, although the burst has tokens.
func TestStackedQuotaHeaders(t *testing.T) {
	clock := testsupport.NewClock() // 2030-01-02 03:04:05 UTC
	h := NewDecisions(newEngine(t, clock, newPolicy("api", testsupport.StackedTier("pro",
		testsupport.TokenBucketLimit("burst", 10, 10, time.Second),
		testsupport.QuotaLimit("monthly", 2, v1alpha1.CalendarPeriodMonth, "")))), nil)
	toFebruary := time.Date(2030, 2, 1, 0, 0, 0, 0, time.UTC).Sub(clock.Now())
	secs := strconv.FormatInt(int64(toFebruary/time.Second), 10)
	for i, step := range []struct {
		status                int
		rateLimit, retryAfter string
	}{
		{200, `"pro/monthly";r=1;t=` + secs, ""},
		{200, `"pro/monthly";r=0;t=` + secs, ""},
		{429, `"pro/monthly";r=0;t=` + secs, secs},
	} {
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice"}`)
		if a.status != step.status || a.header.Get("RateLimit") != step.rateLimit || a.header.Get("Retry-After") != step.retryAfter {
			t.Errorf("request %d: %d RateLimit %q Retry-After %q, want %d %q %q", i, a.status,
				a.header.Get("RateLimit"), a.header.Get("Retry-After"), step.status, step.rateLimit, step.retryAfter)
		}
		if got := a.header.Get("RateLimit-Policy"); got != `"pro/burst";q=10;w=1, "pro/monthly";q=2;w=2678400` {
			t.Errorf("request %d: RateLimit-Policy = %q", i, got)
		}
	}
}
