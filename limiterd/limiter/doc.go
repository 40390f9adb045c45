// Package limiter is limiterd's rate-limit core: strategies that decide whether a client's
// request gets through, and a store that keeps each client's state.
//
// A strategy (RateLimiter) is an immutable value built from one tier's parameters. It holds no
// per-client state: it reads and updates a client's State, which a store keeps. Time is always a
// parameter, so a decision is a pure function of (parameters, state, now, cost) and tests use
// fixed instants instead of sleeping.
//
// # Strategies
//
//   - TokenBucket: a bucket of capacity tokens that starts full; refillRate tokens per
//     refillPeriod accrue continuously. It is implemented as GCRA (generic cell rate algorithm):
//     the state is one theoretical arrival time held exactly in integers (nanoseconds plus a
//     fraction in units of 1/refillRate ns), so a billion decisions accumulate no rounding drift.
//   - SlidingWindow: a hard cap; in any half-open interval [t, t+window) at most limit units are
//     admitted. The state is a log of admitted instants (16 bytes an entry; requests admitted at
//     the same nanosecond share an entry), so a client's memory is at most 16*limit bytes plus a
//     64-byte header, and is released once its window is empty.
//   - Quota: at most limit units per calendar period (day, ISO week, month, year) of a time
//     zone; the count restarts at 0 when a period starts. A period starts at the first instant
//     the zone's clock shows its first date: local midnight, or the end of a daylight saving
//     gap that skips it. The state is the period's end and the count (no allocation); a
//     period's end is computed when a request is first admitted in it.
//   - Concurrency: at most limit places of a client in flight at once. An admission takes its
//     cost in places, held by a lease until the lease is released (Store.Refund with
//     OpRelease, once per lease), extended (OpExtend) or its leaseTimeout passes, so that a
//     crashed caller holds nothing for ever. The state is the leases' expiries, places and
//     seqs (24 bytes a lease, at most limit live ones; limit is at most MaxConcurrencyLimit).
//   - Unlimited: admits everything and keeps no state.
//
// A cost above a strategy's capacity (limit) can never be admitted: it is rejected and consumes
// nothing.
//
// # Clocks that jump
//
// Time never moves back for a client's state: an admission at an instant earlier than the
// client's latest admission is counted as made at that latest admission's instant, never
// earlier, so a clock stepped back (by seconds or hours) or jumping forward admits, on the clock
// of the client's latest admission, no more than the limit allows: a token bucket's debt is
// measured from its theoretical arrival time, and one more than a full refill ahead of now is
// taken as an empty bucket; a sliding window decides at its newest entry's instant and drops an
// entry no earlier than the entries before it; a quota keeps counting in its stored period,
// however far back the clock steps. A state that has decayed to fresh and is dropped (swept,
// expired in Redis, reset) is a client never seen: after a step back larger than the time the
// state took to decay, the client is decided afresh on the clock as it shows. A forward jump
// leaves a client's state ahead of the clock that comes back: it is rejected until the clock
// catches up (a token bucket at most a full refill, a sliding window at most a window, a quota
// until the stored period's end). limitertest.RunClockJumps holds the rule in both stores.
// Memory decides an instant past LatestInstant (2258) or before EarliestInstant (1681) at that
// bound (ClampInstant), where Unix nanoseconds and the instants a state holds ahead of now
// still fit an int64; limitertest.RunFarInstants holds it.
//
// # Stacks
//
// A Stack is a tier's several limits (a burst bucket and a daily window, say), decided all or
// nothing: a request is admitted only if every limit admits it, and then consumes its cost from
// each; when one rejects it, no limit is charged. A store decides a stack in one atomic step per
// client (Memory: under one shard lock, undoing what the limits that admitted changed; Redis:
// one script over every limit's key). A peek reads every limit, a refund returns the units to
// every limit, each clamped to its own limit. Combine makes the stack's answer of its limits':
// the binding limit's quota (the one closest to exhaustion, or of a rejection the one that
// must wait longest) and, of a rejection, the wait until every limit admits the cost.
//
// A limit's state is kept per client and limit name; the limit named DefaultLimitName shares the
// state of the client's single-limit form. The rule for parameter changes below applies per
// limit name.
//
// # Peeks and refunds
//
// Peek answers what a one-unit decision would, changing nothing. Refund returns units to a
// client's allowance, exactly and clamped so that the allowance never exceeds its limit: a token
// bucket's theoretical arrival time moves back by the refunded tokens' refill time, never before
// now; a sliding window forgets its newest admitted units still inside the window first (units
// that left the window cannot come back); a quota's count goes down, never below 0 (units used
// in a period that has ended cannot come back). A store applies a refund atomically with the
// client's decisions. A refund is not idempotent: it refunds again each time it is called.
//
// # Parameter changes
//
// Strategies are interned: while one is in use, building a strategy from equal parameters
// returns it. A client's state references (stamps) the strategy that last wrote it, which stays
// in use as long as the state does; a strategy nothing references any more is freed by the
// garbage collector. When a policy is swapped, nothing is rewritten; the next decision for a
// client converts its state lazily (O(1)):
//
//   - same strategy (parameters unchanged): the state is kept as it is;
//   - otherwise a conversion never gives usage back. Same algorithm, new parameters: a token
//     bucket keeps its debt exactly (the tokens used, fractions included, unclamped: a debt
//     beyond the new capacity waits longer; capped at MaxRefillWindow); a sliding window keeps
//     every admission still inside the new window, beyond the new limit too; a quota, see
//     below. Another algorithm: the units in use (a bucket's used tokens rounded up, a window's
//     units inside it, a quota's count) are charged to the new algorithm at the conversion.
//
// The rule bounds a client while replicas serve different versions of a policy, and across a
// limit's flap: the used amount rises only by admissions and falls only by the refill or
// expiry of the version holding the state, and each version admits only within its own limit,
// so whatever the sequence of versions, a client gets in any interval at most the largest limit
// plus what the versions release in it: for versions of one algorithm and one window (token
// buckets: the largest capacity at the fastest rate), the more generous version's allowance.
// Sliding windows of different windows hold the bound over the shorter window only: the
// shorter one forgets admissions the longer one would count.
//
// A quota's count, unclamped, carries into the new parameters' current period
// (the one holding now), and lasts until the earlier of the stored period's end and that
// period's end: a change never extends the count past either, and a raised limit gives the
// difference at once, while a lowered one can leave the client rejected until the period
// ends. One exception: when the stored period started within the new current period (a day
// changed into a month, a week into a year), every unit it counts was used in the new period
// too, and the count lasts until the new period's end, rather than starting again at the
// stored day's end in the middle of the month. A count whose period has ended is dropped.
// A change of zone moves the boundaries; the same rule applies.
package limiter
