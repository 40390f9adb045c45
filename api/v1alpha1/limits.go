package v1alpha1

import (
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// Bounds of a RateLimitPolicy. The bounds of the strategies' parameters, and of a tier's limits,
// are those of limiterd's rate-limit core (limiterd/limiter), which declares them with the
// reasons its arithmetic needs them, so that every valid policy compiles; the HTTP and Envoy
// APIs take their key and cost bounds from here, and their error messages print these
// constants. The list and string bounds keep the CRD's CEL rules within the API server's cost
// budget and a rendered policy within one ConfigMap. The CRD markers in
// ratelimitpolicy_types.go cannot name a constant and repeat them as literals;
// TestCRDMatchesLimits and TestCRDMatchesEnvoyLimits check them, and the messages that state
// them, against the generated CRD.
const (
	// MaxCapacity bounds a token bucket's capacity and refillRate (both at least 1).
	MaxCapacity = limiter.MaxCapacity
	// MaxWindowLimit bounds a sliding window's limit (at least 1).
	MaxWindowLimit = limiter.MaxWindowLimit
	// MaxQuotaLimit bounds a quota's limit (at least 1).
	MaxQuotaLimit = limiter.MaxQuotaLimit
	// MaxConcurrencyLimit bounds a concurrency limit's limit, its places (at least 1).
	MaxConcurrencyLimit = limiter.MaxConcurrencyLimit
	// MinPeriod is the shortest refillPeriod, window or leaseTimeout.
	MinPeriod = limiter.MinPeriod
	// MaxPeriod is the longest refillPeriod, window or leaseTimeout.
	MaxPeriod = limiter.MaxPeriod
	// MaxRefillWindow bounds a token bucket's full refill, capacity*refillPeriod/refillRate
	// (rounded down to whole nanoseconds).
	MaxRefillWindow = limiter.MaxRefillWindow

	// MaxTiers is the most tiers a policy has.
	MaxTiers = 64
	// MaxLimits is the most limits of a stacked tier (Tier.Limits): limiter.MaxStack. Each
	// limit of a tier is one more state per client in limiterd's store, and one more key in the
	// script that decides the stack in Redis.
	MaxLimits = limiter.MaxStack
	// MaxOverrides is the most overrides a policy has.
	MaxOverrides = 64
	// MaxClientsPerOverride is the most entries of one override's clients, and of its
	// clientPrefixes.
	MaxClientsPerOverride = 256
	// MaxOverrideClients is the most client keys of all overrides together, and the most
	// client prefixes of all overrides together. The CRD's rule that a key appears in one
	// override only compares every pair, so this bounds its CEL cost.
	MaxOverrideClients = 512
	// MaxClientKeyBytes is the longest client key or client prefix, in bytes (UTF-8).
	MaxClientKeyBytes = 1024
	// MaxDescriptorKeyBytes is the longest spec.envoy.descriptorKey, in bytes (UTF-8).
	MaxDescriptorKeyBytes = 256
	// MaxNameLength is the longest tier or limit name (a DNS label).
	MaxNameLength = 63
	// MaxDurationLength is the longest duration string the CRD accepts ("1s", "250ms").
	// A decoded duration has lost its text, so Validate cannot check this bound.
	MaxDurationLength = 64
	// MaxTimeZoneLength is the longest quota timeZone, in bytes (ASCII): the longest name of
	// the tz database has 32 ("America/Argentina/ComodRivadavia"). It bounds what a caller can
	// make the operator and limiterd look up.
	MaxTimeZoneLength = 64

	// MaxKeySources is the most key sources of spec.gateway.
	MaxKeySources = 8
	// MaxHeaderNameLength is the longest header name of a key source.
	MaxHeaderNameLength = 128
	// MaxTrustedHops bounds a ClientAddress key source's trustedHops: how many entries of
	// X-Forwarded-For limiterd reads, from the right.
	MaxTrustedHops = 16
	// MaxPathSegments bounds a Path key source's pathSegments.
	MaxPathSegments = 16
	// MaxClaimLength is the longest claim of a JWTClaim key source, and the longest name of its
	// claimPath.
	MaxClaimLength = 128
	// MaxClaimDepth is the most names of a JWTClaim key source's claim path: of its claim
	// ("a.b.c.d"), or of its claimPath.
	MaxClaimDepth = 4
	// MaxGatewayHeaderBytes is the longest value of a header that a forward-auth request is
	// decided from (a Header or JWTClaim key source's header, X-Forwarded-For, -Host, -Method, -Uri,
	// X-Original-URI); a longer one is refused rather than read.
	MaxGatewayHeaderBytes = 4096

	// MaxBatchItems is the most items of one batch of decisions (POST /v1/allow:batch).
	MaxBatchItems = 1000
)

// DefaultRefillPeriod is the refillPeriod of a token bucket that sets none.
const DefaultRefillPeriod = time.Second

// DefaultTimeZone is the timeZone of a quota that sets none: periods start at midnight UTC.
const DefaultTimeZone = "UTC"

// DefaultLimitName is the name of the limit of a tier's single-limit form (Tier.Algorithm): a
// limit of a stacked tier (Tier.Limits) of this name shares its clients' usage with it. It is the
// name under which limiterd's stores keep a single limit's state (limiter.DefaultLimitName).
const DefaultLimitName = limiter.DefaultLimitName

// DefaultFailureMode is the failureMode of a policy that sets none.
const DefaultFailureMode = FailureModeOpen

// DefaultTierNames is the tierNames of a policy that sets none.
const DefaultTierNames = TierNamesShown

// HiddenTierName is the name every tier has in the answers to clients under tierNames Hidden.
const HiddenTierName = "limit"

// DefaultRefunds is the refunds of a policy that sets none: refunds are off unless a policy
// enables them.
const DefaultRefunds = RefundsDisabled

// DefaultMissingKey is the spec.gateway.missingKey of a policy that sets none.
const DefaultMissingKey = MissingKeyReject

// DefaultTrustedHops is the trustedHops of a ClientAddress key source that sets none: the
// gateway that asks limiterd is the one trusted proxy.
const DefaultTrustedHops = 1

// SharedGatewayKey is the key of the requests that no key source gives one under
// spec.gateway.missingKey Shared. Every key a source yields contains ':', this one does not.
const SharedGatewayKey = "anonymous"
