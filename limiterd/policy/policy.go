// Package policy compiles a RateLimitPolicy into what limiterd decides with: its tiers as
// strategies and a resolver from client key to tier.
//
// A compiled Policy is immutable and safe for concurrent use. Resolving a key costs O(len(key))
// whatever the number of overrides: an exact-key map, then a byte trie of prefixes that remembers
// the longest prefix matched on the way down, then the default tier.
package policy

import (
	"fmt"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/ratelimitheaders"
)

// Tier is one compiled tier: a stack of limits, shared by every client resolved to it. A tier
// of one limit (spec algorithm) is a stack of one limit named limiter.DefaultLimitName: every
// layer decides on stacks alone, and the stores keep that limit's state where the single-limit
// form always kept it.
type Tier struct {
	// Name is the tier's name in the policy.
	Name string
	// Index is the tier's position in Policy.Tiers.
	Index int
	// Stack decides for the tier's clients, all or nothing; nil for an Unlimited tier, which
	// admits everything and keeps no state.
	Stack *limiter.Stack
	// Stacked says that the tier lists its limits (spec limits): answers name and report each
	// limit. A tier of one limit (spec algorithm) answers as that limit.
	Stacked bool
	// DryRun means decisions are made and counted but the answer is always "allowed".
	DryRun bool

	headerNames []string // by limit: the names the header fields give the limits
}

// Limited reports whether the tier has a quota to advertise: any tier but an Unlimited one.
func (t *Tier) Limited() bool { return t.Stack != nil }

// NumLimits returns the number of the tier's limits: 0 for an Unlimited tier.
func (t *Tier) NumLimits() int {
	if t.Stack == nil {
		return 0
	}
	return t.Stack.Len()
}

// Limit returns the strategy of limit i.
func (t *Tier) Limit(i int) limiter.RateLimiter { return t.Stack.Limiter(i) }

// HeaderName returns the name that the RateLimit and RateLimit-Policy header fields, and an
// Envoy rate limit, give limit i: the tier's name for a tier of one limit, "<tier>/<limit>"
// for a limit of a stacked tier; with the policy's tierNames Hidden, v1alpha1.HiddenTierName
// stands for the tier's name. The names are built when the policy is compiled.
func (t *Tier) HeaderName(i int) string { return t.headerNames[i] }

// AppendRateLimitPolicy appends the value of the tier's RateLimit-Policy header field: one item
// per limit, named HeaderName, with its quota and the window it is expressed over (draft-10 lets
// a field list several), the limit's Window: a token bucket's full refill, a sliding window's
// window, and for a calendar quota the longest its period lasts (86400 s for a day, 604800 for
// a week, 2678400 for a month, 31622400 for a year), a constant, as the draft wants the field
// to stay the same from one answer to the next; when the current period ends is the RateLimit
// field's t. A concurrency limit's quota is its places and its window its leaseTimeout, the
// longest a place is held without a release; its item carries the draft's quota unit
// qu="concurrent-requests", since it admits q at once rather than q per w. An unlimited tier
// has none.
func (t *Tier) AppendRateLimitPolicy(b []byte) []byte {
	for i := range t.NumLimits() {
		if i > 0 {
			b = append(b, ", "...)
		}
		rl := t.Limit(i)
		b = ratelimitheaders.AppendPolicy(b, t.HeaderName(i), rl.Limit(), rl.Window())
		switch rl.Algorithm() {
		case limiter.AlgorithmConcurrency:
			b = ratelimitheaders.AppendQuotaUnit(b, ratelimitheaders.UnitConcurrentRequests)
		case limiter.AlgorithmTokenBucket, limiter.AlgorithmSlidingWindow, limiter.AlgorithmQuota, limiter.AlgorithmUnlimited:
			// requests, the draft's default unit: no qu
		}
	}
	return b
}

// Policy is a compiled RateLimitPolicy.
type Policy struct {
	// ID is the policy's identity in requests, metrics and stores.
	ID v1alpha1.PolicyID
	// Generation is the metadata.generation of the compiled spec.
	Generation int64
	// FailureMode says how to decide when the shared store cannot be reached.
	FailureMode v1alpha1.FailureMode
	// Refunds says whether admitted decisions carry a reservation that a refund may name
	// (spec.refunds Enabled); without it every refund is refused.
	Refunds bool
	// Tiers are the compiled tiers in spec order.
	Tiers []*Tier
	// Default is the tier of clients no override names.
	Default *Tier
	// Source is the validated, defaulted policy it was compiled from. Do not modify it.
	Source *v1alpha1.RateLimitPolicy
	// Gateway derives the client keys of forward-auth requests (spec.gateway); nil when the
	// policy has none, and then it does not answer forward-auth requests.
	Gateway *KeyExtractor

	exact    map[string]target
	prefixes trie
}

// target is what an override key resolves to: the tier and the override naming it.
type target struct {
	tier     *Tier
	override int // index in Source.Spec.Overrides
}

// Compile validates p (with v1alpha1.Validate) and compiles it. p is not modified; the Policy
// keeps a defaulted copy.
func Compile(p *v1alpha1.RateLimitPolicy) (*Policy, error) {
	src := p.DeepCopy()
	src.Default()
	id := src.ID()
	src.Namespace = id.Namespace()
	if err := v1alpha1.Validate(src); err != nil {
		return nil, fmt.Errorf("policy %s: %w", id, err)
	}
	c := &Policy{
		ID:          id,
		Generation:  src.Generation,
		FailureMode: src.Spec.FailureMode,
		Refunds:     src.Spec.Refunds == v1alpha1.RefundsEnabled,
		Source:      src,
		exact:       make(map[string]target),
	}
	byName := make(map[string]*Tier, len(src.Spec.Tiers))
	for i := range src.Spec.Tiers {
		t := &src.Spec.Tiers[i]
		tier := &Tier{Name: t.Name, Index: i, DryRun: t.DryRun, Stacked: t.Limits != nil}
		headerName := t.Name
		if src.Spec.TierNames == v1alpha1.TierNamesHidden {
			headerName = v1alpha1.HiddenTierName
		}
		var err error
		tier.Stack, err = stack(t)
		if err != nil {
			return nil, fmt.Errorf("policy %s: spec.tiers[%d]: %w", c.ID, i, err)
		}
		for j := range tier.NumLimits() {
			name := tier.Stack.Name(j)
			if tier.Stacked {
				tier.headerNames = append(tier.headerNames, headerName+"/"+name)
			} else {
				tier.headerNames = append(tier.headerNames, headerName)
			}
		}
		c.Tiers = append(c.Tiers, tier)
		byName[t.Name] = tier
	}
	c.Default = byName[src.Spec.DefaultTier]
	if src.Spec.Gateway != nil {
		c.Gateway = compileGateway(src.Spec.Gateway)
	}
	for i, o := range src.Spec.Overrides {
		for _, k := range o.Clients {
			c.exact[k] = target{byName[o.Tier], i}
		}
		for _, k := range o.ClientPrefixes {
			c.prefixes.insert(k, target{byName[o.Tier], i})
		}
	}
	return c, nil
}

// params are the parameter blocks of a limit: a tier's, or a stacked tier's limit's.
type params struct {
	tokenBucket   *v1alpha1.TokenBucket
	slidingWindow *v1alpha1.SlidingWindow
	quota         *v1alpha1.Quota
	concurrency   *v1alpha1.Concurrency
}

// strategy builds the strategy of a limit. Validate has already checked the parameters; the
// constructors check them again, so a mismatch in bounds is an error, not a panic. A quota's
// time zone is looked up again (v1alpha1.LoadTimeZone), from the same tz database.
func strategy(a v1alpha1.Algorithm, p params) (limiter.RateLimiter, error) {
	switch a {
	case v1alpha1.AlgorithmTokenBucket:
		tb := p.tokenBucket
		period := v1alpha1.DefaultRefillPeriod
		if tb.RefillPeriod != nil {
			period = tb.RefillPeriod.Duration
		}
		return limiter.NewTokenBucket(tb.Capacity, tb.RefillRate, period)
	case v1alpha1.AlgorithmSlidingWindow:
		return limiter.NewSlidingWindow(p.slidingWindow.Limit, p.slidingWindow.Window.Duration)
	case v1alpha1.AlgorithmQuota:
		q := p.quota
		loc, err := v1alpha1.LoadTimeZone(q.TimeZone)
		if err != nil {
			return nil, fmt.Errorf("quota.timeZone %q: %w", q.TimeZone, err)
		}
		return limiter.NewQuota(q.Limit, calendarPeriod(q.Period), loc)
	case v1alpha1.AlgorithmConcurrency:
		return limiter.NewConcurrency(p.concurrency.Limit, p.concurrency.LeaseTimeout.Duration)
	case v1alpha1.AlgorithmUnlimited: // no strategy: see stack
	}
	return nil, fmt.Errorf("algorithm %q has no strategy", a)
}

// calendarPeriod returns the limiter's period of an API period; 0, which limiter.NewQuota
// refuses, for one it does not know.
func calendarPeriod(p v1alpha1.CalendarPeriod) limiter.CalendarPeriod {
	switch p {
	case v1alpha1.CalendarPeriodDay:
		return limiter.PeriodDay
	case v1alpha1.CalendarPeriodWeek:
		return limiter.PeriodWeek
	case v1alpha1.CalendarPeriodMonth:
		return limiter.PeriodMonth
	case v1alpha1.CalendarPeriodYear:
		return limiter.PeriodYear
	}
	return 0
}

// stack builds a tier's stack: its limits (spec limits), or its one limit (spec algorithm) named
// limiter.DefaultLimitName; nil for an Unlimited tier.
func stack(t *v1alpha1.Tier) (*limiter.Stack, error) {
	if t.Limits == nil {
		if t.Algorithm == v1alpha1.AlgorithmUnlimited {
			return nil, nil
		}
		rl, err := strategy(t.Algorithm, params{t.TokenBucket, t.SlidingWindow, t.Quota, t.Concurrency})
		if err != nil {
			return nil, err
		}
		return limiter.NewStack([]string{limiter.DefaultLimitName}, []limiter.RateLimiter{rl})
	}
	names := make([]string, len(t.Limits))
	limits := make([]limiter.RateLimiter, len(t.Limits))
	for j := range t.Limits {
		l := &t.Limits[j]
		rl, err := strategy(l.Algorithm, params{l.TokenBucket, l.SlidingWindow, l.Quota, l.Concurrency})
		if err != nil {
			return nil, fmt.Errorf("limits[%d]: %w", j, err)
		}
		names[j], limits[j] = l.Name, rl
	}
	st, err := limiter.NewStack(names, limits)
	if err != nil {
		return nil, fmt.Errorf("limits: %w", err)
	}
	return st, nil
}

// Resolve returns the tier of a client key: Explain(key).Tier.
func (p *Policy) Resolve(key string) *Tier { return p.Explain(key).Tier }

// MatchKind says which rule of a policy gave a key its tier.
type MatchKind uint8

// The rules, in the order Explain tries them.
const (
	// MatchExact: an override lists the key in its clients.
	MatchExact MatchKind = iota + 1
	// MatchPrefix: an override lists a prefix of the key in its clientPrefixes, and no override
	// lists a longer one.
	MatchPrefix
	// MatchDefault: no override names the key; it gets spec.defaultTier.
	MatchDefault
)

// String returns "exact", "prefix" or "default".
func (k MatchKind) String() string {
	switch k {
	case MatchExact:
		return "exact"
	case MatchPrefix:
		return "prefix"
	case MatchDefault:
		return "default"
	}
	return fmt.Sprintf("MatchKind(%d)", uint8(k))
}

// Resolution is a key's tier and why it gets it.
type Resolution struct {
	// Tier is the key's tier.
	Tier *Tier
	// Kind is the rule that chose it.
	Kind MatchKind
	// Override is the index in Source.Spec.Overrides of the override that chose the tier, -1
	// for MatchDefault.
	Override int
	// Match is the client key (MatchExact) or the prefix (MatchPrefix) that the override lists
	// and the key matched; "" for MatchDefault.
	Match string
}

// Explain returns the tier of a client key and why: the override naming the key exactly, else
// the override with the longest prefix of the key, else the default tier. Resolve, which every
// decision uses, is its Tier. A key of any length is resolved in O(min(len(key),
// v1alpha1.MaxClientKeyBytes)): overrides name keys and prefixes of at most MaxClientKeyBytes,
// so a longer key is named by no exact override and matches a prefix exactly when its first
// MaxClientKeyBytes bytes do.
func (p *Policy) Explain(key string) Resolution {
	if len(key) <= v1alpha1.MaxClientKeyBytes {
		if t, ok := p.exact[key]; ok {
			return Resolution{Tier: t.tier, Kind: MatchExact, Override: t.override, Match: key}
		}
	}
	if t, n := p.prefixes.longest(key); t.tier != nil {
		return Resolution{Tier: t.tier, Kind: MatchPrefix, Override: t.override, Match: key[:n]}
	}
	return Resolution{Tier: p.Default, Kind: MatchDefault, Override: -1}
}

// trie maps key prefixes to tiers; its zero value is empty.
type trie struct {
	root *node
}

// node is a trie node; edges are kept in a small sorted slice (fan-out is small in practice).
type node struct {
	target target // tier nil: no prefix ends here
	labels []byte
	kids   []*node
}

func (n *node) child(b byte) *node {
	for i, l := range n.labels {
		if l == b {
			return n.kids[i]
		}
	}
	return nil
}

func (t *trie) insert(prefix string, to target) {
	if t.root == nil {
		t.root = &node{}
	}
	n := t.root
	for i := 0; i < len(prefix); i++ {
		next := n.child(prefix[i])
		if next == nil {
			next = &node{}
			n.labels = append(n.labels, prefix[i])
			n.kids = append(n.kids, next)
		}
		n = next
	}
	n.target = to
}

// longest returns the target of the longest inserted prefix of key and that prefix's length;
// a zero target (tier nil) if none is.
func (t *trie) longest(key string) (found target, length int) {
	n := t.root
	for i := 0; n != nil; i++ {
		if n.target.tier != nil {
			found, length = n.target, i
		}
		if i == len(key) {
			break
		}
		n = n.child(key[i])
	}
	return found, length
}

// Set is an immutable snapshot of the loaded policies, keyed by ID.
type Set struct {
	byID map[v1alpha1.PolicyID]*Policy
}

// NewSet returns a snapshot of the given policies. IDs must be unique.
func NewSet(policies ...*Policy) (*Set, error) {
	s := &Set{byID: make(map[v1alpha1.PolicyID]*Policy, len(policies))}
	for _, p := range policies {
		if _, dup := s.byID[p.ID]; dup {
			return nil, fmt.Errorf("policy %s is defined twice", p.ID)
		}
		s.byID[p.ID] = p
	}
	return s, nil
}

// Get returns a policy by ID.
func (s *Set) Get(id v1alpha1.PolicyID) (*Policy, bool) {
	p, ok := s.byID[id]
	return p, ok
}

// Len returns the number of policies.
func (s *Set) Len() int { return len(s.byID) }

// All returns the policies in no particular order.
func (s *Set) All() []*Policy {
	out := make([]*Policy, 0, len(s.byID))
	for _, p := range s.byID {
		out = append(out, p)
	}
	return out
}
