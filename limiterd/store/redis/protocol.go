package redis

import (
	"strconv"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// The protocol between the Go code and the decision script (decide.lua with algorithms.lua): the
// position of each argument (ARGV) and reply element, and the values that tell modes,
// algorithms and replies apart. Go indices here are 0-based (a slice); Lua's are 1-based. The
// script names them, and joinScripts writes each name's value in its place (protocolNames), so
// the script holds no copy of them; TestScriptUsesOnlyProtocolNames checks that it names no other
// constant.

// mode says whether a script decides (and writes), only peeks (reads), or refunds (writes).
type mode string

// The modes: ARGV's MODE_*.
const (
	// modeDecide decides a stack all or nothing: rejected, it writes nothing, not even a
	// conversion or the deletion of another algorithm's state (as limiter.Memory.Decide).
	modeDecide mode = "d"
	modePeek   mode = "p"
	modeRefund mode = "r"
	// modeRelease ends the lease named by the cost argument on the stack's concurrency limits,
	// and modeExtend moves it to a lease timeout from now under a new seq: in the once script
	// only, which passes the lease's instant (limiter.OpRelease, limiter.OpExtend).
	modeRelease mode = "l"
	modeExtend  mode = "x"
)

// The algorithms of a limit's block (ALGORITHM_*).
const (
	algTokenBucket   = "tb"
	algSlidingWindow = "sw"
	algQuota         = "qt"
	algConcurrency   = "cc"
)

// The script's arguments (ARG_*), before the limits' blocks.
const (
	argMode    = iota // mode
	argNowS           // now, seconds; "": the server's clock (TIME)
	argNowN           // now, nanoseconds of the second
	argCost           // the cost (a peek's: 1; a refund's amount)
	argSlackMS        // milliseconds added to a key's expiry
	argRebase         // a sliding window's rebase threshold
	args              // the number of arguments before the limits' blocks
)

// The start of every limit's block (L_*).
const (
	limitAlgorithm   = iota // algTokenBucket or algSlidingWindow
	limitFingerprint        // fingerprint of the strategy
	limitParams             // the first of the algorithm's own arguments
)

// A token bucket's block (TB_*).
const (
	tbRate  = limitParams + iota // the refill rate
	tbTauS                       // tau, a full refill: seconds,
	tbTauN                       // nanoseconds,
	tbTauF                       // and fraction (of 1/rate ns)
	tbCostS                      // the cost's (refund's) interval: seconds ("": above the capacity),
	tbCostN                      // nanoseconds,
	tbCostF                      // and fraction
	tbArgs                       // the number of arguments of the block
)

// A sliding window's block (SW_*).
const (
	swLimit  = limitParams + iota // the limit
	swWindow                      // the window, nanoseconds
	swArgs                        // the number of arguments of the block
)

// A quota's block (QT_*). Go computes the period's bounds, in the quota's time zone, at the
// instant it expects the decision at (the caller's now, or the server's that a reply answered:
// outcomePeriod); the script counts in them only when its now lies within them.
const (
	qtLimit = limitParams + iota // the limit
	qtStart                      // the start of the period of the expected instant, Unix seconds
	qtEnd                        // and its end
	qtArgs                       // the number of arguments of the block
)

// A concurrency limit's block of arguments.
const (
	ccLimit   = limitParams + iota // the places
	ccTimeout                      // the lease timeout, nanoseconds
	ccArgs                         // the number of arguments of the block
)

// leaseSuffix follows a client's key (Store.key) in the Redis key of its lease counter, the last
// key of a call on a stack with a concurrency limit: on the client's slot, no limit's key (a
// limit's name has no '#'), no refund's record and not the reset mark. A reset leaves it (no
// lease's seq is taken twice), and it expires when the longest lease it named would.
const leaseSuffix = "#lease"

// A conversion's block (C_*), after the limits' blocks: a limit's state that other parameters
// or another algorithm wrote, converted by Go (a conversion never gives usage back).
const (
	convertLimit = iota // the limit, 1-based
	convertFrom         // the state read, as the script answered it (replyRaw)
	convertS            // a token bucket's converted TAT: seconds ("": fresh),
	convertN            // nanoseconds,
	convertF            // and fraction
	convertArgs         // the number of arguments of the block

	// A sliding window's conversion, of a token bucket's state: its used tokens charged as one
	// entry at the instant the script read them (convertS, convertN: seconds, nanoseconds).
	convertUnits = convertF
	// A quota's conversion: its count carried or charged (convertS: the end of its period, Unix
	// seconds, "": fresh; convertN: the units used in it).
	convertEnd  = convertS
	convertUsed = convertN
)

// The script's reply: the outcome, the instant decided at, then a block a limit.
const (
	replyOutcome = iota // outcomeRejected, outcomeAdmitted, outcomeConvert, outcomeRefunded or outcomePeeked
	replyNowS           // the instant decided at: seconds,
	replyNowN           // and nanoseconds
	replyLimits         // the first limit's block

	// A token bucket's block: the state decided on (state*).
	replyState = 0
	replyTATS  = 1 // stateTAT, stateCharged: the theoretical arrival time, seconds,
	replyTATN  = 2 // nanoseconds,
	replyTATF  = 3 // and fraction
	replyRaw   = 1 // stateRaw, stateUsed: the state as stored (stateUsed: a sliding window's log, identified)
	replyUsed  = 2 // stateUsed: the units the log holds in its own window at the instant decided at
	// A quota's block: as a token bucket's, its state decided on a count (stateTAT,
	// stateCharged) of replyQuotaUsed units in the period that ends at replyQuotaEnd.
	replyQuotaEnd  = 1 // Unix seconds
	replyQuotaUsed = 2
	// A sliding window's block: its decision (swAdmitted or swRejected: on its own), or with
	// outcomeConvert, stateRaw and at replyRaw a token bucket's state for Go to convert.
	replyAdmitted   = 0
	replyRemaining  = 1
	replyResetAfter = 2
	replyRetryAfter = 3
	limitReply      = 4 // the number of elements a limit
)

// Values of the reply (OUTCOME_*, STATE_*, and a sliding window's REJECTED and ADMITTED).
const (
	outcomeRejected = 0 // not admitted: nothing charged
	outcomeAdmitted = 1 // admitted, and every new state written
	outcomeConvert  = 2 // other parameters or algorithms wrote limits' states (raw): Go converts them, and calls again
	outcomeRefunded = 3 // refunded; a token bucket's state is the one before the refund
	outcomePeeked   = 4 // peeked
	outcomePeriod   = 5 // a quota needs its period's bounds at the instant answered: Go computes them, and calls again
	outcomeReleased = 6 // a lease released or extended (modeRelease, modeExtend), then peeked

	stateFresh   = 0 // no state
	stateTAT     = 1 // replyTATS, replyTATN, replyTATF
	stateRaw     = 2 // replyRaw
	stateUsed    = 3 // replyRaw, replyUsed: a sliding window's log under a token bucket's key
	stateCharged = 4 // as stateTAT, converted from another algorithm's state: nothing to refund

	swRejected = 0
	swAdmitted = 1
)

// protocolNames returns the protocol's names as the script uses them, each with the Lua literal
// joinScripts writes in its place: an index as Lua's (the Go constant + 1), a count or value as
// it is, a string quoted.
func protocolNames() map[string]string {
	names := map[string]string{}
	index := func(name string, i int) { names[name] = strconv.Itoa(i + 1) }
	value := func(name string, v int) { names[name] = strconv.Itoa(v) }
	text := func(name, s string) { names[name] = strconv.Quote(s) }
	text("MODE_DECIDE", string(modeDecide))
	text("MODE_PEEK", string(modePeek))
	text("MODE_REFUND", string(modeRefund))
	text("MODE_RELEASE", string(modeRelease))
	text("MODE_EXTEND", string(modeExtend))
	text("ALGORITHM_CONCURRENCY", algConcurrency)
	text("LEASE_SUFFIX", leaseSuffix)
	text("ALGORITHM_TOKEN_BUCKET", algTokenBucket)
	text("ALGORITHM_SLIDING_WINDOW", algSlidingWindow)
	text("ALGORITHM_QUOTA", algQuota)
	value("MAX_LIMITS", limiter.MaxStack)
	index("ARG_MODE", argMode)
	index("ARG_NOW_S", argNowS)
	index("ARG_NOW_N", argNowN)
	index("ARG_COST", argCost)
	index("ARG_SLACK_MS", argSlackMS)
	index("ARG_REBASE", argRebase)
	value("ARGS", args)
	index("L_ALGORITHM", limitAlgorithm)
	index("L_FINGERPRINT", limitFingerprint)
	index("TB_RATE", tbRate)
	index("TB_TAU_S", tbTauS)
	index("TB_TAU_N", tbTauN)
	index("TB_TAU_F", tbTauF)
	index("TB_COST_S", tbCostS)
	index("TB_COST_N", tbCostN)
	index("TB_COST_F", tbCostF)
	value("TB_ARGS", tbArgs)
	index("SW_LIMIT", swLimit)
	index("SW_WINDOW", swWindow)
	value("SW_ARGS", swArgs)
	index("QT_LIMIT", qtLimit)
	index("QT_START", qtStart)
	index("QT_END", qtEnd)
	value("QT_ARGS", qtArgs)
	index("CC_LIMIT", ccLimit)
	index("CC_TIMEOUT", ccTimeout)
	value("CC_ARGS", ccArgs)
	index("C_LIMIT", convertLimit)
	index("C_FROM", convertFrom)
	index("C_S", convertS)
	index("C_N", convertN)
	index("C_F", convertF)
	index("C_UNITS", convertUnits)
	index("C_END", convertEnd)
	index("C_USED", convertUsed)
	value("CONVERT_ARGS", convertArgs)
	index("REPLY_OUTCOME", replyOutcome)
	index("REPLY_NOW_S", replyNowS)
	index("REPLY_NOW_N", replyNowN)
	index("REPLY_LIMITS", replyLimits)
	index("R_STATE", replyState)
	index("R_TAT_S", replyTATS)
	index("R_TAT_N", replyTATN)
	index("R_TAT_F", replyTATF)
	index("R_RAW", replyRaw)
	index("R_USED", replyUsed)
	index("R_QT_END", replyQuotaEnd)
	index("R_QT_USED", replyQuotaUsed)
	index("R_ADMITTED", replyAdmitted)
	index("R_REMAINING", replyRemaining)
	index("R_RESET_AFTER", replyResetAfter)
	index("R_RETRY_AFTER", replyRetryAfter)
	value("LIMIT_REPLY", limitReply)
	value("OUTCOME_REJECTED", outcomeRejected)
	value("OUTCOME_ADMITTED", outcomeAdmitted)
	value("OUTCOME_CONVERT", outcomeConvert)
	value("OUTCOME_REFUNDED", outcomeRefunded)
	value("OUTCOME_PEEKED", outcomePeeked)
	value("OUTCOME_PERIOD", outcomePeriod)
	value("OUTCOME_RELEASED", outcomeReleased)
	value("STATE_FRESH", stateFresh)
	value("STATE_TAT", stateTAT)
	value("STATE_RAW", stateRaw)
	value("STATE_USED", stateUsed)
	value("STATE_CHARGED", stateCharged)
	value("REJECTED", swRejected)
	value("ADMITTED", swAdmitted)
	// The ends of the instants decided at (limiter.ClampInstant), for the server's clock.
	latestS, latestN := split(limiter.LatestInstant.UnixNano())
	earliestS, earliestN := split(limiter.EarliestInstant.UnixNano())
	value("LATEST_S", int(latestS))
	value("LATEST_N", int(latestN))
	value("EARLIEST_S", int(earliestS))
	value("EARLIEST_N", int(earliestN))
	return names
}
