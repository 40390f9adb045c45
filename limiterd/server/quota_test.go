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
