package limiter

import (
	"math"
	"time"
)

// The instants a store decides at. A strategy works in Unix nanoseconds (int64: 1677-09-21 to
// 2262-04-11), and a state holds instants ahead of the decision's (a token bucket's TAT, up to
// a full refill and a carried debt of MaxRefillWindow more; a quota's period end, up to a year
// and a day) or behind it. A clock that jumps near or past either end would wrap now.UnixNano()
// or overflow those instants, and a limit would admit everything or nothing; so a store decides
// an instant past LatestInstant at LatestInstant, and one before EarliestInstant at
// EarliestInstant: time stands still there, and no more than the limit is admitted.
var (
	LatestInstant   = time.Unix(0, math.MaxInt64-instantMargin).UTC()
	EarliestInstant = time.Unix(0, math.MinInt64+instantMargin).UTC()
)

// instantMargin keeps every instant a state derives from a decision's within int64 ns: four
// times MaxRefillWindow (about four years), above the two a token bucket's TAT may lie ahead
// and a quota's period of a year.
const instantMargin = 4 * int64(MaxRefillWindow)

// ClampInstant returns now within [EarliestInstant, LatestInstant]: the instant a store decides
// a request made at now.
func ClampInstant(now time.Time) time.Time {
	if !inSeconds(now) {
		switch {
		case now.After(LatestInstant):
			return LatestInstant
		case now.Before(EarliestInstant):
			return EarliestInstant
		}
	}
	return now
}

// inSeconds reports whether now lies strictly between the seconds of EarliestInstant and
// LatestInstant, where ClampInstant returns it as it is: one read of now's seconds. The
// decisions' paths call it, inlined, before ClampInstant (a call, and two Time comparisons at
// the bounds' own seconds), which otherwise cost every decision about 18 instructions (3 ns).
func inSeconds(now time.Time) bool {
	s := now.Unix()
	return s < latestSecond && s > earliestSecond
}

// The seconds of LatestInstant and EarliestInstant (Time.Unix rounds down), for inSeconds:
// constants, which a comparison takes as immediates. TestInstantSeconds holds them to the
// instants.
const (
	latestSecond   = (math.MaxInt64 - instantMargin) / int64(time.Second)
	earliestSecond = (math.MinInt64+instantMargin)/int64(time.Second) - 1 // not a whole second: rounded toward zero, less one
)
