package limiter_test

import (
	"testing"
	"time"
	_ "time/tzdata" // the zones below, whatever the machine has installed

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
	"github.com/limiterd/limiterd/limiterd/limiter"
)

func mustQuota(t testing.TB, limit int64, period limiter.CalendarPeriod, loc *time.Location) *limiter.Quota {
	t.Helper()
	q, err := limiter.NewQuota(limit, period, loc)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// utc is a UTC instant, for expectations stated as instants rather than wall clocks.
func utc(y int, m time.Month, d, h, mi int) time.Time {
	return time.Date(y, m, d, h, mi, 0, 0, time.UTC)
}

func TestNewQuotaRejectsInvalidParameters(t *testing.T) {
	bad := []struct {
		name string
		err  error
	}{
		{"limit 0", second(limiter.NewQuota(0, limiter.PeriodDay, time.UTC))},
		{"limit too large", second(limiter.NewQuota(limiter.MaxQuotaLimit+1, limiter.PeriodDay, time.UTC))},
		{"no period", second(limiter.NewQuota(1, 0, time.UTC))},
		{"unknown period", second(limiter.NewQuota(1, limiter.PeriodYear+1, time.UTC))},
		{"nil zone", second(limiter.NewQuota(1, limiter.PeriodDay, nil))},
	}
	for _, c := range bad {
		if c.err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if _, err := limiter.NewQuota(limiter.MaxQuotaLimit, limiter.PeriodYear, time.UTC); err != nil {
		t.Errorf("the largest limit: %v", err)
	}
}

func TestQuotaNames(t *testing.T) {
	for p, want := range map[limiter.CalendarPeriod]string{limiter.PeriodDay: "Day", limiter.PeriodWeek: "Week",
		limiter.PeriodMonth: "Month", limiter.PeriodYear: "Year", 9: "CalendarPeriod(9)"} {
		if p.String() != want {
			t.Errorf("%d: %q, want %q", p, p.String(), want)
		}
	}
	q := mustQuota(t, 7, limiter.PeriodWeek, time.UTC)
	if q.Algorithm() != limiter.AlgorithmQuota || q.Algorithm().String() != "Quota" || q.Limit() != 7 {
		t.Errorf("algorithm %v, limit %d", q.Algorithm(), q.Limit())
	}
	for p, want := range map[limiter.CalendarPeriod]time.Duration{limiter.PeriodDay: 24 * time.Hour,
		limiter.PeriodWeek: 7 * 24 * time.Hour, limiter.PeriodMonth: 31 * 24 * time.Hour, limiter.PeriodYear: 366 * 24 * time.Hour} {
		if w := mustQuota(t, 1, p, time.UTC).Window(); w != want {
			t.Errorf("%v: window %v, want %v", p, w, want)
		}
	}
}

func TestQuotasAreInterned(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	a, b := mustQuota(t, 5, limiter.PeriodMonth, berlin), mustQuota(t, 5, limiter.PeriodMonth, mustZone(t, "Europe/Berlin"))
	if a != b || a.ID() != b.ID() {
		t.Fatalf("equal parameters gave different strategies")
	}
	for _, other := range []*limiter.Quota{mustQuota(t, 6, limiter.PeriodMonth, berlin),
		mustQuota(t, 5, limiter.PeriodYear, berlin), mustQuota(t, 5, limiter.PeriodMonth, time.UTC)} {
		if other.ID() == a.ID() {
			t.Errorf("%v: shares the ID of %v", other, a)
		}
	}
	// A zone is known by its name: the second Location of one name gets the first's quota.
	x1, x2 := time.FixedZone("X", 3600), time.FixedZone("X", 7200)
	q1, q2 := mustQuota(t, 5, limiter.PeriodDay, x1), mustQuota(t, 5, limiter.PeriodDay, x2)
	if q1 != q2 {
		t.Fatalf("two Locations of one name gave two quotas")
	}
	if limit, period, loc := q2.Params(); limit != 5 || period != limiter.PeriodDay || loc != x1 {
		t.Errorf("Params() = %d, %v, %p; want 5, Day, the first Location %p", limit, period, loc, x1)
	}
}

func TestQuotaPeriods(t *testing.T) {
	const h = time.Hour
	cases := []struct {
		name       string
		zone       string
		period     limiter.CalendarPeriod
		at         time.Time
		start, end time.Time // instants
		length     time.Duration
	}{
		{"UTC day", "UTC", limiter.PeriodDay, utc(2026, 12, 2, 10, 0), utc(2026, 12, 2, 0, 0), utc(2026, 12, 3, 0, 0), 24 * h},
		{"UTC day, at its start", "UTC", limiter.PeriodDay, utc(2026, 12, 3, 0, 0), utc(2026, 12, 3, 0, 0), utc(2026, 12, 4, 0, 0), 24 * h},
		{"UTC day, its last ns", "UTC", limiter.PeriodDay, utc(2026, 12, 3, 0, 0).Add(-1), utc(2026, 12, 2, 0, 0), utc(2026, 12, 3, 0, 0), 24 * h},
		{"instant before 1970", "UTC", limiter.PeriodDay, utc(1969, 12, 31, 23, 59), utc(1969, 12, 31, 0, 0), utc(1970, 1, 1, 0, 0), 24 * h},
		{"week, Wednesday", "UTC", limiter.PeriodWeek, utc(2026, 12, 2, 10, 0), utc(2026, 11, 30, 0, 0), utc(2026, 12, 7, 0, 0), 7 * 24 * h},
		{"week, Sunday", "UTC", limiter.PeriodWeek, utc(2026, 12, 6, 23, 59), utc(2026, 11, 30, 0, 0), utc(2026, 12, 7, 0, 0), 7 * 24 * h},
		{"ISO week 1 of 2026 starts in 2025", "UTC", limiter.PeriodWeek, utc(2026, 1, 1, 12, 0), utc(2025, 12, 29, 0, 0), utc(2026, 1, 5, 0, 0), 7 * 24 * h},
		{"ISO week 52 of 2027 ends in 2028", "UTC", limiter.PeriodWeek, utc(2028, 1, 2, 12, 0), utc(2027, 12, 27, 0, 0), utc(2028, 1, 3, 0, 0), 7 * 24 * h},
		{"January", "UTC", limiter.PeriodMonth, utc(2026, 1, 31, 23, 59), utc(2026, 1, 1, 0, 0), utc(2026, 2, 1, 0, 0), 31 * 24 * h},
		{"April", "UTC", limiter.PeriodMonth, utc(2026, 4, 30, 12, 0), utc(2026, 4, 1, 0, 0), utc(2026, 5, 1, 0, 0), 30 * 24 * h},
		{"February 2027", "UTC", limiter.PeriodMonth, utc(2027, 2, 28, 12, 0), utc(2027, 2, 1, 0, 0), utc(2027, 3, 1, 0, 0), 28 * 24 * h},
		{"February 2028, leap", "UTC", limiter.PeriodMonth, utc(2028, 2, 29, 12, 0), utc(2028, 2, 1, 0, 0), utc(2028, 3, 1, 0, 0), 29 * 24 * h},
		{"December", "UTC", limiter.PeriodMonth, utc(2026, 12, 2, 10, 0), utc(2026, 12, 1, 0, 0), utc(2027, 1, 1, 0, 0), 31 * 24 * h},
		{"2027", "UTC", limiter.PeriodYear, utc(2027, 6, 1, 0, 0), utc(2027, 1, 1, 0, 0), utc(2028, 1, 1, 0, 0), 365 * 24 * h},
		{"2028, leap", "UTC", limiter.PeriodYear, utc(2028, 12, 31, 23, 59), utc(2028, 1, 1, 0, 0), utc(2029, 1, 1, 0, 0), 366 * 24 * h},
		// Daylight saving changes: 23- and 25-hour days, and the months holding them.
		{"New York, spring forward", "America/New_York", limiter.PeriodDay, utc(2026, 3, 8, 12, 0), utc(2026, 3, 8, 5, 0), utc(2026, 3, 9, 4, 0), 23 * h},
		{"New York, fall back", "America/New_York", limiter.PeriodDay, utc(2026, 11, 1, 12, 0), utc(2026, 11, 1, 4, 0), utc(2026, 11, 2, 5, 0), 25 * h},
		{"New York, March", "America/New_York", limiter.PeriodMonth, utc(2026, 3, 20, 0, 0), utc(2026, 3, 1, 5, 0), utc(2026, 4, 1, 4, 0), 31*24*h - h},
		{"New York, first instant of a month", "America/New_York", limiter.PeriodMonth, utc(2026, 4, 1, 4, 0), utc(2026, 4, 1, 4, 0), utc(2026, 5, 1, 4, 0), 30 * 24 * h},
		{"Berlin, spring forward", "Europe/Berlin", limiter.PeriodDay, utc(2026, 3, 29, 12, 0), utc(2026, 3, 28, 23, 0), utc(2026, 3, 29, 22, 0), 23 * h},
		{"Berlin, fall back", "Europe/Berlin", limiter.PeriodDay, utc(2026, 10, 25, 12, 0), utc(2026, 10, 24, 22, 0), utc(2026, 10, 25, 23, 0), 25 * h},
		{"Berlin, week of the fall back", "Europe/Berlin", limiter.PeriodWeek, utc(2026, 10, 25, 12, 0), utc(2026, 10, 18, 22, 0), utc(2026, 10, 25, 23, 0), 7*24*h + h},
		// Past 2037 a zone's changes follow a rule, for which ZoneBounds answered, on 31
		// December of a leap year, an end before the instant (golang/go#81583): the period's
		// end was never found.
		{"Berlin, 31 December of a leap year past 2037", "Europe/Berlin", limiter.PeriodDay, utc(2040, 12, 31, 12, 0), utc(2040, 12, 30, 23, 0), utc(2040, 12, 31, 23, 0), 24 * h},
		{"Santiago, 31 December of a leap year past 2037", "America/Santiago", limiter.PeriodMonth, utc(2120, 12, 31, 12, 0), utc(2120, 12, 1, 3, 0), utc(2121, 1, 1, 3, 0), 31 * 24 * h},
		// A half-hour offset: Kolkata's midnight is 18:30 UTC.
		{"Kolkata day", "Asia/Kolkata", limiter.PeriodDay, utc(2026, 12, 2, 10, 0), utc(2026, 12, 1, 18, 30), utc(2026, 12, 2, 18, 30), 24 * h},
		{"Kolkata month, from its last UTC evening", "Asia/Kolkata", limiter.PeriodMonth, utc(2026, 11, 30, 19, 0), utc(2026, 11, 30, 18, 30), utc(2026, 12, 31, 18, 30), 31 * 24 * h},
		// Daylight saving at midnight. Santiago moves its clocks from 00:00 to 01:00 on 6
		// September 2026 (04:00 UTC): that day starts at 01:00, at the change, and the day
		// before lasts 24 hours up to it. time.Date answers 23:00 the day before (03:00 UTC)
		// for that midnight, which would end the 5th before its last hour.
		{"Santiago, the day before a skipped midnight", "America/Santiago", limiter.PeriodDay, utc(2026, 9, 6, 3, 30), utc(2026, 9, 5, 4, 0), utc(2026, 9, 6, 4, 0), 24 * h},
		{"Santiago, the day of a skipped midnight", "America/Santiago", limiter.PeriodDay, utc(2026, 9, 6, 4, 0), utc(2026, 9, 6, 4, 0), utc(2026, 9, 7, 3, 0), 23 * h},
		{"Santiago, fall back at midnight", "America/Santiago", limiter.PeriodDay, utc(2026, 4, 5, 3, 30), utc(2026, 4, 4, 3, 0), utc(2026, 4, 5, 4, 0), 25 * h},
		{"Santiago, the week of a skipped midnight", "America/Santiago", limiter.PeriodWeek, utc(2026, 9, 6, 3, 30), utc(2026, 8, 31, 4, 0), utc(2026, 9, 7, 3, 0), 7*24*h - h},
		// Havana springs from 00:00 to 01:00 and falls back from 01:00 to 00:00: midnight then
		// happens twice, and the day starts at the first.
		{"Havana, a skipped midnight", "America/Havana", limiter.PeriodDay, utc(2026, 3, 8, 5, 0), utc(2026, 3, 8, 5, 0), utc(2026, 3, 9, 4, 0), 23 * h},
		{"Havana, a repeated midnight", "America/Havana", limiter.PeriodDay, utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 4, 0), utc(2026, 11, 2, 5, 0), 25 * h},
		// Beirut springs from 00:00 to 01:00 (22:00 UTC) and falls back from 00:00 to 23:00.
		{"Beirut, a skipped midnight", "Asia/Beirut", limiter.PeriodDay, utc(2026, 3, 28, 22, 0), utc(2026, 3, 28, 22, 0), utc(2026, 3, 29, 21, 0), 23 * h},
		{"Beirut, fall back at midnight", "Asia/Beirut", limiter.PeriodDay, utc(2026, 10, 24, 21, 30), utc(2026, 10, 23, 21, 0), utc(2026, 10, 24, 22, 0), 25 * h},
		// Apia skipped 30 December 2011 (from -10 to +14 at 10:00 UTC): that date starts no
		// period; the 29th ends where the 31st starts, and December lasted 30 days.
		{"Apia, the day before a skipped date", "Pacific/Apia", limiter.PeriodDay, utc(2011, 12, 30, 9, 0), utc(2011, 12, 29, 10, 0), utc(2011, 12, 30, 10, 0), 24 * h},
		{"Apia, the day after a skipped date", "Pacific/Apia", limiter.PeriodDay, utc(2011, 12, 30, 10, 0), utc(2011, 12, 30, 10, 0), utc(2011, 12, 31, 10, 0), 24 * h},
		{"Apia, December 2011", "Pacific/Apia", limiter.PeriodMonth, utc(2011, 12, 15, 0, 0), utc(2011, 12, 1, 10, 0), utc(2011, 12, 31, 10, 0), 30 * 24 * h},
		// Kwajalein moved from +11 to -12 at 13:00 UTC on 30 September 1969: its clock stepped
		// back 23 hours, within the 30th, which lasted 47 hours.
		{"Kwajalein, a repeated date", "Pacific/Kwajalein", limiter.PeriodDay, utc(1969, 9, 30, 14, 0), utc(1969, 9, 29, 13, 0), utc(1969, 10, 1, 12, 0), 47 * h},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := mustQuota(t, 1, c.period, mustZone(t, c.zone))
			start, end := q.PeriodStart(c.at), q.PeriodEnd(c.at)
			if !start.Equal(c.start) || !end.Equal(c.end) {
				t.Fatalf("period of %v: [%v, %v), want [%v, %v)", c.at.UTC(), start.UTC(), end.UTC(), c.start, c.end)
			}
			if got := end.Sub(start); got != c.length {
				t.Errorf("period length %v, want %v", got, c.length)
			}
			if start.Location() != q.PeriodEnd(start).Location() || start.Location().String() != c.zone {
				t.Errorf("bounds in %v, want %s", start.Location(), c.zone)
			}
			// A decision at the period's start resets after the period's exact length.
			var s limiter.State
			if d := q.Decide(&s, start, 1); !d.Allowed || d.ResetAfter != c.length {
				t.Errorf("decision at the period's start: %+v, want admitted, reset after %v", d, c.length)
			}
		})
	}
}

// quotaZones are the zones the period properties are checked in: common ones, half- and
// quarter-hour offsets, daylight saving at midnight, of 30 minutes and of 2 hours, negative
// daylight saving, and zones that skipped or repeated a date.
var quotaZones = []string{
	"UTC", "America/New_York", "Europe/Berlin", "Europe/London", "Asia/Kolkata", "Asia/Kathmandu",
	"Australia/Lord_Howe", "Pacific/Chatham", "America/St_Johns", "Asia/Tehran", "America/Santiago",
	"America/Havana", "Asia/Beirut", "America/Asuncion", "America/Sao_Paulo", "Asia/Gaza",
	"Africa/Cairo", "Africa/Casablanca", "Europe/Dublin", "Antarctica/Troll", "Pacific/Apia",
	"Pacific/Kwajalein", "Pacific/Kiritimati", "America/Caracas", "Asia/Pyongyang", "Europe/Moscow",
	"Pacific/Tongatapu", "America/Scoresbysund", "Australia/Adelaide", "Pacific/Honolulu",
}

var quotaPeriods = []limiter.CalendarPeriod{limiter.PeriodDay, limiter.PeriodWeek, limiter.PeriodMonth, limiter.PeriodYear}

// checkQuotaPeriod checks the period of q that holds at against its definition: it holds at;
// it starts at the first instant at which the zone's clock shows the first date of a period or
// a later one (the instant a second before shows an earlier date; offsets change on whole
// seconds), and ends at the start of the next; and it lasts at most its Window plus a day (the
// largest offset change: Kwajalein's 30 September 1969 lasted 47 hours).
func checkQuotaPeriod(t *testing.T, q *limiter.Quota, at time.Time) {
	t.Helper()
	start, end := q.PeriodStart(at), q.PeriodEnd(at)
	_, period, loc := q.Params()
	switch {
	case start.After(at) || !end.After(at):
		t.Fatalf("%v %v: the period of %v is [%v, %v)", loc, period, at, start, end)
	case !q.PeriodStart(end).Equal(end) || !q.PeriodEnd(start.Add(-1)).Equal(start):
		t.Fatalf("%v %v: the period [%v, %v) is not adjacent to the next and the previous", loc, period, start, end)
	case end.Sub(start) > q.Window()+24*time.Hour:
		t.Fatalf("%v %v: the period [%v, %v) lasts %v", loc, period, start, end, end.Sub(start))
	}
	for _, b := range []time.Time{start, end} {
		first := firstDate(period, b.In(loc))
		before := b.Add(-time.Second).In(loc)
		if !dateBefore(before, first) || dateBefore(b.In(loc), first) {
			t.Fatalf("%v %v: bound %v (a second before: %v) is not the first instant showing %v or later",
				loc, period, b.In(loc), before, first.Format(time.DateOnly))
		}
	}
}

// firstDate returns the first date of the period whose dates include that of t, as a UTC
// midnight (an independent statement of the calendar: weeks start on Mondays).
func firstDate(p limiter.CalendarPeriod, t time.Time) time.Time {
	y, m, d := t.Date()
	day := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	switch p {
	case limiter.PeriodDay:
	case limiter.PeriodWeek:
		for day.Weekday() != time.Monday {
			day = day.AddDate(0, 0, -1)
		}
	case limiter.PeriodMonth:
		day = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	case limiter.PeriodYear:
		day = time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return day
}

// dateBefore reports whether t's date (on its own clock) is before the date of midnight.
func dateBefore(t, midnight time.Time) bool {
	y, m, d := t.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Before(midnight)
}

// quotaInstant maps any int64 to an instant between 1900 and 2189.
func quotaInstant(x int64) time.Time {
	const span = uint64(290 * 365 * 24 * time.Hour) // below 2^63 ns
	return utc(1900, 1, 1, 0, 0).Add(time.Duration(uint64(x) % span))
}

func FuzzQuotaPeriod(f *testing.F) {
	f.Add(int64(0), uint8(0), uint8(0))
	f.Add(int64(utc(2026, 9, 6, 3, 30).Sub(utc(1900, 1, 1, 0, 0))), uint8(10), uint8(0))
	f.Add(int64(utc(2011, 12, 30, 9, 59).Sub(utc(1900, 1, 1, 0, 0))), uint8(20), uint8(2))
	f.Add(int64(utc(1969, 9, 30, 14, 0).Sub(utc(1900, 1, 1, 0, 0))), uint8(21), uint8(1))
	f.Add(int64(-1), uint8(255), uint8(255))
	zones := make([]*time.Location, len(quotaZones))
	for i, name := range quotaZones {
		zones[i] = mustZone(f, name)
	}
	f.Fuzz(func(t *testing.T, x int64, zone, period uint8) {
		q := mustQuota(t, 1, quotaPeriods[int(period)%len(quotaPeriods)], zones[int(zone)%len(zones)])
		checkQuotaPeriod(t, q, quotaInstant(x))
	})
}

// TestQuotaPeriodProperties runs the fuzz test's check on random instants in every zone and
// period, and on the instants around every offset change of those zones from 1970 to 2040.
func TestQuotaPeriodProperties(t *testing.T) {
	rng := testseed.Rand(t, 6)
	for _, name := range quotaZones {
		loc := mustZone(t, name)
		for _, p := range quotaPeriods {
			q := mustQuota(t, 1, p, loc)
			for range 300 {
				checkQuotaPeriod(t, q, quotaInstant(rng.Int64()))
			}
		}
		q := mustQuota(t, 1, limiter.PeriodDay, loc)
		for at := utc(1970, 1, 1, 0, 0); at.Before(utc(2040, 1, 1, 0, 0)); {
			_, end := at.In(loc).ZoneBounds()
			if !end.After(at) {
				break
			}
			for _, d := range []time.Duration{-time.Hour, -time.Nanosecond, 0, time.Hour} {
				checkQuotaPeriod(t, q, end.Add(d))
			}
			at = end
		}
	}
}

func TestQuotaDecide(t *testing.T) {
	ny := mustZone(t, "America/New_York")
	q := mustQuota(t, 10, limiter.PeriodMonth, ny)
	var s limiter.State
	at := time.Date(2026, 3, 7, 12, 0, 0, 0, ny)
	end := time.Date(2026, 4, 1, 0, 0, 0, 0, ny) // after the spring change: not a multiple of 24 h away
	steps := []struct {
		at        time.Time
		cost      int64
		want      limiter.Decision
		unchanged bool // a rejection: the state is as it was
	}{
		{at, 7, limiter.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: end.Sub(at)}, false},
		{at.Add(time.Hour), 4, limiter.Decision{Limit: 10, Remaining: 3, ResetAfter: end.Sub(at) - time.Hour, RetryAfter: end.Sub(at) - time.Hour}, true},
		{at.Add(time.Hour), 11, limiter.Decision{Limit: 10, Remaining: 3, ResetAfter: end.Sub(at) - time.Hour}, true}, // never admitted: no retry
		{at.Add(time.Hour), 3, limiter.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: end.Sub(at) - time.Hour}, false},
		{end.Add(-1), 1, limiter.Decision{Limit: 10, Remaining: 0, ResetAfter: 1, RetryAfter: 1}, true},
		// The next month: the count restarts.
		{end, 11, limiter.Decision{Limit: 10, Remaining: 10}, true},
		{end, 10, limiter.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: 30 * 24 * time.Hour}, false},
		// A clock that steps back keeps counting in the stored period.
		{end.Add(-time.Hour), 1, limiter.Decision{Limit: 10, Remaining: 0, ResetAfter: 30*24*time.Hour + time.Hour, RetryAfter: 30*24*time.Hour + time.Hour}, true},
		// Months later, a fresh count.
		{end.AddDate(0, 5, 3), 1, limiter.Decision{Allowed: true, Limit: 10, Remaining: 9, ResetAfter: time.Date(2026, 10, 1, 0, 0, 0, 0, ny).Sub(end.AddDate(0, 5, 3))}, false},
	}
	for i, st := range steps {
		before := s
		if d := q.Decide(&s, st.at, st.cost); d != st.want {
			t.Fatalf("step %d: %+v, want %+v", i, d, st.want)
		}
		if (s == before) != st.unchanged {
			t.Fatalf("step %d: state changed %v, want %v", i, s != before, !st.unchanged)
		}
	}
}

func TestQuotaPeekRefundFresh(t *testing.T) {
	q := mustQuota(t, 10, limiter.PeriodDay, time.UTC)
	at := utc(2026, 12, 2, 18, 0)
	var s limiter.State
	if !q.Fresh(&s, at) {
		t.Fatal("a state never written is not fresh")
	}
	if p := q.Peek(&s, at); p != (limiter.Decision{Allowed: true, Limit: 10, Remaining: 10}) || s != (limiter.State{}) {
		t.Fatalf("peek of a fresh state: %+v", p)
	}
	q.Decide(&s, at, 10)
	before := s
	want := limiter.Decision{Limit: 10, Remaining: 0, ResetAfter: 6 * time.Hour, RetryAfter: 6 * time.Hour}
	for range 3 {
		if p := q.Peek(&s, at); p != want || s != before {
			t.Fatalf("peek: %+v, want %+v (state changed: %v)", p, want, s != before)
		}
	}
	if q.Fresh(&s, at) || !q.Fresh(&s, utc(2026, 12, 3, 0, 0)) {
		t.Fatal("Fresh: want false within the period and true at its end")
	}
	if p := q.Peek(&s, utc(2026, 12, 3, 0, 0)); p != (limiter.Decision{Allowed: true, Limit: 10, Remaining: 10}) || s != before {
		t.Fatalf("peek in the next period: %+v", p)
	}
	if d := q.Refund(&s, at, 3); d != (limiter.Decision{Allowed: true, Limit: 10, Remaining: 3, ResetAfter: 6 * time.Hour}) {
		t.Fatalf("refund of 3: %+v", d)
	}
	if d := q.Refund(&s, at, 100); d != (limiter.Decision{Allowed: true, Limit: 10, Remaining: 10}) || !q.Fresh(&s, at) {
		t.Fatalf("refund beyond the count: %+v, want clamped to the limit, and fresh", d)
	}
	if d := q.Decide(&s, at, 10); !d.Allowed {
		t.Fatalf("the refunded units: %+v", d)
	}
	// A refund after the period's end changes nothing: its units do not carry on.
	before = s
	if d := q.Refund(&s, utc(2026, 12, 3, 1, 0), 5); d != (limiter.Decision{Allowed: true, Limit: 10, Remaining: 10}) || s != before {
		t.Fatalf("refund in the next period: %+v (state changed: %v)", d, s != before)
	}
	if d := q.Decide(&s, utc(2026, 12, 3, 1, 0), 10); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("the next period: %+v", d)
	}
}

// TestQuotaCarry: the rule for parameter changes (see the package documentation).
func TestQuotaCarry(t *testing.T) {
	kolkata := mustZone(t, "Asia/Kolkata")
	monthUTC := mustQuota(t, 10, limiter.PeriodMonth, time.UTC)
	dayUTC := mustQuota(t, 10, limiter.PeriodDay, time.UTC)
	dayKolkata := mustQuota(t, 10, limiter.PeriodDay, kolkata)
	jan15 := utc(2026, 1, 15, 12, 0)
	cases := []struct {
		name string
		from []limiter.RateLimiter // the strategies that decided 8 units, in turn
		used time.Time
		to   limiter.RateLimiter
		at   time.Time
		want limiter.Decision // a peek
	}{
		{"limit raised", []limiter.RateLimiter{monthUTC}, jan15, mustQuota(t, 20, limiter.PeriodMonth, time.UTC), jan15,
			limiter.Decision{Allowed: true, Limit: 20, Remaining: 12, ResetAfter: utc(2026, 2, 1, 0, 0).Sub(jan15)}},
		{"limit lowered", []limiter.RateLimiter{monthUTC}, jan15, mustQuota(t, 5, limiter.PeriodMonth, time.UTC), jan15,
			limiter.Decision{Limit: 5, Remaining: 0, ResetAfter: utc(2026, 2, 1, 0, 0).Sub(jan15), RetryAfter: utc(2026, 2, 1, 0, 0).Sub(jan15)}},
		{"limit lowered, the next period", []limiter.RateLimiter{monthUTC}, jan15, mustQuota(t, 5, limiter.PeriodMonth, time.UTC), utc(2026, 2, 1, 0, 0),
			limiter.Decision{Allowed: true, Limit: 5, Remaining: 5}},
		// The month's count holds days before today: it ends with today.
		{"month to day", []limiter.RateLimiter{monthUTC}, utc(2026, 1, 3, 0, 0), mustQuota(t, 8, limiter.PeriodDay, time.UTC), jan15,
			limiter.Decision{Limit: 8, Remaining: 0, ResetAfter: 12 * time.Hour, RetryAfter: 12 * time.Hour}},
		// Today's count was used this month: it lasts the month, not until tonight (see
		// TestQuotaCarryIntoALongerPeriod).
		{"day to month", []limiter.RateLimiter{dayUTC}, jan15, monthUTC, jan15.Add(time.Hour),
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: utc(2026, 2, 1, 0, 0).Sub(jan15.Add(time.Hour))}},
		// Converted only after the day's end, the count has ended.
		{"day to month, the count has ended", []limiter.RateLimiter{dayUTC}, jan15, monthUTC, utc(2026, 1, 20, 0, 0),
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 10}},
		// At 20:00 UTC Kolkata's day started at 18:30 UTC: the UTC day's count holds earlier
		// units, and ends at UTC midnight, before Kolkata's day.
		{"zone changed", []limiter.RateLimiter{dayUTC}, utc(2026, 1, 15, 1, 0), dayKolkata, utc(2026, 1, 15, 20, 0),
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: 4 * time.Hour}},
		// The other way, Kolkata's day started within the UTC day: it lasts until UTC midnight,
		// before Kolkata's.
		{"zone changed back", []limiter.RateLimiter{dayKolkata}, utc(2026, 1, 15, 19, 0), dayUTC, utc(2026, 1, 15, 20, 0),
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: 4 * time.Hour}},
		// A count carried once ends where no period of its writer does: carried again, it
		// still ends there, rather than carrying January's units into February.
		{"carried twice", []limiter.RateLimiter{monthUTC, dayKolkata}, utc(2026, 1, 31, 20, 0), mustQuota(t, 10, limiter.PeriodMonth, kolkata), utc(2026, 1, 31, 21, 0),
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: 3 * time.Hour}},
		// Another algorithm's used units are charged at the conversion (a conversion never gives
		// usage back; it used to start fresh): 8 tokens used count 8 in the month...
		{"from a token bucket", []limiter.RateLimiter{mustTB(t, 10, 1, time.Hour)}, jan15, monthUTC, jan15,
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: 396 * time.Hour}},
		// ...and 8 units of the month are 8 tokens' refill, 8 hours.
		{"to a token bucket", []limiter.RateLimiter{monthUTC}, jan15, mustTB(t, 10, 1, time.Hour), jan15,
			limiter.Decision{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: 8 * time.Hour}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s limiter.State
			c.from[0].Decide(&s, c.used, 8)
			for _, rl := range c.from[1:] {
				rl.Peek(&s, c.used) // converts a copy only
				rl.Refund(&s, c.used, 1)
				rl.Decide(&s, c.used, 1) // converted, then back to 8 units
			}
			before := s
			if p := c.to.Peek(&s, c.at); p != c.want || s != before {
				t.Fatalf("peek: %+v, want %+v (state changed: %v)", p, c.want, s != before)
			}
			want := c.want
			if d := c.to.Decide(&s, c.at, 1); d.Allowed != want.Allowed || d.Limit != want.Limit || d.Allowed && d.Remaining != want.Remaining-1 {
				t.Fatalf("decision: %+v after the peek %+v", d, want)
			}
		})
	}
}

// TestQuotaCarryIntoALongerPeriod: today's count, carried into a month, is still counted
// after today: the month does not start again at midnight.
func TestQuotaCarryIntoALongerPeriod(t *testing.T) {
	day, month := mustQuota(t, 10, limiter.PeriodDay, time.UTC), mustQuota(t, 10, limiter.PeriodMonth, time.UTC)
	var s limiter.State
	day.Decide(&s, utc(2026, 1, 15, 12, 0), 8)
	month.Decide(&s, utc(2026, 1, 15, 13, 0), 1)
	for _, at := range []time.Time{utc(2026, 1, 16, 0, 0), utc(2026, 1, 31, 23, 0)} {
		if d := month.Peek(&s, at); d.Remaining != 1 {
			t.Fatalf("at %v: %+v, want 1 remaining", at, d)
		}
	}
	if d := month.Peek(&s, utc(2026, 2, 1, 0, 0)); d.Remaining != 10 {
		t.Fatalf("the next month: %+v, want 10 remaining", d)
	}
}

func TestQuotaStacks(t *testing.T) {
	q := mustQuota(t, 2, limiter.PeriodMonth, time.UTC)
	st, err := limiter.NewStack([]string{"burst", "monthly"}, []limiter.RateLimiter{mustTB(t, 5, 1, time.Second), q})
	if err != nil {
		t.Fatal(err)
	}
	if st.Limiter(1) != q {
		t.Fatalf("the stack's limit is %v", st.Limiter(1))
	}
	at := utc(2026, 12, 2, 10, 0)
	var s limiter.State
	q.Decide(&s, at, 1)
	want := limiter.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: utc(2027, 1, 1, 0, 0).Sub(at)}
	if d := limiter.UnchargedDecision(q, &s, at); d != want {
		t.Fatalf("uncharged decision %+v, want %+v", d, want)
	}
}

func TestQuotaDecideDoesNotAllocate(t *testing.T) {
	q := mustQuota(t, 1, limiter.PeriodDay, mustZone(t, "Europe/Berlin"))
	var s limiter.State
	at := utc(2026, 1, 1, 0, 0)
	allocs := testing.AllocsPerRun(100, func() {
		at = at.Add(25 * time.Hour) // a new period each time
		if d := q.Decide(&s, at, 1); !d.Allowed {
			t.Fatal(d)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations a decision", allocs)
	}
}

// BenchmarkQuotaDecide decides within a period (a comparison) and in a new period each time
// (its end computed in the zone).
func BenchmarkQuotaDecide(b *testing.B) {
	for _, c := range []struct {
		name string
		step time.Duration
	}{{"InPeriod", time.Microsecond}, {"Rollover", 25 * time.Hour}} {
		b.Run(c.name, func(b *testing.B) {
			q := mustQuota(b, limiter.MaxQuotaLimit, limiter.PeriodDay, mustZone(b, "America/New_York"))
			var s limiter.State
			at := utc(2026, 1, 1, 0, 0)
			b.ReportAllocs()
			for b.Loop() {
				at = at.Add(c.step)
				q.Decide(&s, at, 1)
			}
		})
	}
}
