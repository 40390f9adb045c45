package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/ratelimitheaders"
)

const explainLong = `Explain which tier a client key gets, and why.

 Reads a policy file: RateLimitPolicy manifests, as you would kubectl apply them (the format
 of limiterd's --policy-file; several documents separated by "---" are fine). For KEY it
 prints:

  * the tier and the rule that chose it: the override listing KEY exactly, else the override
    listing the longest prefix of KEY, else the policy's default tier;
  * the tier's limits: each limit's algorithm and parameters (every limit of a stacked tier,
    by name);
  * the decision the first request of a new client with KEY would get for --cost units.

 The decision is made by limiterd's own engine on a fresh in-memory store, so it charges
 nothing and needs no cluster: test an override before you apply it. It is not the client's
 state on a running limiterd.

 When the file holds several policies, name one as POLICY: NAME or NAMESPACE/NAME (a policy
 without metadata.namespace is in "default").`

const explainExample = `  # Which tier does sub:acme-corp get in the sample policy, and would its first request pass?
  kubectl limiterd explain -f config/samples/ratelimitpolicy.yaml sub:acme-corp

  # The same for a request costing 50 units, as JSON
  kubectl limiterd explain -f config/samples/ratelimitpolicy.yaml sub:acme-corp --cost 50 -o json

  # A file with several policies: name the policy
  kubectl limiterd explain -f policies.yaml shop/api sub:alice`

// explainOptions are explain's flags.
type explainOptions struct {
	filename string
	cost     int64
	output   string
}

func newExplainCommand(stdout io.Writer, now func() time.Time) *cobra.Command {
	o := &explainOptions{}
	cmd := &cobra.Command{
		Use:                   "explain -f FILENAME [POLICY] KEY [--cost N] [-o json|yaml]",
		DisableFlagsInUseLine: true,
		Short:                 "Explain which tier a client key gets, why, and the decision it would get",
		Long:                  explainLong,
		Example:               explainExample,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("explain takes KEY, or POLICY KEY; got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(_ *cobra.Command, args []string) error {
			return o.run(stdout, args, now)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.filename, "filename", "f", "", "The policy file: RateLimitPolicy manifests, as for kubectl apply.")
	f.Int64Var(&o.cost, "cost", 1, "The units the request costs. 0 asks what a one-unit request would get without consuming it.")
	f.StringVarP(&o.output, "output", "o", "", "Output format. One of: (json, yaml). The default is a table.")
	return cmd
}

func (o *explainOptions) run(stdout io.Writer, args []string, now func() time.Time) error {
	switch o.output {
	case "", "json", "yaml":
	default:
		return usagef("unable to match a printer suitable for the output format %q, allowed formats are: json,yaml", o.output)
	}
	if o.filename == "" {
		return usagef("explain needs the policy file: give it with -f FILENAME (explaining against the policies of a cluster is not supported yet)")
	}
	if o.cost < 0 {
		return usagef("--cost must be 0 or more, not %d", o.cost)
	}
	key := args[len(args)-1]
	switch {
	case key == "":
		return usagef("KEY must not be empty: limiterd refuses decisions for an empty client key")
	case !utf8.ValidString(key):
		return usagef("KEY must be valid UTF-8, as limiterd's decisions API requires")
	}
	p, err := o.load(args[:len(args)-1])
	if err != nil {
		return err
	}
	x, err := explain(p, key, o.cost, now)
	if err != nil {
		return err
	}
	return printExplanation(stdout, x, o.output)
}

// printExplanation writes x in format: "" (a table), "json" or "yaml".
func printExplanation(w io.Writer, x *Explanation, format string) error {
	var b []byte
	var err error
	switch format {
	case "json":
		b, err = json.MarshalIndent(x, "", "    ")
		b = append(b, '\n')
	case "yaml":
		b, err = yaml.Marshal(x)
	default:
		return printTable(w, x)
	}
	if err != nil {
		return fmt.Errorf("encode the explanation: %w", err)
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write the explanation: %w", err)
	}
	return nil
}

// load reads the policy file and compiles the policy that policyArg (zero or one argument)
// names.
func (o *explainOptions) load(policyArg []string) (*policy.Policy, error) {
	data, err := os.ReadFile(o.filename)
	if err != nil {
		return nil, fmt.Errorf("read the policy file: %w", err)
	}
	sources, err := v1alpha1.DecodePolicies(data)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid policy file: %w (fix the file: it must hold RateLimitPolicy manifests that kubectl apply would accept)", o.filename, err)
	}
	if len(sources) == 0 {
		return nil, fmt.Errorf("%s holds no RateLimitPolicy", o.filename)
	}
	ids := make([]string, len(sources))
	for i := range sources {
		ids[i] = sources[i].ID().String()
	}
	var src *v1alpha1.RateLimitPolicy
	switch {
	case len(policyArg) == 1:
		name := policyArg[0]
		for i := range sources {
			id := sources[i].ID()
			if name == id.String() || (!strings.Contains(name, "/") && name == id.Name() && src == nil) {
				src = &sources[i]
			} else if !strings.Contains(name, "/") && name == id.Name() {
				return nil, usagef("%s holds several policies named %q: name one as NAMESPACE/NAME (%s)", o.filename, name, strings.Join(ids, ", "))
			}
		}
		if src == nil {
			return nil, usagef("%s holds no policy %q; it holds %s", o.filename, name, strings.Join(ids, ", "))
		}
	case len(sources) == 1:
		src = &sources[0]
	default:
		return nil, usagef("%s holds %d policies (%s): name one, as in kubectl limiterd explain -f %s POLICY KEY",
			o.filename, len(sources), strings.Join(ids, ", "), o.filename)
	}
	p, err := policy.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.filename, err)
	}
	return p, nil
}

// Explanation is explain's answer; -o json and -o yaml print it as is.
type Explanation struct {
	Policy     string `json:"policy"`
	Generation int64  `json:"generation"`
	Key        string `json:"key"`
	Tier       string `json:"tier"`
	// DryRun: the tier's decisions are counted but every request is allowed.
	DryRun bool   `json:"dryRun"`
	Reason Reason `json:"reason"`
	// Limits are the tier's limits; empty for an Unlimited tier.
	Limits   []Limit  `json:"limits"`
	Decision Decision `json:"decision"`
}

// Reason is why the key gets its tier.
type Reason struct {
	// Rule is "exact" (an override lists the key), "prefix" (an override lists the longest
	// prefix of the key) or "default" (no override names it: spec.defaultTier).
	Rule string `json:"rule"`
	// Field is the policy's field that decided: spec.overrides[i].clients[j],
	// spec.overrides[i].clientPrefixes[j] or spec.defaultTier.
	Field string `json:"field"`
	// Match is the key or prefix the override lists; absent for the default tier.
	Match string `json:"match,omitempty"`
	// Message says it in a sentence.
	Message string `json:"message"`
}

// Limit is one limit of the tier, with the parameters of its algorithm.
type Limit struct {
	// Name is the limit's name in a stacked tier (spec limits); "default" for a tier of one
	// limit, which decisions report under the tier's name.
	Name          string                  `json:"name"`
	Algorithm     v1alpha1.Algorithm      `json:"algorithm"`
	TokenBucket   *v1alpha1.TokenBucket   `json:"tokenBucket,omitempty"`
	SlidingWindow *v1alpha1.SlidingWindow `json:"slidingWindow,omitempty"`
	Quota         *v1alpha1.Quota         `json:"quota,omitempty"`
	Concurrency   *v1alpha1.Concurrency   `json:"concurrency,omitempty"`
}

// Decision is the decision of a new client's first request, as limiterd's decisions API
// reports it. Limit and Remaining are null for an Unlimited tier.
type Decision struct {
	Cost int64 `json:"cost"`
	// Allowed is the answer: always true on a dry-run tier.
	Allowed bool `json:"allowed"`
	// Outcome is Allowed, Rejected or DryRunRejected (a dry-run tier would have rejected it).
	Outcome           string `json:"outcome"`
	Limit             *int64 `json:"limit"`
	Remaining         *int64 `json:"remaining"`
	ResetAfterSeconds int64  `json:"resetAfterSeconds"`
	// RetryAfterSeconds is, for a rejection, when the same cost could be admitted; 0 with
	// Never set when no wait admits it (the cost is above the limit).
	RetryAfterSeconds int64 `json:"retryAfterSeconds"`
	Never             bool  `json:"never,omitempty"`
	// Binding is the limit of a stacked tier that the top-level fields report: the one
	// closest to exhaustion, or the one that rejected.
	Binding string          `json:"binding,omitempty"`
	Limits  []LimitDecision `json:"limits,omitempty"`
}

// LimitDecision is one limit's part of a stacked tier's decision.
type LimitDecision struct {
	Name              string `json:"name"`
	Allowed           bool   `json:"allowed"`
	Limit             int64  `json:"limit"`
	Remaining         int64  `json:"remaining"`
	ResetAfterSeconds int64  `json:"resetAfterSeconds"`
}

// explain resolves key in p and decides cost units for it, at now, on a fresh in-memory store
// of limiterd's engine.
func explain(p *policy.Policy, key string, cost int64, now func() time.Time) (*Explanation, error) {
	r := p.Explain(key)
	src := &p.Source.Spec
	x := &Explanation{
		Policy:     p.ID.String(),
		Generation: p.Generation,
		Key:        key,
		Tier:       r.Tier.Name,
		DryRun:     r.Tier.DryRun,
		Reason:     reason(src, r),
		Limits:     limits(&src.Tiers[r.Tier.Index]),
	}
	set, err := policy.NewSet(p)
	if err != nil {
		return nil, err
	}
	e := engine.New(engine.Options{Clock: now})
	e.Swap(set)
	res, err := e.Decide(context.Background(), p.ID, key, cost)
	if err != nil {
		return nil, fmt.Errorf("decide: %w", err)
	}
	if res.Tier != r.Tier { // one resolution path: cannot differ
		return nil, fmt.Errorf("the engine resolved %q to tier %s, the policy to %s", key, res.Tier.Name, r.Tier.Name)
	}
	d := Decision{
		Cost:              cost,
		Allowed:           res.Allowed,
		Outcome:           outcome(res.Outcome),
		ResetAfterSeconds: ratelimitheaders.Seconds(res.ResetAfter),
	}
	if res.Outcome != engine.Allowed {
		if res.RetryAfter > 0 {
			d.RetryAfterSeconds = ratelimitheaders.RetryAfterSeconds(res.RetryAfter)
		} else {
			d.Never = true
		}
	}
	if res.Tier.Limited() {
		d.Limit, d.Remaining = &res.Limit, &res.Remaining
	}
	if res.Tier.Stacked {
		d.Binding = res.Tier.Stack.Name(res.Binding)
		for i, l := range res.Limits {
			d.Limits = append(d.Limits, LimitDecision{Name: res.Tier.Stack.Name(i), Allowed: l.Allowed,
				Limit: l.Limit, Remaining: l.Remaining, ResetAfterSeconds: ratelimitheaders.Seconds(l.ResetAfter)})
		}
	}
	x.Decision = d
	return x, nil
}

// outcome names o as the Decision reports it.
func outcome(o engine.Outcome) string {
	switch o {
	case engine.Allowed:
		return "Allowed"
	case engine.Rejected:
		return "Rejected"
	case engine.DryRunRejected:
		return "DryRunRejected"
	}
	return o.String()
}

// reason describes resolution r in terms of the policy's fields.
func reason(spec *v1alpha1.RateLimitPolicySpec, r policy.Resolution) Reason {
	switch r.Kind {
	case policy.MatchExact:
		j := slices.Index(spec.Overrides[r.Override].Clients, r.Match)
		field := fmt.Sprintf("spec.overrides[%d].clients[%d]", r.Override, j)
		return Reason{Rule: r.Kind.String(), Field: field, Match: r.Match,
			Message: fmt.Sprintf("exact override: %s is %q", field, r.Match)}
	case policy.MatchPrefix:
		j := slices.Index(spec.Overrides[r.Override].ClientPrefixes, r.Match)
		field := fmt.Sprintf("spec.overrides[%d].clientPrefixes[%d]", r.Override, j)
		return Reason{Rule: r.Kind.String(), Field: field, Match: r.Match,
			Message: fmt.Sprintf("prefix override: %s is %q, the longest listed prefix of the key, and no override lists the key itself", field, r.Match)}
	case policy.MatchDefault:
	}
	return Reason{Rule: r.Kind.String(), Field: "spec.defaultTier",
		Message: "default tier: no override lists the key or a prefix of it"}
}

// limits returns the limits of tier t of the defaulted spec.
func limits(t *v1alpha1.Tier) []Limit {
	if t.Limits == nil {
		if t.Algorithm == v1alpha1.AlgorithmUnlimited {
			return []Limit{}
		}
		return []Limit{{Name: "default", Algorithm: t.Algorithm, TokenBucket: t.TokenBucket, SlidingWindow: t.SlidingWindow, Quota: t.Quota, Concurrency: t.Concurrency}}
	}
	out := make([]Limit, len(t.Limits))
	for i, l := range t.Limits {
		out[i] = Limit{Name: l.Name, Algorithm: l.Algorithm, TokenBucket: l.TokenBucket, SlidingWindow: l.SlidingWindow, Quota: l.Quota, Concurrency: l.Concurrency}
	}
	return out
}

// parameters describes a limit's parameters in a table cell.
func parameters(l *Limit) string {
	switch {
	case l.TokenBucket != nil:
		tb := l.TokenBucket
		period := v1alpha1.DefaultRefillPeriod
		if tb.RefillPeriod != nil {
			period = tb.RefillPeriod.Duration
		}
		return fmt.Sprintf("capacity %d, refill %d per %s", tb.Capacity, tb.RefillRate, period)
	case l.SlidingWindow != nil:
		return fmt.Sprintf("%d per %s window", l.SlidingWindow.Limit, l.SlidingWindow.Window.Duration)
	case l.Quota != nil:
		zone := l.Quota.TimeZone
		if zone == "" {
			zone = "UTC"
		}
		return fmt.Sprintf("%d per calendar %s (%s)", l.Quota.Limit, strings.ToLower(string(l.Quota.Period)), zone)
	case l.Concurrency != nil:
		return fmt.Sprintf("%d in flight, lease timeout %s", l.Concurrency.Limit, l.Concurrency.LeaseTimeout.Duration)
	}
	return "-"
}

// printTable prints x as kubectl prints objects: a summary row, then one row per limit.
func printTable(w io.Writer, x *Explanation) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	tier := x.Tier
	if x.DryRun {
		tier += " (dry run)"
	}
	d := &x.Decision
	fmt.Fprintln(tw, "POLICY\tKEY\tTIER\tRULE\tFIELD\tCOST\tDECISION")
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", x.Policy, x.Key, tier, x.Reason.Rule, x.Reason.Field, d.Cost, decisionCell(d))
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "LIMIT\tALGORITHM\tPARAMETERS\tALLOWED\tREMAINING\tRESET AFTER")
	switch {
	case len(x.Limits) == 0:
		fmt.Fprintf(tw, "-\tUnlimited\tno limit\t%t\t-\t-\n", d.Allowed)
	case d.Limits == nil: // one limit: the decision's fields are its
		l := &x.Limits[0]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%d/%d\t%ds\n", l.Name, l.Algorithm, parameters(l),
			d.Outcome == "Allowed", *d.Remaining, *d.Limit, d.ResetAfterSeconds)
	default:
		for i := range x.Limits {
			l, ld := &x.Limits[i], &d.Limits[i]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%d/%d\t%ds\n", l.Name, l.Algorithm, parameters(l),
				ld.Allowed, ld.Remaining, ld.Limit, ld.ResetAfterSeconds)
		}
	}
	fmt.Fprintln(tw)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write the explanation: %w", err)
	}
	if _, err := fmt.Fprintf(w, "Reason: %s.\nDecision: the first request of a new client, on a fresh in-memory store; nothing was charged.\n", x.Reason.Message); err != nil {
		return fmt.Errorf("write the explanation: %w", err)
	}
	return nil
}

// decisionCell summarises the decision in the summary row.
func decisionCell(d *Decision) string {
	s := d.Outcome
	if d.Binding != "" && d.Outcome != "Allowed" {
		s += " by " + d.Binding
	}
	switch {
	case d.Outcome == "Allowed":
	case d.Never:
		s += " (retry: never, the cost is above the limit)"
	default:
		s += " (retry after " + strconv.FormatInt(d.RetryAfterSeconds, 10) + "s)"
	}
	return s
}
