package v1alpha1

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

var (
	supportedAlgorithms   = []Algorithm{AlgorithmTokenBucket, AlgorithmSlidingWindow, AlgorithmQuota, AlgorithmConcurrency, AlgorithmUnlimited}
	stackedAlgorithms     = []Algorithm{AlgorithmTokenBucket, AlgorithmSlidingWindow, AlgorithmQuota, AlgorithmConcurrency} // a limit of a stack
	supportedPeriods      = []CalendarPeriod{CalendarPeriodDay, CalendarPeriodWeek, CalendarPeriodMonth, CalendarPeriodYear}
	supportedFailureModes = []FailureMode{FailureModeOpen, FailureModeClosed, FailureModeLocal}
	supportedTierNames    = []TierNames{TierNamesShown, TierNamesHidden}
	supportedRefunds      = []Refunds{RefundsDisabled, RefundsEnabled}
	supportedKeySources   = []KeySourceType{KeySourceHeader, KeySourceClientAddress, KeySourceHost, KeySourceMethod, KeySourcePath, KeySourceJWTClaim}
	supportedMissingKeys  = []MissingKey{MissingKeyReject, MissingKeyAllow, MissingKeyShared}
)

// Validate reports every way p breaks the rules of a RateLimitPolicy; it is the one validation
// used by limiterd's file mode, its ConfigMap watcher and the operator, and the CRD enforces
// the same rules at admission. It returns nil or a k8s.io/apimachinery/pkg/util/errors.Aggregate
// of *field.Error, each naming the field path, e.g.
// "spec.tiers[1].tokenBucket.capacity: Invalid value: 0: must be between 1 and 1000000000".
//
// Unset optional fields count as their defaults (see Default): a token bucket without
// refillPeriod refills per DefaultRefillPeriod, a quota without timeZone counts in
// DefaultTimeZone, an empty failureMode is DefaultFailureMode, an empty tierNames
// DefaultTierNames.
// Validate does not modify p.
//
// The CRD's schema and CEL rules enforce the same rules; the error of the API server names the
// same field, except for rules that CEL checks on an enclosing object (a key in two overrides,
// an override's unknown tier: spec.overrides; a duplicate tier name: spec.tiers[i]; a duplicate
// limit name: spec.tiers[i].limits[j]). Only the CRD limits the text of a duration
// (MaxDurationLength), which a decoded duration has lost. A quota's timeZone is looked up by
// both, each in its own tz database: the CRD's rule in the API server's, Validate
// (LoadTimeZone) in this binary's, which may be older; a zone the API server admitted and this
// binary does not know is refused here, and so by the operator and limiterd. The CRD's rule
// also admits an unchanged name already stored, which Validate looks up again.
func Validate(p *RateLimitPolicy) error {
	if p == nil {
		return errors.New("RateLimitPolicy is nil")
	}
	errs := validateMetadata(p, field.NewPath("metadata"))
	errs = append(errs, validateSpec(&p.Spec, field.NewPath("spec"))...)
	return errs.ToAggregate()
}

func validateMetadata(p *RateLimitPolicy, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if p.Name == "" {
		errs = append(errs, field.Required(path.Child("name"), "a DNS subdomain is required"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(p.Name) {
			errs = append(errs, field.Invalid(path.Child("name"), p.Name, msg))
		}
	}
	if p.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(p.Namespace) {
			errs = append(errs, field.Invalid(path.Child("namespace"), p.Namespace, msg))
		}
	}
	return errs
}

func validateSpec(s *RateLimitPolicySpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	tiersPath := path.Child("tiers")
	switch {
	case len(s.Tiers) == 0:
		errs = append(errs, field.Required(tiersPath, "at least one tier is required"))
	case len(s.Tiers) > MaxTiers:
		errs = append(errs, field.TooMany(tiersPath, len(s.Tiers), MaxTiers))
	}
	tiers := make(map[string]bool, len(s.Tiers))
	for i := range s.Tiers {
		t := &s.Tiers[i]
		errs = append(errs, validateTier(t, tiersPath.Index(i))...)
		if t.Name != "" && tiers[t.Name] {
			errs = append(errs, field.Duplicate(tiersPath.Index(i).Child("name"), t.Name))
		}
		tiers[t.Name] = true
	}

	errs = append(errs, validateTierRef(s.DefaultTier, tiers, path.Child("defaultTier"))...)

	overridesPath := path.Child("overrides")
	if len(s.Overrides) > MaxOverrides {
		errs = append(errs, field.TooMany(overridesPath, len(s.Overrides), MaxOverrides))
	}
	clients := make(map[string]*field.Path)
	prefixes := make(map[string]*field.Path)
	for i := range s.Overrides {
		o := &s.Overrides[i]
		p := overridesPath.Index(i)
		errs = append(errs, validateTierRef(o.Tier, tiers, p.Child("tier"))...)
		if len(o.Clients) == 0 && len(o.ClientPrefixes) == 0 {
			errs = append(errs, field.Required(p, "must select at least one client or client prefix"))
		}
		errs = append(errs, validateKeys(o.Clients, clients, p.Child("clients"))...)
		errs = append(errs, validateKeys(o.ClientPrefixes, prefixes, p.Child("clientPrefixes"))...)
	}
	if n := countKeys(s.Overrides, func(o *Override) []string { return o.Clients }); n > MaxOverrideClients {
		errs = append(errs, field.Invalid(overridesPath, n,
			fmt.Sprintf("all overrides together may list at most %d clients", MaxOverrideClients)))
	}
	if n := countKeys(s.Overrides, func(o *Override) []string { return o.ClientPrefixes }); n > MaxOverrideClients {
		errs = append(errs, field.Invalid(overridesPath, n,
			fmt.Sprintf("all overrides together may list at most %d clientPrefixes", MaxOverrideClients)))
	}

	if s.FailureMode != "" && !oneOf(s.FailureMode, supportedFailureModes) {
		errs = append(errs, field.NotSupported(path.Child("failureMode"), s.FailureMode, supportedFailureModes))
	}
	if s.TierNames != "" && !oneOf(s.TierNames, supportedTierNames) {
		errs = append(errs, field.NotSupported(path.Child("tierNames"), s.TierNames, supportedTierNames))
	}
	if s.Refunds != "" && !oneOf(s.Refunds, supportedRefunds) {
		errs = append(errs, field.NotSupported(path.Child("refunds"), s.Refunds, supportedRefunds))
	}
	if s.Refunds == RefundsEnabled && usesAlgorithm(s.Tiers, AlgorithmSlidingWindow) {
		errs = append(errs, field.Invalid(path.Child("refunds"), s.Refunds,
			"refunds cannot be Enabled with a SlidingWindow tier or limit: a refund could not remove the charge from the window's log, which would free its units twice"))
	}
	if s.Refunds == RefundsEnabled && usesAlgorithm(s.Tiers, AlgorithmQuota) {
		errs = append(errs, field.Invalid(path.Child("refunds"), s.Refunds,
			"refunds cannot be Enabled with a Quota tier or limit: refunds of a quota's charges are not supported yet"))
	}
	if s.Refunds == RefundsEnabled && usesAlgorithm(s.Tiers, AlgorithmConcurrency) {
		errs = append(errs, field.Invalid(path.Child("refunds"), s.Refunds,
			"refunds cannot be Enabled with a Concurrency tier or limit: a refund is not a release, and a concurrency limit's places come back only when a lease is released or times out"))
	}
	if s.Envoy != nil {
		errs = append(errs, validateEnvoy(s.Envoy, path.Child("envoy"))...)
	}
	if s.Gateway != nil {
		errs = append(errs, validateGateway(s.Gateway, path.Child("gateway"))...)
	}
	return errs
}

func validateGateway(g *Gateway, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	sourcesPath := path.Child("keySources")
	switch {
	case len(g.KeySources) == 0:
		errs = append(errs, field.Required(sourcesPath, fmt.Sprintf("1 to %d key sources", MaxKeySources)))
	case len(g.KeySources) > MaxKeySources:
		errs = append(errs, field.TooMany(sourcesPath, len(g.KeySources), MaxKeySources))
	}
	for i := range g.KeySources {
		errs = append(errs, validateKeySource(&g.KeySources[i], sourcesPath.Index(i))...)
	}
	if g.MissingKey != "" && !oneOf(g.MissingKey, supportedMissingKeys) {
		errs = append(errs, field.NotSupported(path.Child("missingKey"), g.MissingKey, supportedMissingKeys))
	}
	return errs
}

func validateKeySource(k *KeySource, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch p := path.Child("type"); {
	case k.Type == "":
		errs = append(errs, field.Required(p, "one of Header, ClientAddress, Host, Method, Path, JWTClaim"))
	case !oneOf(k.Type, supportedKeySources):
		errs = append(errs, field.NotSupported(p, k.Type, supportedKeySources))
	}
	headerPath := path.Child("header")
	switch {
	case k.Type == KeySourceHeader && k.Header == "":
		errs = append(errs, field.Required(headerPath, "header is required when type is Header"))
	case k.Type != KeySourceHeader && k.Type != KeySourceJWTClaim && k.Header != "":
		errs = append(errs, field.Forbidden(headerPath, "header must be set only when type is Header or JWTClaim"))
	case len(k.Header) > MaxHeaderNameLength:
		errs = append(errs, field.TooLong(headerPath, k.Header, MaxHeaderNameLength))
	case k.Header != "" && !isToken(k.Header):
		errs = append(errs, field.Invalid(headerPath, k.Header, "must be an HTTP field name: letters, digits and !#$%&'*+-.^_`|~"))
	}
	errs = append(errs, validateClaim(k, path)...)
	if k.TrustedHops != nil {
		p := path.Child("trustedHops")
		if k.Type != KeySourceClientAddress {
			errs = append(errs, field.Forbidden(p, "trustedHops must be set only when type is ClientAddress"))
		}
		if h := *k.TrustedHops; h < 0 || h > MaxTrustedHops {
			errs = append(errs, field.Invalid(p, h, fmt.Sprintf("must be between 0 and %d", MaxTrustedHops)))
		}
	}
	if k.PathSegments != 0 {
		p := path.Child("pathSegments")
		if k.Type != KeySourcePath {
			errs = append(errs, field.Forbidden(p, "pathSegments must be set only when type is Path"))
		}
		if n := k.PathSegments; n < 0 || n > MaxPathSegments {
			errs = append(errs, field.Invalid(p, n, fmt.Sprintf("must be between 0 and %d", MaxPathSegments)))
		}
	}
	return errs
}

// validateClaim checks a key source's claim and claimPath: for type JWTClaim exactly one of
// them, and for another type neither.
func validateClaim(k *KeySource, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	claimField, pathField := path.Child("claim"), path.Child("claimPath")
	jwt := k.Type == KeySourceJWTClaim
	switch {
	case jwt && k.Claim == "" && k.ClaimPath == nil:
		errs = append(errs, field.Required(claimField, "claim or claimPath is required when type is JWTClaim"))
	case k.Claim != "" && k.ClaimPath != nil:
		errs = append(errs, field.Forbidden(pathField, "claim and claimPath are mutually exclusive: set one of them"))
	}
	if !jwt && k.Claim != "" {
		errs = append(errs, field.Forbidden(claimField, "claim must be set only when type is JWTClaim"))
	}
	if !jwt && k.ClaimPath != nil {
		errs = append(errs, field.Forbidden(pathField, "claimPath must be set only when type is JWTClaim"))
	}
	switch {
	case len(k.Claim) > MaxClaimLength:
		errs = append(errs, field.TooLong(claimField, k.Claim, MaxClaimLength))
	case k.Claim != "" && !isClaimPath(k.Claim):
		errs = append(errs, field.Invalid(claimField, k.Claim, fmt.Sprintf("must be a claim name, or a dotted path of at most %d names, each of letters, digits, '_' and '-' (use claimPath for a name of other characters)", MaxClaimDepth)))
	}
	switch n := len(k.ClaimPath); {
	case k.ClaimPath == nil:
	case n == 0:
		errs = append(errs, field.Invalid(pathField, n, fmt.Sprintf("must have 1 to %d names", MaxClaimDepth)))
	case n > MaxClaimDepth:
		errs = append(errs, field.TooMany(pathField, n, MaxClaimDepth))
	}
	for i, name := range k.ClaimPath {
		switch p := pathField.Index(i); {
		case len(name) > MaxClaimLength:
			errs = append(errs, field.TooLong(p, name, MaxClaimLength))
		case !isClaimName(name):
			errs = append(errs, field.Invalid(p, name, "must be a claim's name: 1 or more letters, digits and -._~:/"))
		}
	}
	return errs
}

// isToken reports whether s is an HTTP token (RFC 9110, section 5.6.2): a field name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// usesAlgorithm says whether a tier of tiers, or a limit of a stacked tier, has algorithm a.
func usesAlgorithm(tiers []Tier, a Algorithm) bool {
	for i := range tiers {
		if tiers[i].Algorithm == a {
			return true
		}
		for j := range tiers[i].Limits {
			if tiers[i].Limits[j].Algorithm == a {
				return true
			}
		}
	}
	return false
}

func validateEnvoy(e *Envoy, path *field.Path) field.ErrorList {
	p := path.Child("descriptorKey")
	switch k := e.DescriptorKey; {
	case len(k) > MaxDescriptorKeyBytes:
		return field.ErrorList{field.TooLong(p, k, MaxDescriptorKeyBytes)}
	case !utf8.ValidString(k):
		return field.ErrorList{field.Invalid(p, k, "must be valid UTF-8")}
	case strings.IndexFunc(k, forbiddenInKey) >= 0:
		return field.ErrorList{field.Invalid(p, k, forbiddenInKeyDetail)}
	}
	return nil
}

// validateTierRef checks that name names one of the tiers.
func validateTierRef(name string, tiers map[string]bool, path *field.Path) field.ErrorList {
	switch {
	case name == "":
		return field.ErrorList{field.Required(path, "must name a tier of spec.tiers")}
	case !tiers[name]:
		return field.ErrorList{field.Invalid(path, name, "must name a tier of spec.tiers")}
	}
	return nil
}

// validateKeys checks the client keys or prefixes of one override; seen holds those of the
// overrides before it (of the same kind) and gains these.
func validateKeys(keys []string, seen map[string]*field.Path, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(keys) > MaxClientsPerOverride {
		errs = append(errs, field.TooMany(path, len(keys), MaxClientsPerOverride))
	}
	for j, k := range keys {
		p := path.Index(j)
		switch {
		case k == "":
			errs = append(errs, field.Invalid(p, k, "must not be empty"))
			continue
		case len(k) > MaxClientKeyBytes:
			errs = append(errs, field.TooLong(p, k, MaxClientKeyBytes))
			continue
		case !utf8.ValidString(k):
			errs = append(errs, field.Invalid(p, k, "must be valid UTF-8"))
			continue
		case strings.IndexFunc(k, forbiddenInKey) >= 0:
			errs = append(errs, field.Invalid(p, k, forbiddenInKeyDetail))
			continue
		}
		if first, ok := seen[k]; ok {
			d := field.Duplicate(p, k)
			d.Detail = "also at " + first.String()
			errs = append(errs, d)
			continue
		}
		seen[k] = p
	}
	return errs
}

// forbiddenInKey reports the characters a client key, prefix or descriptor key must not
// contain: the control characters (U+0000-U+001F, U+007F-U+009F) and the noncharacters U+FFFE
// and U+FFFF. YAML cannot carry most of them (and folds U+0085 into a space), so a policy with
// them could not be rendered into its ConfigMap; no HTTP header carries them either. The CRD
// has the same rule as a pattern.
func forbiddenInKey(r rune) bool {
	return r <= 0x1F || r >= 0x7F && r <= 0x9F || r == 0xFFFE || r == 0xFFFF
}

const forbiddenInKeyDetail = "must not contain control characters (U+0000-U+001F, U+007F-U+009F), U+FFFE or U+FFFF"

func countKeys(overrides []Override, keys func(*Override) []string) int {
	n := 0
	for i := range overrides {
		n += len(keys(&overrides[i]))
	}
	return n
}

func validateTier(t *Tier, path *field.Path) field.ErrorList {
	errs := validateName(t.Name, path.Child("name"))
	if t.Limits != nil {
		return append(errs, validateStack(t, path)...)
	}
	if t.Algorithm == "" {
		errs = append(errs, field.Required(path.Child("algorithm"), "a tier needs algorithm (one limit) or limits (a stack)"))
	}
	return append(errs, validateAlgorithm(t.Algorithm, blocks{t.TokenBucket, t.SlidingWindow, t.Quota, t.Concurrency}, supportedAlgorithms, path)...)
}

// validateName checks a tier's or a limit's name: a DNS label.
func validateName(name string, path *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(path, "a DNS label is required")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	return errs
}

// validateStack checks a stacked tier: its limits, and none of the single-limit fields.
func validateStack(t *Tier, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	limitsPath := path.Child("limits")
	if t.Algorithm != "" {
		errs = append(errs, field.Forbidden(limitsPath, "a tier has either algorithm or limits, not both"))
	}
	if t.TokenBucket != nil {
		errs = append(errs, field.Forbidden(path.Child("tokenBucket"), "tokenBucket must be set only when algorithm is TokenBucket"))
	}
	if t.SlidingWindow != nil {
		errs = append(errs, field.Forbidden(path.Child("slidingWindow"), "slidingWindow must be set only when algorithm is SlidingWindow"))
	}
	if t.Quota != nil {
		errs = append(errs, field.Forbidden(path.Child("quota"), "quota must be set only when algorithm is Quota"))
	}
	if t.Concurrency != nil {
		errs = append(errs, field.Forbidden(path.Child("concurrency"), "concurrency must be set only when algorithm is Concurrency"))
	}
	switch {
	case len(t.Limits) == 0:
		errs = append(errs, field.Required(limitsPath, fmt.Sprintf("a stack has 1 to %d limits", MaxLimits)))
	case len(t.Limits) > MaxLimits:
		errs = append(errs, field.TooMany(limitsPath, len(t.Limits), MaxLimits))
	}
	names := make(map[string]bool, len(t.Limits))
	for j := range t.Limits {
		l := &t.Limits[j]
		p := limitsPath.Index(j)
		errs = append(errs, validateName(l.Name, p.Child("name"))...)
		if l.Name != "" && names[l.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), l.Name))
		}
		names[l.Name] = true
		if l.Algorithm == "" {
			errs = append(errs, field.Required(p.Child("algorithm"), "one of TokenBucket, SlidingWindow, Quota, Concurrency"))
		}
		errs = append(errs, validateAlgorithm(l.Algorithm, blocks{l.TokenBucket, l.SlidingWindow, l.Quota, l.Concurrency}, stackedAlgorithms, p)...)
	}
	return errs
}

// blocks are the parameter blocks beside an algorithm, of a tier or of a stacked tier's limit.
type blocks struct {
	tokenBucket   *TokenBucket
	slidingWindow *SlidingWindow
	quota         *Quota
	concurrency   *Concurrency
}

// validateAlgorithm checks an algorithm against supported, and the parameter blocks beside it
// (at path): exactly the one it needs, each valid. A missing algorithm ("") is the caller's to
// report; the blocks are then only checked for their own bounds.
func validateAlgorithm(a Algorithm, b blocks, supported []Algorithm, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	tbPath, swPath, qPath, cPath := path.Child("tokenBucket"), path.Child("slidingWindow"), path.Child("quota"), path.Child("concurrency")
	switch {
	case a == "":
	case !oneOf(a, supported):
		errs = append(errs, field.NotSupported(path.Child("algorithm"), a, supported))
	case a == AlgorithmTokenBucket:
		if b.tokenBucket == nil {
			errs = append(errs, field.Required(tbPath, "tokenBucket is required when algorithm is TokenBucket"))
		}
	case a == AlgorithmSlidingWindow:
		if b.slidingWindow == nil {
			errs = append(errs, field.Required(swPath, "slidingWindow is required when algorithm is SlidingWindow"))
		}
	case a == AlgorithmQuota:
		if b.quota == nil {
			errs = append(errs, field.Required(qPath, "quota is required when algorithm is Quota"))
		}
	case a == AlgorithmConcurrency:
		if b.concurrency == nil {
			errs = append(errs, field.Required(cPath, "concurrency is required when algorithm is Concurrency"))
		}
	case a == AlgorithmUnlimited:
	}
	if b.tokenBucket != nil && a != AlgorithmTokenBucket && a != "" {
		errs = append(errs, field.Forbidden(tbPath, "tokenBucket must be set only when algorithm is TokenBucket"))
	}
	if b.slidingWindow != nil && a != AlgorithmSlidingWindow && a != "" {
		errs = append(errs, field.Forbidden(swPath, "slidingWindow must be set only when algorithm is SlidingWindow"))
	}
	if b.quota != nil && a != AlgorithmQuota && a != "" {
		errs = append(errs, field.Forbidden(qPath, "quota must be set only when algorithm is Quota"))
	}
	if b.concurrency != nil && a != AlgorithmConcurrency && a != "" {
		errs = append(errs, field.Forbidden(cPath, "concurrency must be set only when algorithm is Concurrency"))
	}
	if b.tokenBucket != nil {
		errs = append(errs, validateTokenBucket(b.tokenBucket, tbPath)...)
	}
	if b.slidingWindow != nil {
		errs = append(errs, validateSlidingWindow(b.slidingWindow, swPath)...)
	}
	if b.quota != nil {
		errs = append(errs, validateQuota(b.quota, qPath)...)
	}
	if b.concurrency != nil {
		errs = append(errs, validateConcurrency(b.concurrency, cPath)...)
	}
	return errs
}

func validateTokenBucket(tb *TokenBucket, path *field.Path) field.ErrorList {
	errs := validateRange(tb.Capacity, MaxCapacity, path.Child("capacity"))
	errs = append(errs, validateRange(tb.RefillRate, MaxCapacity, path.Child("refillRate"))...)
	period := DefaultRefillPeriod
	if tb.RefillPeriod != nil {
		period = tb.RefillPeriod.Duration
		errs = append(errs, validatePeriod(period, path.Child("refillPeriod"))...)
	}
	if len(errs) == 0 {
		if full, ok := fullRefill(tb.Capacity, tb.RefillRate, period); !ok {
			errs = append(errs, field.Invalid(path, full.String(), fmt.Sprintf(
				"a full refill (capacity*refillPeriod/refillRate) must take at most %d days (%v)", MaxRefillWindow/(24*time.Hour), MaxRefillWindow)))
		}
	}
	return errs
}

// fullRefill returns how long a token bucket of the given parameters takes to refill from
// empty, floor(capacity*period/refillRate) nanoseconds, and whether that is within
// MaxRefillWindow. The parameters must be within their bounds (capacity and refillRate in
// [1, MaxCapacity], period in [MinPeriod, MaxPeriod]); when the result is out of range it is
// reported as (MaxRefillWindow+1ns or more, false).
func fullRefill(capacity, refillRate int64, period time.Duration) (time.Duration, bool) {
	if capacity < 1 || refillRate < 1 || period < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(capacity), uint64(period))
	if hi >= uint64(refillRate) { // the quotient does not fit in 64 bits
		return time.Duration(1<<63 - 1), false
	}
	q, _ := bits.Div64(hi, lo, uint64(refillRate))
	if q > uint64(MaxRefillWindow) {
		if q > 1<<63-1 {
			q = 1<<63 - 1
		}
		return time.Duration(q), false
	}
	return time.Duration(q), true
}

func validateSlidingWindow(sw *SlidingWindow, path *field.Path) field.ErrorList {
	errs := validateRange(sw.Limit, MaxWindowLimit, path.Child("limit"))
	return append(errs, validatePeriod(sw.Window.Duration, path.Child("window"))...)
}

// validateConcurrency checks a concurrency limit's places and its lease timeout, within the
// bounds of limiter.NewConcurrency.
func validateConcurrency(c *Concurrency, path *field.Path) field.ErrorList {
	errs := validateRange(c.Limit, MaxConcurrencyLimit, path.Child("limit"))
	return append(errs, validatePeriod(c.LeaseTimeout.Duration, path.Child("leaseTimeout"))...)
}

// validateQuota checks a quota's limit, its period and its time zone, which it looks up in the
// tz database (LoadTimeZone); an empty timeZone is DefaultTimeZone.
func validateQuota(q *Quota, path *field.Path) field.ErrorList {
	errs := validateRange(q.Limit, MaxQuotaLimit, path.Child("limit"))
	switch p := path.Child("period"); {
	case q.Period == "":
		errs = append(errs, field.Required(p, "one of Day, Week, Month, Year"))
	case !oneOf(q.Period, supportedPeriods):
		errs = append(errs, field.NotSupported(p, q.Period, supportedPeriods))
	}
	switch p := path.Child("timeZone"); {
	case len(q.TimeZone) > MaxTimeZoneLength:
		errs = append(errs, field.TooLong(p, q.TimeZone, MaxTimeZoneLength))
	default:
		if _, err := LoadTimeZone(q.TimeZone); err != nil {
			errs = append(errs, field.Invalid(p, q.TimeZone, err.Error()))
		}
	}
	return errs
}

func validateRange(v, maxValue int64, path *field.Path) field.ErrorList {
	if v < 1 || v > maxValue {
		return field.ErrorList{field.Invalid(path, v, fmt.Sprintf("must be between 1 and %d", maxValue))}
	}
	return nil
}

func validatePeriod(d time.Duration, path *field.Path) field.ErrorList {
	if d < MinPeriod || d > MaxPeriod {
		return field.ErrorList{field.Invalid(path, d.String(), fmt.Sprintf("must be between %v and %v", MinPeriod, MaxPeriod))}
	}
	return nil
}

func oneOf[T comparable](v T, values []T) bool {
	for _, x := range values {
		if v == x {
			return true
		}
	}
	return false
}
