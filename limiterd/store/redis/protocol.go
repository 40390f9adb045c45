package redis

// The protocol between the Go code and the scripts: the position of each argument (ARGV) and
// reply element, and the values that tell replies and modes apart. Go indices here are 0-based
// (a slice); Lua's are 1-based. Each script opens with a block of locals that mirrors the
// constants below (Lua name = Go constant + 1 for an index, the same text or number for a
// value); TestScriptsMirrorProtocol fails when the two drift.

// mode says whether a script decides (and writes), only peeks (reads), or refunds (writes).
type mode string

// The modes: ARGV's MODE_DECIDE, MODE_PEEK and MODE_REFUND.
const (
	modeDecide mode = "d"
	modePeek   mode = "p"
	modeRefund mode = "r"
)

// tokenbucket.lua's arguments (ARG_*).
const (
	tbArgMode        = iota // mode
	tbArgFingerprint        // fingerprint of the strategy
	tbArgNowS               // now, seconds; "": the server's clock (TIME)
	tbArgNowN               // now, nanoseconds of the second
	tbArgRate               // the refill rate
	tbArgTauS               // tau, a full refill: seconds,
	tbArgTauN               // nanoseconds,
	tbArgTauF               // and fraction (of 1/rate ns)
	tbArgCostS              // the cost's (or refund's) interval: seconds ("": the cost exceeds the capacity),
	tbArgCostN              // nanoseconds,
	tbArgCostF              // and fraction
	tbArgSlackMS            // milliseconds added to the key's expiry
	tbArgs                  // the number of arguments
)

// tokenbucket.lua's reply (REPLY_*): the outcome, the instant decided at, and the state the
// decision was made on, from which Go derives the Decision with the in-memory code.
const (
	tbReplyOutcome = iota        // tbRejected, tbAdmitted or tbConvert
	tbReplyNowS                  // the instant decided at: seconds,
	tbReplyNowN                  // and nanoseconds
	tbReplyState                 // tbStateFresh, tbStateTAT or tbStateRaw: what follows
	tbReplyTATS                  // tbStateTAT: the theoretical arrival time, seconds,
	tbReplyTATN                  // nanoseconds,
	tbReplyTATF                  // and fraction
	tbReplyRaw     = tbReplyTATS // tbStateRaw: the state as stored
)

// Values of the token bucket's reply (OUTCOME_* and STATE_*).
const (
	tbRejected = 0 // not admitted (always, when peeking)
	tbAdmitted = 1 // admitted, and the new state written
	tbConvert  = 2 // another strategy wrote the state (raw): Go converts it and writes it with cas.lua
	tbRefunded = 3 // refunded: the refund written (or nothing to refund); the state is the one before it

	tbStateFresh = 0 // no state: the reply ends here
	tbStateTAT   = 1 // tbReplyTATS, tbReplyTATN, tbReplyTATF follow
	tbStateRaw   = 2 // tbReplyRaw follows
)

// slidingwindow.lua's arguments (ARG_*).
const (
	swArgMode        = iota // mode
	swArgFingerprint        // fingerprint of the strategy
	swArgNowS               // now, seconds; "": the server's clock (TIME)
	swArgNowN               // now, nanoseconds of the second
	swArgLimit              // the limit
	swArgWindow             // the window, nanoseconds
	swArgCost               // the cost
	swArgSlackMS            // milliseconds added to the key's expiry
	swArgRebase             // past it, the log is rewritten relative to its oldest entry
	swArgs                  // the number of arguments
)

// slidingwindow.lua's reply (REPLY_*): the whole decision.
const (
	swReplyAdmitted   = iota // swAdmitted or swRejected
	swReplyRemaining         // units left
	swReplyResetAfter        // ns until the window is empty
	swReplyRetryAfter        // ns until the cost fits (when rejected)
	swReplyLen               // the number of elements
)

// Values of the sliding window's REPLY_ADMITTED.
const (
	swRejected = 0
	swAdmitted = 1
)

// cas.lua's arguments (ARG_*) and replies.
const (
	casArgRead  = iota // the state read
	casArgWrite        // the state to write; "": delete it
	casArgTTLMS        // its expiry in milliseconds
	casArgs            // the number of arguments

	casChanged = 0 // the state changed since it was read: nothing written
	casWritten = 1 // written
)

// stack.lua's algorithms (ALGORITHM_*), arguments (ARG_*, then a block of stLimit* arguments a
// limit, L_* in Lua: its index in the block, 1-based) and reply (REPLY_*, then a block of
// stReply* elements a limit, R_* in Lua).
const (
	stTokenBucket   = "tb"
	stSlidingWindow = "sw"
)

const (
	stArgMode    = iota // mode
	stArgNowS           // now, seconds; "": the server's clock (TIME)
	stArgNowN           // now, nanoseconds of the second
	stArgCost           // the cost (a peek's: 1; a refund's amount)
	stArgSlackMS        // milliseconds added to a key's expiry
	stArgRebase         // a sliding window's rebase threshold
	stArgLimits         // the number of limits
	stArgs              // the number of arguments before the limits' blocks
)

// A limit's block of stack.lua's arguments.
const (
	stLimitAlgorithm   = iota // stTokenBucket or stSlidingWindow
	stLimitFingerprint        // fingerprint of the strategy
	stLimitRate               // token bucket: the refill rate
	stLimitTauS               // token bucket: tau, a full refill: seconds,
	stLimitTauN               // nanoseconds,
	stLimitTauF               // and fraction
	stLimitCostS              // token bucket: the cost's (refund's) interval: seconds ("": above the capacity),
	stLimitCostN              // nanoseconds,
	stLimitCostF              // and fraction
	stLimitLimit              // sliding window: the limit
	stLimitWindow             // sliding window: the window, nanoseconds
	stLimitConvertFrom        // token bucket: the state Go converted ("": none)
	stLimitConvertS           // the converted TAT: seconds ("": fresh),
	stLimitConvertN           // nanoseconds,
	stLimitConvertF           // and fraction
	stLimitArgs               // the number of arguments a limit
)

// stack.lua's reply: the outcome, the instant decided at, then a block a limit.
const (
	stReplyOutcome = iota // stRejected, stAdmitted, stConvert, stRefunded or stPeeked
	stReplyNowS           // the instant decided at: seconds,
	stReplyNowN           // and nanoseconds
	stReplyLimits         // the first limit's block

	// A token bucket's block: the state decided on (tbState*), as tokenbucket.lua answers it.
	stReplyState = 0
	stReplyTATS  = 1
	stReplyTATN  = 2
	stReplyTATF  = 3
	stReplyRaw   = stReplyTATS
	// A sliding window's block: its decision (swAdmitted or swRejected: on its own).
	stReplyAdmitted   = 0
	stReplyRemaining  = 1
	stReplyResetAfter = 2
	stReplyRetryAfter = 3
	stLimitReply      = 4 // the number of elements a limit
)

// Values of stack.lua's REPLY_OUTCOME: the token bucket's (tbRejected, tbAdmitted, tbConvert,
// tbRefunded), and a peek's.
const stPeeked = 4
