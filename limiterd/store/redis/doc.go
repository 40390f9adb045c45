// Package redis keeps limiterd's client state in Redis, so that every limiterd replica decides
// on the same state: a client gets its limit once in total, not once per replica.
//
// A Client connects to one Redis server, to a Redis Cluster, or to the master that Redis
// Sentinels name (see Sentinel); Client.Store returns the
// limiter.Store of one policy. Each decision is one server-side Lua script on one key (on the
// keys of one client for a stacked tier: see Stacks), so
// concurrent decisions on a client, from any replica, are serialised by Redis exactly as the
// memory store serialises them, and answer exactly what limiter.Memory answers (the conformance
// table in package limitertest runs against both).
//
// # Exactness
//
// Lua numbers in Redis are doubles, exact only below 2^53, while Unix nanoseconds (~1.8e18) and
// products such as cost*period/rate are far above that. So:
//
//   - Go precomputes every product and quotient a decision needs (a token bucket's full refill
//     and the interval of the cost, as exact quotient and remainder) and passes them as
//     arguments; the scripts only add, subtract and compare.
//   - A token bucket's theoretical arrival time (TAT) is three small integers: seconds,
//     nanoseconds and a fraction in units of 1/refillRate ns. The script decides admission on
//     them, then returns the TAT it decided on; Go replays the decision on that state with the
//     code of limiter.TokenBucket, which gives Remaining, ResetAfter and RetryAfter (and must
//     agree on admission, which is checked).
//   - A refund runs in the same script as the client's decisions (MODE_REFUND), so it is
//     serialised with them: a token bucket's script moves the TAT back by the refund's interval
//     (precomputed by Go, at most a full refill), never before now, and Go replays the refund on
//     the TAT read with limiter.TokenBucket.Refund; a sliding window's script pops the newest
//     units from the tail of its log and answers as a peek.
//   - A sliding window's instants are nanoseconds since a per-client epoch (whole seconds), and
//     its running totals count from a per-client base; both are rewritten relative to the oldest
//     entry before they could reach 2^52. Every duration it computes is at most a window (24h).
//   - A quota's period is a calendar period of a time zone, which Lua cannot compute: Go passes
//     the bounds (Unix seconds) of limiter.Quota's period that holds the instant it expects the
//     decision at. The state is the end of the counted period and its count, so a decision
//     within that period is a comparison and an addition; a decision that starts a period uses
//     the bounds passed only if its now lies within them. On the server's clock it may not (the
//     replica's clock across a boundary from the server's): the script then answers
//     OUTCOME_PERIOD with its now, and Go computes the bounds there and calls again. Go replays
//     the decision on the count read with limiter.Quota, as for a token bucket.
//
// # Parameter changes
//
// A state records the fingerprint of the strategy that wrote it: its algorithm and exact
// parameters ("tb:<capacity>:<rate>:<period ns>", "sw:<limit>:<window ns>"), the same on every
// replica, unlike the process-local stamps of package limiter. The rule of package limiter
// applies, a conversion never gives usage back: same fingerprint, the state is kept; same
// algorithm with new parameters, the usage carries over unclamped; another algorithm, the units
// in use are charged to the new one. A sliding window converts another window's log inside its
// script (every entry still in the new window stays). Every other conversion needs products of
// the old and new parameters, so the script hands the state to Go: a token bucket's TAT as
// stored (under a token bucket's key, Go carries its debt; under a sliding window's, Go counts
// its used tokens, limiter.UsedUnits, charged as one entry at the instant read), or a sliding
// window's log under a token bucket's key, identified by its header and newest entry, with the
// units it holds in its own window (Go charges their refill time, TokenBucket.Charged). Go
// converts with limiter's code at the instant the script read, and calls the script again with
// the conversion, which it uses only if the state is still the one read (a second round trip,
// once per client after a change; if the state changed meanwhile, the decision starts over). A
// rejected decision writes no conversion, and a refund refunds nothing on another algorithm's
// state (it answers as a peek), as in memory.
//
// # Stacks
//
// Every decision runs one script: the library of the algorithms (algorithms.lua) and the entry
// script (decide.lua), joined by Go with each protocol name replaced by its value from
// protocol.go (script.go); a call runs the library sections it may need only (its algorithms';
// conversions and refunds only when it carries one), since Redis makes every function of a
// script anew on each call; a decision on one token bucket returns before the script makes any
// function but the token bucket's decision (script.go). A single limit is decided as the stack of its one limit,
// named "default". A stacked tier's limits are decided over one key per limit:
// LimitKey, the client's key followed by ':' and the limit's name (the limit named "default"
// uses the client's key itself, the state of a tier of one limit). The keys share the client's
// hash tag, so they live on one cluster slot and one script may touch them all, atomically. Each
// limit's state is the one its algorithm keeps alone, with its own fingerprint and expiry, so the
// rule for parameter changes applies per limit name. The script first reads every limit and
// decides on it, then writes every new state if every limit admitted the cost, and nothing
// otherwise: a rejected request charges no limit, whichever replicas race on the client, and
// writes nothing, for one limit as for several (no conversion, no expired entry dropped, no
// other algorithm's state deleted: those are written by the next admission). A token bucket
// whose state other parameters wrote is converted by Go: the script answers the raw state and
// writes nothing, Go converts it at the instant read and calls the script again with the
// conversion, which it uses only if the state is still the one read. A peek writes nothing; a
// refund returns the units to every limit in the same script. In a batch, each request is one
// EVALSHA of the pipeline.
//
// # Clock
//
// With ServerClock (production) the scripts read Redis TIME: every replica decides on the clock
// of the Redis server that holds the client, so skewed hosts agree. The now argument of Decide
// and Peek is then ignored. CallerClock uses it instead, so that tests can run the conformance
// table at fixed instants; in production it needs synchronised clocks (set ExpirySlack to at
// least their skew).
//
// # Keys and memory
//
// A client's state is one key, limiterd:{<policy ID>\x00<client key>}, in which '%', '{', '}'
// and NUL are percent-escaped, so that the hash tag (the braces) is the whole pair: a client's
// key hashes to one cluster slot, and clients spread evenly over slots. Each write sets the
// key's expiry (PEXPIRE) to the time until the state is fresh again (bucket full, window
// empty) plus ExpirySlack, so idle clients cost nothing.
//
//   - Token bucket: a string "<fingerprint> <s> <ns> <frac>", about 100 bytes a client with
//     Redis's key overhead.
//   - Sliding window: a list [head, epoch, base, at_1, cum_1, ..., at_n, cum_n], one
//     pair of integers for each distinct admitted instant still in the window (at most limit
//     of them, and after an admission up to 2 that left it: it drops them once 3 have); the
//     head is the fingerprint, which from 6 entries on carries the newest entry too, so that a
//     decision reads the log in one command and drops entries in two more (see Versions): about 14 bytes an entry in Redis's packed lists, plus about 150 bytes a client (32 more for a head that carries the newest entry);
//     at most about 1.4 MB for a client at the maximum limit of 100000 with each unit admitted
//     at a distinct nanosecond.
//   - Quota: a string "<fingerprint> <end> <used>", the end of the counted period in Unix
//     seconds and the units used in it, expiring at the period's end (plus the slack): about
//     100 bytes a client.
//   - Concurrency: a sorted set of leases, one member a lease, "<ns> <seq> <places>" scored by
//     the second of its expiry (so ordered by its exact expiry), expiring with the latest lease
//     (plus the slack): at most limit live leases, and the expired ones that the next write
//     drops, each a member of about 20 bytes and its score. Beside it, the client's lease
//     counter (its key and "#lease"), whose INCR names each lease (limiter.Decision.Lease): no
//     two leases of a client share a seq, whichever replica took them, so a release or an
//     extension through any replica names one lease. A reset leaves the counter. The script
//     computes a concurrency limit's decision itself (every duration is at most a lease
//     timeout, 24h, exact in a double) and answers it as a sliding window's, with the lease's
//     seq at the end of its reply.
//
// The state of one client is bounded: its keys are the prefix, the escaped policy ID and
// client key (each byte escaped to at most 3: at most 3 KiB for a 1,024-byte client key) and
// ":<limit>" for a stacked limit, one key per limit (at most 4); its value is a token bucket's
// 100 bytes or a sliding window's log above, per limit; and it expires once it is fresh again,
// after at most the longest refill or window of the policy (a token bucket refilling slowly
// can hold a client for up to a year). The number of clients is the callers' to choose, so
// only Redis can bound the whole: run it with maxmemory and maxmemory-policy volatile-ttl
// (every key limiterd writes has an expiry; volatile-ttl evicts the state closest to being
// fresh again, whose loss gives its client back least; an evicted refund record lets its
// reservation refund once more, at most its cost; an evicted reset mark, written by Reset with
// the expiry of the longest-lived state it deleted, lets the reservations issued before the
// reset refund, each at most its cost, as if there had been no reset). Under noeviction a full Redis refuses
// every decision's write and the failure modes decide for everyone; TestEvictionKeepsDeciding
// runs limiterd on a full Redis under volatile-ttl.
//
// # Versions
//
// Replicas of two releases decide on one Redis during a rolling upgrade, so a release reads
// every state the previous one writes, and writes only states the previous one decides on
// exactly. The previous release's scripts are kept as testdata, and TestReleasesMixMatchesMemory
// runs the random comparisons with memory with each call made by either release. A sliding
// window's head that carries the newest entry ("sw:<at_n><cum_n><limit>:<window>", the two in 16
// digits) reads, to the release before it, as the fingerprint of other parameters of the same
// window: it keeps every entry still in the window, as for its own fingerprint, and each of its
// writes puts its own fingerprint back in the head; it reads the window from the head when it
// converts the log for a token bucket or a quota.
//
// # Failures
//
// Every call is bounded by Options.Timeout and returns an error when Redis does not answer in
// time; the engine then applies the policy's failure mode. The client reconnects by itself.
//
// No caller chooses the failure mode, nor when the circuit breaker opens. The work of one call
// to Redis is bounded: a batch goes in pieces of work at most 128 (a request weighs its limits
// times 1 + its key's bytes/256; less under a Timeout below 25.6 ms), each within a Timeout of
// its own, so that a piece of the costliest requests (4-limit stacks on 1,024-byte keys, 150-500
// µs of Redis time each on a loaded shared machine) takes a small part of it, and a batch's size
// never makes a piece time out. Nor does Redis losing its scripts (a restart, a failover, SCRIPT
// FLUSH): reloading them is the store's own housekeeping and never decides admission. A piece
// whose requests get NOSCRIPT loads the scripts once and sends those requests again in one
// pipeline, within a Timeout of their own; only if that fails do they fail, with Redis's error.
// The breaker counts only Redis's health: lost connections, error
// replies, and failed health checks. A call that timed out does not count by itself; it starts
// a health check (a trivial script within Timeout, at most one at a time, on the node of the
// key that timed out), and only a failed check counts. A batch waits for that check after a
// timed-out piece and sends the rest only if Redis answered it. After BreakerFailures failures
// in a row the breaker opens: calls fail at once with ErrBreakerOpen for BreakerBackoff (100 ms
// by default), then the next call starts a health check; success closes the breaker, failure
// doubles the backoff (at most 8 times). Once Redis answers again, the failure modes stop
// deciding within the current backoff and one check: at most 8 × BreakerBackoff + Timeout (850
// ms by default; TestBreakerRecovery measures it: 0.5 s after a pause, 3.6 s with the former 1
// s backoff doubling to 8 s).
//
// # Sentinel
//
// With Options.Sentinel.MasterName set, Options.Addrs are Sentinels: the Client asks them for the
// master, and sends every call to it alone (Nodes() of the underlying client is the master, so
// Ping, the scripts' preload and the memory check address it). It follows the Sentinels'
// +switch-master messages, and asks them again every 5 s in case one was missed. A failover
// closes the connection to the old master: calls fail until the new master is followed (the
// breaker opens, the failure modes decide), the reset subscription is made again on the new
// master (caches are emptied and trusted again once it is), and followMaster loads the scripts
// there, as Redis does not replicate its script cache. TestSentinelFailover kills the master of
// one replica and 3 Sentinels (quorum 2, down after 1 s) under load: decisions were served by the
// new master 2.4-3.6 s after the kill, every decision meanwhile failed within the Timeout (most
// at once, by the open breaker) and went to the failure mode, and counts were exact again right
// after. test/redis TestSentinelFailoverFailureModes does the same through limiterd, with a
// policy per failure mode: served again 2.3 s after the kill, meanwhile Open admitted, Closed
// rejected and Local decided in process every decision, none taking over 22 ms.
//
// A failover can lose writes. Replication is asynchronous: a decision's write acknowledged by the
// old master but not yet replicated is lost with it, and the client it charged is admitted again
// up to what was lost (the replication lag's worth of decisions; a lost refund record lets its
// reservation refund once more, at most its cost; a lost reset mark or reset undoes the reset).
// A master cut off from the Sentinels keeps taking the writes of the replicas that still reach it
// until it is demoted, all lost; min-replicas-to-write on the servers makes it refuse them
// instead. With ServerClock the new master's clock takes over: a skew between the Redis hosts
// shifts every client's refill by as much.
//
// Rejections can be cached in process (Options.RejectCache): a client over its limit is then
// answered without a round trip until its retry time, for a stacked tier as for a tier of one
// limit. The cache only ever rejects, and only until the instant the rejection named, before
// which the shared state could not have admitted the same cost either, so it never admits more
// than the limits. An entry holds for the same cost and the same limits (strategies under the
// same names), until the first retry time of the limits that rejected (each limit's cached
// decision, aged, is then still what Redis would answer of it); a peek is never answered from
// it, and a refund forgets the client on every replica, as a reset does.
//
// Only a reset can make the shared state admit sooner, so a reset must reach every replica's
// cache. Reset deletes the state and publishes the client on ResetChannel in one script, and
// every Client with a cache subscribes to it and drops the rejection it names. Pub/Sub loses
// messages while a subscriber is disconnected, so a cache answers only while its Client is
// subscribed: when the subscription is lost nothing cached is trusted, and once it is back every
// cache is emptied first. A rejection decided before a reset but returned after its message is
// not cached either (an epoch, see cacheTrust). So a cached rejection outlives a reset only for
// the time the message takes to arrive, or the time a broken connection takes to be noticed.
package redis
