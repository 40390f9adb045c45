package limiter

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// CalendarPeriod is the calendar unit a Quota counts over.
type CalendarPeriod uint8

// The calendar periods. The zero value is none, so that a period left unset is an error
// rather than a day.
const (
	// PeriodDay is a day, from one local midnight to the next.
	PeriodDay CalendarPeriod = iota + 1
	// PeriodWeek is an ISO 8601 week, from Monday's local midnight to the next Monday's.
	PeriodWeek
	// PeriodMonth is a calendar month, from the local midnight starting its 1st to the next
	// month's.
	PeriodMonth
	// PeriodYear is a calendar year, from the local midnight starting January 1st to the next
	// year's.
	PeriodYear
)

// String returns the period's API name.
func (p CalendarPeriod) String() string {
	switch p {
	case PeriodDay:
		return "Day"
	case PeriodWeek:
		return "Week"
	case PeriodMonth:
		return "Month"
	case PeriodYear:
		return "Year"
	}
	return "CalendarPeriod(" + strconv.Itoa(int(p)) + ")"
}

// Quota admits at most Limit units per calendar period (day, ISO week, month or year) of a
// time zone: "100,000 requests a month, reset on the 1st". Unlike a sliding window of 30 days,
// the whole allowance comes back at once, at the start of each period. A request of cost n is
// admitted if the units admitted in the current period plus n are at most the limit.
//
// # Periods
//
// A period starts at the first instant at which the zone's clock shows its first date (or a
// later one), and ends where the next period starts. That is local midnight (where midnight
// happens twice, as Havana's does when it falls back from 01:00 to 00:00, the first); so a day
// lasts 23 or 25 hours across a one-hour daylight saving change, and a month or year as long
// as its days. Where a change of offset skips midnight (America/Santiago and America/Havana
// move their clocks from 00:00 to 01:00 in spring), the day starts at the change, at 01:00,
// and the day before ends there. The periods partition time: each instant lies in exactly
// one, and none is empty; a date the zone skips altogether (Pacific/Apia skipped 30 December
// 2011) starts no period. (time.Date is not used for boundaries: for a skipped midnight it may
// answer an instant before the skip, in the previous day, which would end that day before
// some of its instants.)
//
// # State
//
// A client's state is two integers in State's token-bucket fields (no allocation): the
// instant at which the counted period ends, Unix ns, and the units used in it (at most
// MaxQuotaLimit, which fits 32 bits). A decision compares now with that end; the end of a new
// period is computed only when a decision admits a request in it (a few time zone lookups), so
// a decision within a period is a comparison and an addition.
//
// A clock that steps backwards keeps counting in the stored period, however far back it
// steps: no more than the limit is admitted in a period, and the durations answered are then
// longer than a period.
//
// A Quota is immutable and safe for concurrent use; build one with NewQuota.
type Quota struct {
	stamp
	limit  int64
	period CalendarPeriod
	loc    *time.Location
}

type quotaParams struct {
	limit  int64
	period CalendarPeriod
	zone   string // the Location's name
}

// NewQuota returns the quota strategy for the given parameters. It fails if limit is outside
// [1, MaxQuotaLimit], period is not one of the CalendarPeriod constants, or loc is nil (pass
// time.UTC for UTC).
//
// Quotas are interned by limit, period and the zone's name (loc.String()): two Locations of
// one name are taken as one zone, and while a quota of those parameters is in use, NewQuota
// returns it, with the Location it was first built with. Zones are the tz database's (see
// time.LoadLocation; a binary without the system's database must embed time/tzdata), whose
// UTC offsets are all below 16 hours; a zone must have offsets below 48 hours in magnitude
// (time.FixedZone allows more; the periods' boundaries assume it).
func NewQuota(limit int64, period CalendarPeriod, loc *time.Location) (*Quota, error) {
	if err := checkPositive("limit", limit, MaxQuotaLimit); err != nil {
		return nil, err
	}
	switch period {
	case PeriodDay, PeriodWeek, PeriodMonth, PeriodYear:
	default:
		return nil, fmt.Errorf("period must be Day, Week, Month or Year, got %v", period)
	}
	if loc == nil {
		return nil, errors.New("a quota's time zone must not be nil (time.UTC for UTC)")
	}
	return intern(quotaParams{limit, period, loc.String()}, func(id uint64) *Quota {
		q := &Quota{limit: limit, period: period, loc: loc}
		q.stamp = stamp{rl: q, id: id}
		return q
	}), nil
}

// Params returns the parameters the quota was built from.
func (q *Quota) Params() (limit int64, period CalendarPeriod, loc *time.Location) {
	return q.limit, q.period, q.loc
}

// PeriodStart returns the start of the period that contains t, in the quota's zone: at or
// before t.
func (q *Quota) PeriodStart(t time.Time) time.Time {
	start, _ := q.bounds(t.Unix())
	return time.Unix(start, 0).In(q.loc)
}

// PeriodEnd returns the end of the period that contains t, in the quota's zone: after t, and
// the start of the next period (PeriodStart(PeriodEnd(t)) == PeriodEnd(t)).
func (q *Quota) PeriodEnd(t time.Time) time.Time {
	_, end := q.bounds(t.Unix())
	return time.Unix(end, 0).In(q.loc)
}

// maxZoneOffset bounds the magnitude of a zone's UTC offset, in seconds, for boundary: the tz
// database's are below 16 hours.
const maxZoneOffset = 48 * 60 * 60

// bounds returns the start and the end, Unix seconds, of the period that contains the instant
// sec (Unix seconds): start <= sec < end.
func (q *Quota) bounds(sec int64) (start, end int64) {
	y, m, d := time.Unix(sec, 0).In(q.loc).Date()
	y, m, d = q.first(y, m, d)
	// The period of sec's local date starts at or before sec (sec shows a date in it); it is
	// the period of sec unless the zone's clock stepped back across a period's first midnight,
	// and sec shows a date before that of an earlier instant: sec then lies in a later period.
	start = boundary(y, m, d, q.loc)
	for {
		ny, nm, nd := q.next(y, m, d)
		end = boundary(ny, nm, nd, q.loc)
		if end > sec {
			return start, end
		}
		y, m, d, start = ny, nm, nd, end
	}
}

// first returns the first date of the period that contains the date y-m-d.
func (q *Quota) first(y int, m time.Month, d int) (int, time.Month, int) {
	switch q.period {
	case PeriodDay:
	case PeriodWeek: // back to Monday (time.Weekday counts from Sunday)
		wd := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Weekday()
		return civil(y, m, d-(int(wd)+6)%7)
	case PeriodMonth:
		return y, m, 1
	case PeriodYear:
		return y, time.January, 1
	}
	return y, m, d
}

// next returns the first date of the period after the one that starts on the date y-m-d.
func (q *Quota) next(y int, m time.Month, d int) (int, time.Month, int) {
	switch q.period {
	case PeriodDay:
	case PeriodWeek:
		return civil(y, m, d+7)
	case PeriodMonth:
		return civil(y, m+1, 1)
	case PeriodYear:
		return y + 1, time.January, 1
	}
	return civil(y, m, d+1)
}

// civil normalises a date as time.Date does (the 32nd of January is the 1st of February).
func civil(y int, m time.Month, d int) (int, time.Month, int) {
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Date()
}

// boundary returns the first instant, Unix seconds, at which loc's clock shows the date y-m-d
// or a later one. Such instants t are those with t + offset(t) >= the date's midnight on a
// clock at UTC: it scans the zone's intervals of one offset forward from maxZoneOffset before
// that midnight (every earlier instant shows an earlier date), and answers the first instant
// of the first interval that holds one: where the interval's clock shows midnight, or its
// start when its clock shows a later time there (a skipped midnight). The scan crosses the
// zone changes of a few days, usually none or one; offsets and changes are whole seconds.
func boundary(y int, m time.Month, d int, loc *time.Location) int64 {
	midnight := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix()
	at := midnight - maxZoneOffset
	for {
		t := time.Unix(at, 0).In(loc)
		_, offset := t.Zone()
		if at+int64(offset) >= midnight {
			return at
		}
		shows := midnight - int64(offset) // when this interval's clock shows midnight
		_, bound := t.ZoneBounds()
		if bound.IsZero() { // the offset never changes again
			return shows
		}
		end := bound.Unix()
		if end <= at {
			// Past its table of changes (after 2037), a zone's changes follow a rule, and
			// ZoneBounds answers the end of the UTC year for an interval that lasts beyond
			// it, but 365 days after the year's start: on 31 December of a leap year, an end
			// before the instant (golang/go#81583, Go 1.26). The interval lasts to the
			// year's true end.
			end = time.Date(t.UTC().Year()+1, time.January, 1, 0, 0, 0, 0, time.UTC).Unix()
		}
		if shows < end {
			return shows
		}
		at = end
	}
}

// periodEnd returns the end, Unix ns, of the period that contains now.
func (q *Quota) periodEnd(now time.Time) int64 {
	_, end := q.bounds(now.Unix())
	return end * int64(time.Second)
}

// count returns the end of the period counted in s (Unix ns) and the units used in it, for a
// decision at now, a state q wrote or a fresh one; open is false when s counts no period that
// holds now (a fresh state, or one whose period has ended): then no unit is used, and the end
// is not known until computed.
func count(s *State, now int64) (end, used int64, open bool) {
	if s.stamp == nil || now >= s.tat {
		return 0, 0, false
	}
	return s.tat, int64(s.frac), true
}

// Decide implements RateLimiter.
func (q *Quota) Decide(s *State, now time.Time, cost int64) Decision {
	t := now.UnixNano()
	adopt(&q.stamp, s, t)
	end, used, open := count(s, t)
	if cost > q.limit-used { // used+cost > limit, without overflowing for any cost
		return q.decision(t, end, used, cost)
	}
	if !open {
		end = q.periodEnd(now)
	}
	used += cost
	s.stamp, s.tat, s.frac = &q.stamp, end, uint32(used)
	return Decision{Allowed: true, Limit: q.limit, Remaining: q.limit - used, ResetAfter: time.Duration(end - t)}
}

// decision describes the count of a period that ends at end (Unix ns), with used units used,
// for a decision of cost units at t (Unix ns) and whether it is admitted: cost is, if it fits.
func (q *Quota) decision(t, end, used, cost int64) Decision {
	d := Decision{Allowed: cost <= q.limit-used, Limit: q.limit, Remaining: max(0, q.limit-used)}
	if used > 0 {
		d.ResetAfter = time.Duration(end - t)
	}
	if !d.Allowed && cost <= q.limit {
		d.RetryAfter = time.Duration(end - t) // the next period admits it
	}
	return d
}

// Peek implements RateLimiter.
func (q *Quota) Peek(s *State, now time.Time) Decision {
	t := now.UnixNano()
	c := *s
	adopt(&q.stamp, &c, t)
	end, used, _ := count(&c, t)
	return q.decision(t, end, used, 1)
}

// Refund implements RateLimiter: the current period's count goes down by amount, never below 0.
// A period that has ended has nothing to refund: the units used in it do not carry into the
// next one.
func (q *Quota) Refund(s *State, now time.Time, amount int64) Decision {
	t := now.UnixNano()
	adopt(&q.stamp, s, t)
	if _, used, open := count(s, t); open {
		s.frac = uint32(used - min(used, amount))
	}
	return q.Peek(s, now)
}

// Fresh implements RateLimiter: no unit is used in a period that holds now.
func (q *Quota) Fresh(s *State, now time.Time) bool {
	_, used, _ := count(s, now.UnixNano())
	return used == 0
}

// carryFrom converts a state written by another quota, from (see the package documentation):
// its count, unclamped (a count above q's limit keeps the client rejected), carries into q's period that holds now, until the end of that
// period when the stored period is one of from's periods that started within it (a day into
// its month: every unit counted was used in q's period), else until the earlier of the stored
// end and the end of q's period (the count may hold units used before q's period started, as a
// month's does in a day: they are not counted beyond the stored period). A count whose period
// has ended, or that counts nothing, is dropped.
func (q *Quota) carryFrom(from *Quota, s *State, now int64) {
	end, used, open := count(s, now)
	if !open || used == 0 {
		*s = State{}
		return
	}
	start, qEnd := q.bounds(floorSeconds(now))
	// The stored period is one of from's if its end is one of from's boundaries: a count
	// carried before may end elsewhere, and then holds units used before its period.
	fromStart, fromEnd := from.bounds(floorSeconds(end - 1))
	carried := qEnd * int64(time.Second)
	if fromEnd*int64(time.Second) != end || fromStart < start {
		carried = min(carried, end)
	}
	*s = State{stamp: &q.stamp, tat: carried, frac: uint32(used)} // unclamped: never gives usage back
}

// usedUnits returns the count of the period that holds now (another algorithm carries it over).
func (q *Quota) usedUnits(s *State, now int64) int64 {
	_, used, _ := count(s, now)
	return used
}

// chargeUnits sets s to a count of u units (at most MaxQuotaLimit) in q's period that holds now:
// another algorithm's usage carried over.
func (q *Quota) chargeUnits(s *State, now, u int64) {
	*s = State{}
	if u > 0 {
		*s = State{stamp: &q.stamp, tat: q.periodEnd(time.Unix(0, now)), frac: uint32(min(u, MaxQuotaLimit))}
	}
}

// floorSeconds returns the Unix second that holds the instant ns (Unix ns).
func floorSeconds(ns int64) int64 {
	sec := ns / int64(time.Second)
	if ns%int64(time.Second) < 0 {
		sec--
	}
	return sec
}

// Algorithm implements RateLimiter.
func (q *Quota) Algorithm() Algorithm { return AlgorithmQuota }

// Limit implements RateLimiter.
func (q *Quota) Limit() int64 { return q.limit }

// Window implements RateLimiter: the longest the period lasts on a clock without offset
// changes: 24 hours for a day, 7 days for a week, 31 days for a month, 366 days for a year. A
// client that paces itself at Limit units per Window does not run out before its period ends
// (unless the period is lengthened by an offset change, at most by the change).
func (q *Quota) Window() time.Duration {
	const day = 24 * time.Hour
	switch q.period {
	case PeriodDay:
	case PeriodWeek:
		return 7 * day
	case PeriodMonth:
		return 31 * day
	case PeriodYear:
		return 366 * day
	}
	return day
}
