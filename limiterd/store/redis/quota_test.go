package redis

import (
	"strconv"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

func quota(t *testing.T, limit int64, period limiter.CalendarPeriod, zone string) *limiter.Quota {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	q, err := limiter.NewQuota(limit, period, loc)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestQuotaOnServerClockAsksForItsPeriod decides quotas on the server's clock with a caller's
// instant decades off: the periods Go passes do not hold the script's now, so the script asks
// for them at its own instant (outcomePeriod), and the decision counts in the server's period,
// with the key expiring at its end.
func TestQuotaOnServerClockAsksForItsPeriod(t *testing.T) {
	t.Parallel()
	c := newClient(t, Options{Addrs: []string{shared(t).Addr()}, Timeout: 10 * time.Second}) // server clock, no slack
	s := c.Store(t.Name())
	q := quota(t, 2, limiter.PeriodDay, "America/New_York")
	stacked := limitertest.Stack("day", q, "rate", tokenBucket(t, 10, 1, time.Second))
	caller := time.Date(1990, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		st   *limiter.Stack
		key  string
	}{
		{"one", limitertest.One(q), Key(t.Name(), "one")},
		{"stacked", stacked, LimitKey(t.Name(), "stacked", "day")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := tc.name
			before := time.Now()
			for i := range 3 {
				d, err := s.Decide(t.Context(), client, tc.st, caller, 1, nil)
				if err != nil {
					t.Fatal(err)
				}
				after := time.Now()
				// The server's period ends at q's period end of an instant between before and
				// after (the server's clock is this machine's).
				lo, hi := q.PeriodEnd(before).Sub(after), q.PeriodEnd(after).Sub(before)
				if d.Allowed != (i < 2) || d.Limit != 2 || d.Remaining != int64(max(0, 1-i)) ||
					d.ResetAfter < lo || d.ResetAfter > hi || (!d.Allowed && d.RetryAfter != d.ResetAfter) {
					t.Fatalf("decision %d: %+v, want allowed %v and a reset in [%v, %v]", i, d, i < 2, lo, hi)
				}
				if i == 0 {
					pttl, err := strconv.ParseInt(do(t, c, "PTTL", tc.key), 10, 64)
					if err != nil {
						t.Fatal(err)
					}
					if reset := d.ResetAfter.Milliseconds(); pttl > reset+1 || pttl < reset-2000 {
						t.Fatalf("PTTL %dms after a decision with ResetAfter %v", pttl, d.ResetAfter)
					}
				}
			}
			// A batch decides at the server's instant too.
			out := make([]limiter.Answer, 2)
			s.DecideBatch(t.Context(), []limiter.Request{
				{Key: client, Stack: tc.st, Cost: 1},
				{Key: client + "-fresh", Stack: tc.st, Cost: 2},
			}, caller, out)
			if out[0].Err != nil || out[0].Allowed || out[1].Err != nil || !out[1].Allowed || out[1].Remaining != 0 {
				t.Fatalf("batch: %+v", out)
			}
		})
	}
}

// TestQuotaStateIsSmall checks what a quota keeps under its key: its fingerprint, the end of
// its period (Unix seconds) and the units used, expiring at the period's end.
func TestQuotaStateIsSmall(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	s := c.Store(t.Name())
	q := quota(t, 100, limiter.PeriodMonth, "Europe/Paris")
	now := time.Date(2027, 3, 30, 21, 59, 0, 0, time.UTC)
	if _, err := s.Decide(t.Context(), "k", limitertest.One(q), now, 7, nil); err != nil {
		t.Fatal(err)
	}
	// April starts at 00:00 CEST, 22:00 UTC on 31 March.
	end := time.Date(2027, 3, 31, 22, 0, 0, 0, time.UTC)
	if got, want := do(t, c, "GET", Key(t.Name(), "k")), "qt:100:3:Europe%2FParis "+strconv.FormatInt(end.Unix(), 10)+" 7"; got != want {
		t.Fatalf("state %q, want %q", got, want)
	}
	pttl, err := strconv.ParseInt(do(t, c, "PTTL", Key(t.Name(), "k")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	// The test options' expiry slack is an hour, on the caller's clock.
	if want := (end.Sub(now) + time.Hour).Milliseconds(); pttl > want || pttl < want-2000 {
		t.Fatalf("PTTL %dms, want %dms", pttl, want)
	}
}

func TestQuotaFingerprintRoundTrips(t *testing.T) {
	for _, zone := range []string{"UTC", "America/Argentina/Buenos_Aires", "Etc/GMT+5"} {
		q := quota(t, 5, limiter.PeriodWeek, zone)
		rl, err := parseFingerprint(fingerprint(q))
		if err != nil || rl != limiter.RateLimiter(q) {
			t.Fatalf("%s: parsed %v, %v", fingerprint(q), rl, err)
		}
	}
}
