package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The OpenAPI and CEL markers below repeat the bounds of limits.go as literals (markers cannot
// refer to Go constants); TestCRDMatchesLimits checks the generated CRD against the constants.
// Every rule here is also checked by Validate, which is what limiterd's file mode relies on.
//
// CEL notes:
//   - The full-refill rule on TokenBucket computes floor(capacity*period/refillRate) in
//     nanoseconds exactly and without overflowing 64 bits: with K = 1e9 it compares
//     capacity*period with (366d+1ns)*refillRate as (high, low) pairs in base K, where
//     capacity*period = (capacity*(period/K) + capacity*(period%K)/K)*K + capacity*(period%K)%K
//     and (366d+1ns)*refillRate = (refillRate*31622400 + refillRate/K)*K + refillRate%K.
//     It is skipped when a bound it relies on does not hold: another rule reports that.
//   - The uniqueness of clients and prefixes across overrides uses distinct(), whose cost is
//     quadratic; the rules on the total number of entries (512 each) keep it within the
//     per-expression runtime cost limit (1e6), and the uniqueness rules skip themselves when
//     the total is exceeded.

// Algorithm names how a tier decides. It is configuration: changing it needs no code change.
// +kubebuilder:validation:Enum=TokenBucket;SlidingWindow;Quota;Concurrency;Unlimited
type Algorithm string

const (
	// AlgorithmTokenBucket admits bursts up to a capacity and refills continuously.
	AlgorithmTokenBucket Algorithm = "TokenBucket"
	// AlgorithmSlidingWindow admits at most a limit of requests in any interval of one window.
	AlgorithmSlidingWindow Algorithm = "SlidingWindow"
	// AlgorithmQuota admits at most a limit of requests per calendar day, week, month or year
	// of a time zone, and gives the whole allowance back when the next one starts.
	AlgorithmQuota Algorithm = "Quota"
	// AlgorithmConcurrency admits at most a limit of requests of a client in flight at once:
	// each admitted request holds its places until it is released or its lease times out.
	AlgorithmConcurrency Algorithm = "Concurrency"
	// AlgorithmUnlimited admits every request and keeps no state.
	AlgorithmUnlimited Algorithm = "Unlimited"
)

// FailureMode says how limiterd decides when its shared store cannot be reached.
// +kubebuilder:validation:Enum=Open;Closed;Local
type FailureMode string

const (
	// FailureModeOpen admits every request while the store is unreachable.
	FailureModeOpen FailureMode = "Open"
	// FailureModeClosed rejects every request while the store is unreachable.
	FailureModeClosed FailureMode = "Closed"
	// FailureModeLocal decides from this replica's in-memory state while the store is unreachable.
	FailureModeLocal FailureMode = "Local"
)

// TierNames says whether the answers to clients name the client's tier.
// +kubebuilder:validation:Enum=Shown;Hidden
type TierNames string

const (
	// TierNamesShown names the tier in the answers to clients.
	TierNamesShown TierNames = "Shown"
	// TierNamesHidden names every tier HiddenTierName in the answers to clients.
	TierNamesHidden TierNames = "Hidden"
)

// Refunds says whether clients of a policy may take back what an admitted request charged.
// +kubebuilder:validation:Enum=Disabled;Enabled
type Refunds string

const (
	// RefundsDisabled refuses every refund, and admitted answers carry no reservation.
	RefundsDisabled Refunds = "Disabled"
	// RefundsEnabled gives every admitted answer of a cost above 0 a reservation, which one
	// refund may name once, while the units it charged still count.
	RefundsEnabled Refunds = "Enabled"
)

// TokenBucket configures a token bucket: it starts full with capacity tokens, a request takes
// cost tokens, and refillRate tokens per refillPeriod accrue continuously (fractions count),
// never above capacity. A full refill, capacity*refillPeriod/refillRate, takes at most 366 days.
// +kubebuilder:validation:XValidation:rule="!(self.capacity >= 1 && self.capacity <= 1000000000 && self.refillRate >= 1 && self.refillRate <= 1000000000 && int(duration(self.?refillPeriod.orValue('1s'))) >= 1000000 && int(duration(self.?refillPeriod.orValue('1s'))) <= 86400000000000) || self.capacity * (int(duration(self.?refillPeriod.orValue('1s'))) / 1000000000) + self.capacity * (int(duration(self.?refillPeriod.orValue('1s'))) % 1000000000) / 1000000000 < self.refillRate * 31622400 + self.refillRate / 1000000000 || (self.capacity * (int(duration(self.?refillPeriod.orValue('1s'))) / 1000000000) + self.capacity * (int(duration(self.?refillPeriod.orValue('1s'))) % 1000000000) / 1000000000 == self.refillRate * 31622400 + self.refillRate / 1000000000 && self.capacity * (int(duration(self.?refillPeriod.orValue('1s'))) % 1000000000) % 1000000000 < self.refillRate % 1000000000)",message="a full refill (capacity*refillPeriod/refillRate) must take at most 366 days (8784h)"
type TokenBucket struct {
	// capacity is the most tokens the bucket holds: the largest burst a client can make.
	// Between 1 and 1000000000.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Capacity int64 `json:"capacity"`

	// refillRate is how many tokens accrue per refillPeriod. Between 1 and 1000000000.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	RefillRate int64 `json:"refillRate"`

	// refillPeriod is the period over which refillRate tokens accrue, as a Go duration
	// ("1s", "1m", "1h", "1.5s", "100ms"). It defaults to 1s and lies between 1ms and 24h.
	// +optional
	// +kubebuilder:default="1s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1ms') && duration(self) <= duration('24h')",message="must be between 1ms and 24h"
	RefillPeriod *metav1.Duration `json:"refillPeriod,omitempty"`
}

// SlidingWindow configures a sliding window: a hard cap by which, in any interval of length
// window, at most limit requests (counted by cost) are admitted.
type SlidingWindow struct {
	// limit is the most requests admitted in any interval of length window; between 1 and 100000.
	// A client's state holds one entry per admitted instant in the window, so limit bounds
	// its memory (16 bytes an entry).
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	Limit int64 `json:"limit"`

	// window is the length of the sliding interval, as a Go duration ("1s", "1m", "1h");
	// between 1ms and 24h.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1ms') && duration(self) <= duration('24h')",message="must be between 1ms and 24h"
	Window metav1.Duration `json:"window"`
}

// CalendarPeriod is the calendar unit a quota counts over.
// +kubebuilder:validation:Enum=Day;Week;Month;Year
type CalendarPeriod string

const (
	// CalendarPeriodDay is a day, from one local midnight to the next.
	CalendarPeriodDay CalendarPeriod = "Day"
	// CalendarPeriodWeek is an ISO 8601 week, from Monday's local midnight to the next Monday's.
	CalendarPeriodWeek CalendarPeriod = "Week"
	// CalendarPeriodMonth is a calendar month, from the local midnight that starts its 1st to
	// the next month's.
	CalendarPeriodMonth CalendarPeriod = "Month"
	// CalendarPeriodYear is a calendar year, from the local midnight that starts January 1st to
	// the next year's.
	CalendarPeriodYear CalendarPeriod = "Year"
)

// Quota configures a calendar quota: at most limit requests (counted by cost) are admitted per
// calendar period (day, week, month or year) of a time zone, and the whole allowance comes back
// at once when the next period starts ("100000 a month, reset on the 1st"). Unlike a sliding
// window of 30 days, a client's state is two integers whatever the limit. When a tier's quota
// changes (limit, period or time zone), each client's count, at most the new limit, carries into
// the new current period until the earlier of the old and the new period's ends.
type Quota struct {
	// limit is the most requests (counted by cost) admitted in one period; between 1 and
	// 1000000000.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Limit int64 `json:"limit"`

	// period is the calendar period the limit counts over, in timeZone: Day (from one local
	// midnight to the next, so 23 or 25 hours across a daylight saving change), Week (an ISO
	// 8601 week, from Monday's midnight), Month (from the midnight that starts the 1st) or Year
	// (from the midnight that starts January 1st). Where a change of the zone's offset skips
	// midnight, the period starts when the clock resumes (at 01:00, say). The answers'
	// RateLimit-Policy field gives as the window (w) the longest the period lasts: 86400 s for a
	// Day, 604800 for a Week, 2678400 (31 days) for a Month, 31622400 (366 days) for a Year;
	// RateLimit's t and Retry-After count to the end of the current period.
	// +required
	Period CalendarPeriod `json:"period"`

	// timeZone is the name in the IANA time zone database (tzdata) of the zone whose local
	// midnights start the periods, such as "Europe/Berlin", "America/New_York" or "Etc/GMT-3";
	// default "UTC". At most 64 characters: '/'-separated parts of ASCII letters, digits, '_',
	// '-' and '+', each starting with a letter; "Local" (a host's own zone) is refused. The API
	// server looks a new or changed name up in its own copy of the database (a CEL rule converts
	// a time into the zone: the system's database, else the one built into kube-apiserver) and
	// refuses a zone it does not know, naming it ("unknown time zone Mars/Olympus_Mons"); a name
	// stored before is not looked up again on update. The operator and limiterd look the name up
	// again in their copy (the system's, else the one built into them), which may be older than
	// the API server's: a policy whose zone they do not know is kept out of service and reported
	// (the policy's Ready condition, reason Invalid; or Enforced, reason RejectedByReplica),
	// while the policy's last good version keeps serving.
	// +optional
	// +kubebuilder:default="UTC"
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z][A-Za-z0-9_+-]*)*$`
	// +kubebuilder:validation:XValidation:rule="self != 'Local'",message="must name a zone of the tz database, not Local (a host's own zone)"
	// +kubebuilder:validation:XValidation:rule="(oldSelf.hasValue() && oldSelf.value() == self) || timestamp('2000-01-01T00:00:00Z').getHours(self) >= 0",message="must name a zone of the API server's tz database (names are case-sensitive, such as Europe/Berlin)",optionalOldSelf=true
	TimeZone string `json:"timeZone,omitempty"`
}

// Concurrency configures a concurrency limit: at most limit places of a client are held at
// once, a request admitted at cost n taking n places (one, at the default cost). A rate says
// how often, a concurrency limit how many at a time: it protects a slow backend (a model
// server, a report generator, a database) from one client. Each admitted request holds its
// places by a lease, which ends when the caller releases it or, if it does not, leaseTimeout
// after the lease was issued (or last extended by its holder), so that a caller that crashed
// holds no place for ever. The policy sets leaseTimeout; a caller cannot choose it. A refund gives back rate units, never places: a concurrency limit's places
// come back by a release or a lease's expiry only.
//
// In the answers, a concurrency limit reports its places as the quota (RateLimit-Policy's q),
// its lease timeout as the window (w), the places free after the decision as RateLimit's r,
// and as RateLimit's t the time until the latest lease held expires (all of its places free
// without a release); a rejection's Retry-After is the time until enough leases expire, when
// nothing is released first.
type Concurrency struct {
	// limit is the most places of a client held at once; between 1 and 10000. A client's state
	// holds one entry per lease (24 bytes), so limit bounds its memory.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	Limit int64 `json:"limit"`

	// leaseTimeout is how long a lease holds its places when it is neither released nor
	// extended, as a Go duration ("30s", "5m", "1h"); between 1ms and 24h. Set it above the
	// longest a request of the protected backend takes: a lease that expires while its request
	// still runs frees its places to another request, and a crashed caller's places come back
	// leaseTimeout after its last lease was issued or extended.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1ms') && duration(self) <= duration('24h')",message="must be between 1ms and 24h"
	LeaseTimeout metav1.Duration `json:"leaseTimeout"`
}

// Limit is one limit of a stacked tier (Tier.limits): a name, an algorithm and its parameters,
// shaped like the single-limit fields of a tier.
// +kubebuilder:validation:XValidation:rule="self.algorithm != 'Unlimited'",message="a limit of a stack is TokenBucket, SlidingWindow, Quota or Concurrency: Unlimited would never reject",fieldPath=".algorithm"
// +kubebuilder:validation:XValidation:rule="self.algorithm != 'TokenBucket' || has(self.tokenBucket)",message="tokenBucket is required when algorithm is TokenBucket",fieldPath=".tokenBucket"
// +kubebuilder:validation:XValidation:rule="self.algorithm == 'TokenBucket' || !has(self.tokenBucket)",message="tokenBucket must be set only when algorithm is TokenBucket",fieldPath=".tokenBucket"
// +kubebuilder:validation:XValidation:rule="self.algorithm != 'SlidingWindow' || has(self.slidingWindow)",message="slidingWindow is required when algorithm is SlidingWindow",fieldPath=".slidingWindow"
// +kubebuilder:validation:XValidation:rule="self.algorithm == 'SlidingWindow' || !has(self.slidingWindow)",message="slidingWindow must be set only when algorithm is SlidingWindow",fieldPath=".slidingWindow"
// +kubebuilder:validation:XValidation:rule="self.algorithm != 'Quota' || has(self.quota)",message="quota is required when algorithm is Quota",fieldPath=".quota"
// +kubebuilder:validation:XValidation:rule="self.algorithm == 'Quota' || !has(self.quota)",message="quota must be set only when algorithm is Quota",fieldPath=".quota"
// +kubebuilder:validation:XValidation:rule="self.algorithm != 'Concurrency' || has(self.concurrency)",message="concurrency is required when algorithm is Concurrency",fieldPath=".concurrency"
// +kubebuilder:validation:XValidation:rule="self.algorithm == 'Concurrency' || !has(self.concurrency)",message="concurrency must be set only when algorithm is Concurrency",fieldPath=".concurrency"
type Limit struct {
	// name identifies the limit within its tier: a DNS label (lower-case letters, digits and
	// '-', at most 63 characters), unique among the tier's limits. A client's usage is kept per
	// limit name: when the policy changes, a limit of the same name keeps it (converted as for a
	// changed tier: the units in use are carried over, never given back, to the same or another
	// algorithm), and a limit of a new name starts fresh. The limit named "default"
	// shares its usage with the single-limit form of a tier, so that rewriting a tier's
	// algorithm as a limit named "default" among others keeps its clients' usage.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// algorithm is how the limit decides: TokenBucket, SlidingWindow, Quota or Concurrency.
	// Exactly the block matching it must be set (tokenBucket, slidingWindow, quota or
	// concurrency).
	// +required
	Algorithm Algorithm `json:"algorithm"`

	// tokenBucket holds the parameters of a TokenBucket limit.
	// +optional
	TokenBucket *TokenBucket `json:"tokenBucket,omitempty"`

	// slidingWindow holds the parameters of a SlidingWindow limit.
	// +optional
	SlidingWindow *SlidingWindow `json:"slidingWindow,omitempty"`

	// quota holds the parameters of a Quota limit: at most limit requests (counted by cost) per
	// calendar day, week, month or year of timeZone, the whole allowance coming back when the
	// next period starts. A change of its parameters keeps each client's count, at most the new
	// limit, until the earlier of the old and the new period's ends.
	// +optional
	Quota *Quota `json:"quota,omitempty"`

	// concurrency holds the parameters of a Concurrency limit: at most limit requests of a
	// client in flight at once, each holding its places until it is released or leaseTimeout
	// passes. Stacked with rate limits, the decision is all or nothing: a request a rate limit
	// rejects takes no place, and one the concurrency limit rejects charges no rate.
	// +optional
	Concurrency *Concurrency `json:"concurrency,omitempty"`
}

// Tier is a named way of deciding, shared by every client resolved to it: one limit (algorithm
// and its block) or a stack of limits (limits), never both.
// +kubebuilder:validation:XValidation:rule="has(self.algorithm) || has(self.limits)",message="a tier needs algorithm (one limit) or limits (a stack)",fieldPath=".algorithm"
// +kubebuilder:validation:XValidation:rule="!has(self.algorithm) || !has(self.limits)",message="a tier has either algorithm or limits, not both",fieldPath=".limits"
// +kubebuilder:validation:XValidation:rule="!has(self.algorithm) || self.algorithm != 'TokenBucket' || has(self.tokenBucket)",message="tokenBucket is required when algorithm is TokenBucket",fieldPath=".tokenBucket"
// +kubebuilder:validation:XValidation:rule="(has(self.algorithm) && self.algorithm == 'TokenBucket') || !has(self.tokenBucket)",message="tokenBucket must be set only when algorithm is TokenBucket",fieldPath=".tokenBucket"
// +kubebuilder:validation:XValidation:rule="!has(self.algorithm) || self.algorithm != 'SlidingWindow' || has(self.slidingWindow)",message="slidingWindow is required when algorithm is SlidingWindow",fieldPath=".slidingWindow"
// +kubebuilder:validation:XValidation:rule="(has(self.algorithm) && self.algorithm == 'SlidingWindow') || !has(self.slidingWindow)",message="slidingWindow must be set only when algorithm is SlidingWindow",fieldPath=".slidingWindow"
// +kubebuilder:validation:XValidation:rule="!has(self.algorithm) || self.algorithm != 'Quota' || has(self.quota)",message="quota is required when algorithm is Quota",fieldPath=".quota"
// +kubebuilder:validation:XValidation:rule="(has(self.algorithm) && self.algorithm == 'Quota') || !has(self.quota)",message="quota must be set only when algorithm is Quota",fieldPath=".quota"
// +kubebuilder:validation:XValidation:rule="!has(self.algorithm) || self.algorithm != 'Concurrency' || has(self.concurrency)",message="concurrency is required when algorithm is Concurrency",fieldPath=".concurrency"
// +kubebuilder:validation:XValidation:rule="(has(self.algorithm) && self.algorithm == 'Concurrency') || !has(self.concurrency)",message="concurrency must be set only when algorithm is Concurrency",fieldPath=".concurrency"
type Tier struct {
	// name identifies the tier within the policy: a DNS label (lower-case letters, digits and
	// '-', at most 63 characters), unique among the tiers.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// algorithm is how a tier of one limit decides: TokenBucket, SlidingWindow, Quota,
	// Concurrency or Unlimited. Exactly the block matching it must be set (tokenBucket,
	// slidingWindow, quota or concurrency; none for Unlimited). A tier sets either algorithm or
	// limits.
	// +optional
	Algorithm Algorithm `json:"algorithm,omitempty"`

	// tokenBucket holds the parameters of a TokenBucket tier.
	// +optional
	TokenBucket *TokenBucket `json:"tokenBucket,omitempty"`

	// slidingWindow holds the parameters of a SlidingWindow tier.
	// +optional
	SlidingWindow *SlidingWindow `json:"slidingWindow,omitempty"`

	// quota holds the parameters of a Quota tier: at most limit requests (counted by cost) per
	// calendar day, week, month or year of timeZone, the whole allowance coming back when the
	// next period starts. A change of its parameters keeps each client's count, at most the new
	// limit, until the earlier of the old and the new period's ends.
	// +optional
	Quota *Quota `json:"quota,omitempty"`

	// concurrency holds the parameters of a Concurrency tier: at most limit requests of a
	// client in flight at once, each holding its places until it is released or leaseTimeout
	// passes.
	// +optional
	Concurrency *Concurrency `json:"concurrency,omitempty"`

	// limits stacks 1 to 4 limits, each with its own name, algorithm and parameters, instead of
	// algorithm: for example a token bucket for bursts and a quota of 100000 a month, or 10
	// requests a second and 3 in flight (a Concurrency limit). A request is admitted only if every limit admits it, and then consumes its cost from each;
	// a request that any limit rejects consumes nothing from any. The answer's RateLimit field
	// reports the limit closest to exhaustion, RateLimit-Policy lists every limit, and the wait
	// a rejection names is until every limit admits the cost. A tier sets either algorithm or
	// limits.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=4
	Limits []Limit `json:"limits,omitempty"`

	// dryRun makes the tier a shadow: decisions are made and counted, but the answer is always
	// "allowed". Use it to try a limit before enforcing it.
	// +optional
	DryRun bool `json:"dryRun,omitempty"`
}

// Override sends chosen clients to a tier other than the default.
// A client key is matched exactly first, then by its longest matching prefix.
//
// An override gives its tier to whoever sends its key, so it must only ever see keys the caller
// cannot choose: name keys derived from a verified identity (a token's subject after the
// application checked it, an API key after it was validated, e.g. "sub:alice" as
// client/middleware's Source keys it) or a client address, never a raw header or any value a
// caller sends as it likes, and never a prefix a caller can extend with a suffix of its choice
// (a prefix is safe only when every key under it is issued by you).
// +kubebuilder:validation:XValidation:rule="(has(self.clients) && size(self.clients) > 0) || (has(self.clientPrefixes) && size(self.clientPrefixes) > 0)",message="must select at least one client or client prefix"
type Override struct {
	// tier is the name of the tier the selected clients use; it must name one of spec.tiers.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Tier string `json:"tier"`

	// clients lists exact client keys (each 1 to 1024 bytes, without control characters), at
	// most 256. A key appears at most once here and in at most one override; all overrides
	// together list at most 512 keys. List only keys the caller cannot choose (a verified
	// subject, an address), with the source the key carries ("sub:alice", "ip:192.0.2.7").
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:items:Pattern=`^[^\x00-\x1F\x7F-\x9F\x{FFFE}\x{FFFF}]*$`
	// +kubebuilder:validation:items:XValidation:rule="size(bytes(self)) <= 1024",message="must be at most 1024 bytes"
	Clients []string `json:"clients,omitempty"`

	// clientPrefixes lists prefixes of client keys (each 1 to 1024 bytes, without control
	// characters), at most 256. A prefix appears at most once here and in at most one override;
	// all overrides together list at most 512 prefixes. A key longer than 1024 bytes matches a
	// prefix when its first 1024 bytes do. List only prefixes under which every key is issued
	// by you (such as "sub:system:serviceaccount:shop:"): a caller who can extend a prefix with
	// a suffix of its choice gets its tier.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:items:Pattern=`^[^\x00-\x1F\x7F-\x9F\x{FFFE}\x{FFFF}]*$`
	// +kubebuilder:validation:items:XValidation:rule="size(bytes(self)) <= 1024",message="must be at most 1024 bytes"
	ClientPrefixes []string `json:"clientPrefixes,omitempty"`
}

// RateLimitPolicySpec is the desired behaviour of a policy.
// +kubebuilder:validation:XValidation:rule="self.tiers.exists(t, t.name == self.defaultTier)",message="must name a tier of spec.tiers",fieldPath=".defaultTier"
// +kubebuilder:validation:XValidation:rule="!has(self.overrides) || self.overrides.all(o, self.tiers.exists(t, t.name == o.tier))",message="every override's tier must name a tier of spec.tiers",fieldPath=".overrides"
// +kubebuilder:validation:XValidation:rule="!has(self.overrides) || self.overrides.map(o, o.?clients.orValue([])).flatten().size() <= 512",message="all overrides together may list at most 512 clients",fieldPath=".overrides"
// +kubebuilder:validation:XValidation:rule="!has(self.overrides) || self.overrides.map(o, o.?clientPrefixes.orValue([])).flatten().size() <= 512",message="all overrides together may list at most 512 clientPrefixes",fieldPath=".overrides"
// +kubebuilder:validation:XValidation:rule="!has(self.overrides) || self.overrides.map(o, o.?clients.orValue([])).flatten().size() > 512 || self.overrides.map(o, o.?clients.orValue([])).flatten().distinct().size() == self.overrides.map(o, o.?clients.orValue([])).flatten().size()",message="a client appears in more than one override",fieldPath=".overrides"
// +kubebuilder:validation:XValidation:rule="self.?refunds.orValue('Disabled') != 'Enabled' || !self.tiers.exists(t, has(t.slidingWindow) || (has(t.limits) && t.limits.exists(l, has(l.slidingWindow))))",message="refunds cannot be Enabled with a SlidingWindow tier or limit: a refund could not remove the charge from the window's log, which would free its units twice",fieldPath=".refunds"
// +kubebuilder:validation:XValidation:rule="self.?refunds.orValue('Disabled') != 'Enabled' || !self.tiers.exists(t, has(t.quota) || (has(t.limits) && t.limits.exists(l, has(l.quota))))",message="refunds cannot be Enabled with a Quota tier or limit: refunds of a quota's charges are not supported yet",fieldPath=".refunds"
// +kubebuilder:validation:XValidation:rule="self.?refunds.orValue('Disabled') != 'Enabled' || !self.tiers.exists(t, has(t.concurrency) || (has(t.limits) && t.limits.exists(l, has(l.concurrency))))",message="refunds cannot be Enabled with a Concurrency tier or limit: a refund is not a release, and a concurrency limit's places come back only when a lease is released or times out",fieldPath=".refunds"
// +kubebuilder:validation:XValidation:rule="!has(self.overrides) || self.overrides.map(o, o.?clientPrefixes.orValue([])).flatten().size() > 512 || self.overrides.map(o, o.?clientPrefixes.orValue([])).flatten().distinct().size() == self.overrides.map(o, o.?clientPrefixes.orValue([])).flatten().size()",message="a client prefix appears in more than one override",fieldPath=".overrides"
type RateLimitPolicySpec struct {
	// tiers are the ways of deciding that this policy offers; 1 to 64, with unique names.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	Tiers []Tier `json:"tiers"`

	// defaultTier is the tier of every client that no override names; it must name one of tiers.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	DefaultTier string `json:"defaultTier"`

	// overrides send chosen clients (exact keys or key prefixes) to other tiers; at most 64.
	// A client key or prefix appears in at most one override. Overrides must only see keys the
	// caller cannot choose (see Override).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Overrides []Override `json:"overrides,omitempty"`

	// failureMode says how limiterd decides when its shared store (Redis) cannot be reached:
	// Open admits, Closed rejects, Local decides from the replica's own memory. Default Open.
	// +optional
	// +kubebuilder:default=Open
	FailureMode FailureMode `json:"failureMode,omitempty"`

	// tierNames says whether the answers to clients name the client's tier: Shown (the
	// default) names it in the RateLimit-Policy and RateLimit header fields and in an Envoy
	// descriptor's current_limit; Hidden names every tier "limit" there instead (a limit of a
	// stacked tier "limit/<limit name>"), so that an end user cannot learn from its answers
	// which tier the keys it tries land in, nor the names of the tiers. The quota and window are
	// still shown. The admin API, logs and metrics keep the real names.
	// +optional
	// +kubebuilder:default=Shown
	TierNames TierNames `json:"tierNames,omitempty"`

	// refunds says whether a client may take back what an admitted request charged: Disabled
	// refuses every refund; Enabled gives the answer to every admitted request of a cost above 0
	// a reservation (an opaque token signed by limiterd), which one refund may name, once, to
	// return at most the units that request charged and that have not refilled since (a refund
	// never lets a client exceed a limit; for a stack the fewest over its limits), until they
	// all have: cost*refillPeriod/refillRate after the request, for a stack the shortest over
	// its limits. Enabled is refused for a policy with a SlidingWindow tier or limit (a refund
	// could not remove the charge from the window's log), a Quota tier or limit (not supported
	// yet) or a Concurrency tier or limit (a refund is not a release: a concurrency limit's
	// places come back when the request's lease is released or times out). Default Disabled.
	// +optional
	// +kubebuilder:default=Disabled
	Refunds Refunds `json:"refunds,omitempty"`

	// envoy says how limiterd's Envoy rate-limit service (gRPC
	// envoy.service.ratelimit.v3.RateLimitService, the domain naming this policy) turns a
	// request's descriptors into client keys of this policy.
	// +optional
	Envoy *Envoy `json:"envoy,omitempty"`

	// gateway makes the policy answer forward-auth requests of gateways (nginx auth_request,
	// Traefik ForwardAuth, Caddy forward_auth) at limiterd's /v1/forward-auth/<namespace>/<name>:
	// it says where a forwarded request's client key comes from, and what happens to a request
	// that yields none. A policy without it refuses forward-auth requests (409).
	// +optional
	Gateway *Gateway `json:"gateway,omitempty"`
}

// KeySourceType names where a forwarded request's client key comes from.
// +kubebuilder:validation:Enum=Header;ClientAddress;Host;Method;Path;JWTClaim
type KeySourceType string

const (
	// KeySourceHeader takes the value of a request header: the key "header:<name in lower
	// case>:<value>".
	KeySourceHeader KeySourceType = "Header"
	// KeySourceClientAddress takes the client's IP address from X-Forwarded-For, counting
	// trustedHops entries from the right, else the address of the peer that sent the request:
	// the key "ip:<address>" for IPv4, "ip:<network>/64" for IPv6 (a host picks the addresses
	// of its /64 at will), as client/middleware keys them.
	KeySourceClientAddress KeySourceType = "ClientAddress"
	// KeySourceHost takes the original request's host (X-Forwarded-Host; the check's own Host
	// under Envoy's HTTP ext_authz), in lower case: the key "host:<host>".
	KeySourceHost KeySourceType = "Host"
	// KeySourceMethod takes the original request's method (X-Forwarded-Method, else the
	// method of the forward-auth request; only the latter under Envoy's HTTP ext_authz): the key
	// "method:<method>".
	KeySourceMethod KeySourceType = "Method"
	// KeySourcePath takes the original request's path (X-Forwarded-Uri, else X-Original-URI;
	// under Envoy's HTTP ext_authz the path after the policy's name), without its query, or its
	// first pathSegments segments: the key "path:<path>".
	KeySourcePath KeySourceType = "Path"
	// KeySourceJWTClaim takes a claim of the JSON Web Token in a header (Authorization by
	// default, as "Bearer <token>"): the key "jwt:<header in lower case>:<claim>:<value>", the
	// claim's path as claim writes it ("org.id"), or as claimPath's names joined by '.' with
	// '%', '.' and ':' escaped (see claimPath).
	// limiterd reads the token's payload and never checks its signature: the gateway must
	// verify the token, and refuse or replace a client's own, before it asks limiterd.
	KeySourceJWTClaim KeySourceType = "JWTClaim"
)

// MissingKey says what happens to a forwarded request from which no key source yields a key.
// +kubebuilder:validation:Enum=Reject;Allow;Shared
type MissingKey string

const (
	// MissingKeyReject rejects the request, with the deny status and no Retry-After: no wait
	// admits it.
	MissingKeyReject MissingKey = "Reject"
	// MissingKeyAllow admits the request without deciding or charging anything.
	MissingKeyAllow MissingKey = "Allow"
	// MissingKeyShared decides the request for one key shared by every such request,
	// SharedGatewayKey ("anonymous"), which no key source yields and an override may name.
	MissingKeyShared MissingKey = "Shared"
)

// Gateway says how a request forwarded by a gateway (forward auth) yields its client key.
type Gateway struct {
	// keySources are tried in order until one yields a key: 1 to 8 sources. A source yields
	// none when what it reads is absent or empty (a Header source's header, the X-Forwarded-Uri
	// of a Path source, a JWTClaim source's claim), or when X-Forwarded-For has fewer entries
	// than a ClientAddress source's trustedHops. Each key starts with its source
	// ("header:x-api-key:", "ip:", "host:", "method:", "path:", "jwt:authorization:sub:"), so
	// that a value read from one source never names a client
	// of another; overrides name keys in that form ("ip:192.0.2.7"). A header a client can set
	// as it likes gives whoever sends it the allowance of its key: prefer a header the gateway
	// sets after authenticating the client, or the client address.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	KeySources []KeySource `json:"keySources"`

	// missingKey says what happens to a request from which no key source yields a key: Reject
	// (the default) answers it with the deny status (429, or the status of the deny query
	// parameter) without Retry-After; Allow admits it and charges nothing; Shared decides it
	// for the one key "anonymous", which every such request shares and an override may name.
	// +optional
	// +kubebuilder:default=Reject
	MissingKey MissingKey `json:"missingKey,omitempty"`
}

// KeySource is one place a forwarded request's client key may come from.
// +kubebuilder:validation:XValidation:rule="self.type != 'Header' || has(self.header)",message="header is required when type is Header",fieldPath=".header"
// +kubebuilder:validation:XValidation:rule="self.type == 'Header' || self.type == 'JWTClaim' || !has(self.header)",message="header must be set only when type is Header or JWTClaim",fieldPath=".header"
// +kubebuilder:validation:XValidation:rule="self.type != 'JWTClaim' || has(self.claim) || has(self.claimPath)",message="claim or claimPath is required when type is JWTClaim",fieldPath=".claim"
// +kubebuilder:validation:XValidation:rule="self.type == 'JWTClaim' || !has(self.claim)",message="claim must be set only when type is JWTClaim",fieldPath=".claim"
// +kubebuilder:validation:XValidation:rule="self.type == 'JWTClaim' || !has(self.claimPath)",message="claimPath must be set only when type is JWTClaim",fieldPath=".claimPath"
// +kubebuilder:validation:XValidation:rule="!has(self.claim) || !has(self.claimPath)",message="claim and claimPath are mutually exclusive: set one of them",fieldPath=".claimPath"
// +kubebuilder:validation:XValidation:rule="self.type == 'ClientAddress' || !has(self.trustedHops)",message="trustedHops must be set only when type is ClientAddress",fieldPath=".trustedHops"
// +kubebuilder:validation:XValidation:rule="self.type == 'Path' || self.?pathSegments.orValue(0) == 0",message="pathSegments must be set only when type is Path",fieldPath=".pathSegments"
type KeySource struct {
	// type is where the key comes from: Header (the value of header), ClientAddress (the
	// client's IPv4 address or IPv6 /64, see trustedHops), Host (X-Forwarded-Host, in lower case), Method
	// (X-Forwarded-Method, else the method of the forward-auth request), Path
	// (X-Forwarded-Uri, else X-Original-URI, without its query; see pathSegments) or JWTClaim
	// (a claim of the JSON Web Token in header; see claim). Asked by Envoy's HTTP ext_authz (the
	// forwarded request's path appended to the forward-auth path, after the policy's name), Host,
	// Method and Path read the check's own Host, method and that path, never X-Forwarded-*
	// headers, which only a client could have set there.
	// +required
	Type KeySourceType `json:"type"`

	// header names the request header whose value is the key, for type Header, or that holds
	// the token, for type JWTClaim (default Authorization): an HTTP field name (letters, digits
	// and !#$%&'*+-.^_`|~), at most 128 characters, in any case. A header given more than once
	// is refused (400), and a value over 4096 bytes too (431).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[-!#$%&'*+.^_|~0-9A-Za-z\x60]+$`
	Header string `json:"header,omitempty"`

	// trustedHops is, for type ClientAddress, how many proxies (the gateway that asks limiterd
	// included) append to X-Forwarded-For an entry that can be trusted; between 0 and 16,
	// default 1. The client address is the entry trustedHops from the right: 1, the entry the
	// gateway itself added (the address of its peer); 2, the one before it (the gateway
	// behind one load balancer that appends the address it saw). Entries further left were
	// sent by the client and are never read. When X-Forwarded-For has fewer entries, or an
	// entry that is no IP address, the source yields no key; without X-Forwarded-For, or with
	// trustedHops 0, the key is the address of the peer that sent the forward-auth request.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	TrustedHops *int32 `json:"trustedHops,omitempty"`

	// pathSegments is, for type Path, how many leading segments of the path make the key:
	// with 2, "/api/v1/users/7" gives "path:/api/v1". Between 0 and 16; 0 (the default) takes
	// the whole path.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	PathSegments int32 `json:"pathSegments,omitempty"`

	// claim is, for type JWTClaim, the claim of the token whose value is the key: a name
	// ("sub", "client_id") or a dotted path of at most 4 names into nested objects
	// ("org.id"), each of letters, digits, '_' and '-'; at most 128 characters. A claim whose
	// name holds other characters ("https://example.com/tenant", "cognito:username") is named
	// by claimPath instead: set exactly one of claim and claimPath. With header
	// Authorization the token is read from "Bearer <token>" (another scheme: no key from this
	// source); with another header its whole value is the token. A string claim, or an integer
	// one (digits, no fraction or exponent), is the key "jwt:<header in lower case>:<claim>:<value>";
	// a claim that is absent, empty, null, or of another type yields no key. A value that is no
	// JWS compact token (three base64url segments) or whose payload is no JSON object, or that
	// names a claim on the path twice in one object, is refused (400).
	//
	// limiterd never checks the token's signature, expiry or issuer: it reads a token that the
	// gateway has verified. The gateway must verify the token and must refuse, or replace, a
	// token the client sent that it did not verify, before it asks limiterd; otherwise any
	// client can write itself a token and choose its own key and budget.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[-_0-9A-Za-z]+(\.[-_0-9A-Za-z]+){0,3}$`
	Claim string `json:"claim,omitempty"`

	// claimPath is, for type JWTClaim, the claim of the token whose value is the key, as the
	// exact names of its path: ["https://example.com/tenant"] names a top-level claim of that
	// name, ["org", "id"] the member "id" of the object "org" (as claim "org.id" does), and
	// ["realm_access", "urn:acme:org"] a member with ':' in its name. 1 to 4 names, each of 1
	// to 128 letters, digits and -._~:/; a '.' in a name is part of the name, never a step
	// into an object. Set exactly one of claim and claimPath. The key is
	// "jwt:<header in lower case>:<names>:<value>", the names joined by '.', with '%', '.' and
	// ':' in a name written %25, %2E and %3A, so that no two paths share a key:
	// "jwt:authorization:https%3A//example%2Ecom/tenant:acme", and
	// "jwt:authorization:org.id:acme" as with claim "org.id". Otherwise it is read as claim is.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[-._~:/0-9A-Za-z]+$`
	ClaimPath []string `json:"claimPath,omitempty"`
}

// Envoy maps the descriptors of Envoy rate-limit requests to client keys.
type Envoy struct {
	// descriptorKey names the descriptor entry whose value is the client key: with
	// descriptorKey "remote_address", the descriptor [("remote_address", "10.0.0.1")] is decided
	// for the client "10.0.0.1", as an HTTP decision request with that key would be. A descriptor
	// with no entry of that key is not limited by this policy. When descriptorKey is empty, the
	// client key is the whole descriptor: its entries in order as key=value joined by '&', with
	// '%', '&' and '=' in keys and values written %25, %26 and %3D
	// ("generic_key=api&remote_address=10.0.0.1"). At most 256 bytes, without control characters.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[^\x00-\x1F\x7F-\x9F\x{FFFE}\x{FFFF}]*$`
	// +kubebuilder:validation:XValidation:rule="size(bytes(self)) <= 256",message="must be at most 256 bytes"
	DescriptorKey string `json:"descriptorKey,omitempty"`
}

// RateLimitPolicyStatus is what the operator observed of a policy.
type RateLimitPolicyStatus struct {
	// observedGeneration is the generation of the spec the operator last processed.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// configMapName is the name of the ConfigMap that carries the rendered policy to limiterd.
	// +optional
	ConfigMapName string `json:"configMapName,omitempty"`

	// tierCount is the number of tiers of the spec the operator last processed (shown by
	// kubectl get, which cannot count list items itself).
	// +optional
	TierCount int32 `json:"tierCount,omitempty"`

	// replicas is the number of live limiterd replicas: those whose status record (a Lease
	// renewed by each replica) has not expired.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// enforcedReplicas is the number of live limiterd replicas that serve observedGeneration.
	// +optional
	EnforcedReplicas int32 `json:"enforcedReplicas,omitempty"`

	// enforced is enforcedReplicas/replicas, as "3/3" (shown by kubectl get).
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Enforced string `json:"enforced,omitempty"`

	// dryRunRejected is set for a policy with dry-run tiers: how many decisions of those tiers
	// would have been rejected since observedGeneration was applied, summed over the live
	// replicas that serve it.
	// +optional
	DryRunRejected *int64 `json:"dryRunRejected,omitempty"`

	// conditions describe the policy's state: Ready says whether it was rendered for limiterd,
	// Enforced whether every live limiterd replica serves observedGeneration.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RateLimitPolicy decides, per client key, whether a request gets through: its tiers say how,
// its overrides say which clients use which tier.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rlp
// +kubebuilder:printcolumn:name="Default Tier",type=string,JSONPath=`.spec.defaultTier`
// +kubebuilder:printcolumn:name="Tiers",type=integer,JSONPath=`.status.tierCount`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Enforced",type=string,JSONPath=`.status.enforced`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RateLimitPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired behaviour of the policy.
	// +required
	Spec RateLimitPolicySpec `json:"spec"`

	// status is what the operator observed of the policy.
	// +optional
	Status RateLimitPolicyStatus `json:"status,omitempty"`
}

// RateLimitPolicyList is a list of RateLimitPolicy.
//
// +kubebuilder:object:root=true
type RateLimitPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the policies.
	Items []RateLimitPolicy `json:"items"`
}
