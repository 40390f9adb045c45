package source

import (
	"bytes"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
)

// recorder counts reload outcomes.
type recorder struct {
	mu                  sync.Mutex
	successes, failures int
	lastSuccess         time.Time
}

func (r *recorder) ReloadSucceeded(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.successes++
	r.lastSuccess = at
}

func (r *recorder) ReloadFailed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures++
}

func (r *recorder) counts() (successes, failures int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.successes, r.failures
}

// swapRecorder is a Target that keeps every set it is given.
type swapRecorder struct {
	mu   sync.Mutex
	sets []*policy.Set
}

func (s *swapRecorder) Swap(set *policy.Set) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sets = append(s.sets, set)
}

func (s *swapRecorder) swaps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sets)
}

// loaded returns the IDs of the last swapped set, sorted.
func (s *swapRecorder) loaded() []v1alpha1.PolicyID {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sets) == 0 {
		return nil
	}
	var ids []v1alpha1.PolicyID
	for _, p := range s.sets[len(s.sets)-1].All() {
		ids = append(ids, p.ID)
	}
	slices.Sort(ids)
	return ids
}

// rlp returns a valid policy <namespace>/<name> with one token-bucket tier of the capacity.
func rlp(namespace, name string, capacity int64) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "standard",
			Tiers: []v1alpha1.Tier{{
				Name:        "standard",
				Algorithm:   v1alpha1.AlgorithmTokenBucket,
				TokenBucket: &v1alpha1.TokenBucket{Capacity: capacity, RefillRate: 1},
			}},
		},
	}
}

// invalid returns a policy whose default tier does not exist.
func invalid(namespace, name string) *v1alpha1.RateLimitPolicy {
	p := rlp(namespace, name, 1)
	p.Spec.DefaultTier = "missing"
	return p
}

func newTestPipeline(t *testing.T) (*Pipeline, *swapRecorder, *recorder, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	target, rec := &swapRecorder{}, &recorder{}
	p := NewPipeline(target, PipelineOptions{
		Logger:   slog.New(slog.NewJSONHandler(&logs, nil)),
		Observer: rec,
		Clock:    func() time.Time { return time.Unix(1700000000, 0) },
	})
	return p, target, rec, &logs
}

func TestPipelineMergesOrigins(t *testing.T) {
	p, target, rec, _ := newTestPipeline(t)
	if err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "one", 1), rlp("team", "two", 1)}); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply("configmap:ns/b", []*v1alpha1.RateLimitPolicy{rlp("", "three", 1)}); err != nil {
		t.Fatal(err)
	}
	if got, want := target.loaded(), []v1alpha1.PolicyID{"default/one", "default/three", "team/two"}; !slices.Equal(got, want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
	if s, f := rec.counts(); s != 2 || f != 0 {
		t.Errorf("reloads: %d successes, %d failures; want 2, 0", s, f)
	}
	if got := p.Policies("file:a"); !slices.Equal(got, []v1alpha1.PolicyID{"default/one", "team/two"}) {
		t.Errorf("origin a contributes %v", got)
	}
	// A new contribution replaces the origin's old one.
	if err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "four", 1)}); err != nil {
		t.Fatal(err)
	}
	if got, want := target.loaded(), []v1alpha1.PolicyID{"default/four", "default/three"}; !slices.Equal(got, want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
	p.Remove("configmap:ns/b")
	if got, want := target.loaded(), []v1alpha1.PolicyID{"default/four"}; !slices.Equal(got, want) {
		t.Fatalf("after removal: loaded %v, want %v", got, want)
	}
	p.Remove("configmap:never-seen") // no-op
	if target.swaps() != 4 {
		t.Errorf("swaps = %d, want 4", target.swaps())
	}
}

func TestPipelineKeepsLastGoodContribution(t *testing.T) {
	p, target, rec, logs := newTestPipeline(t)
	if err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "one", 5)}); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply("file:b", []*v1alpha1.RateLimitPolicy{rlp("default", "two", 5)}); err != nil {
		t.Fatal(err)
	}
	swaps := target.swaps()

	for name, bad := range map[string][]*v1alpha1.RateLimitPolicy{
		"invalid":       {rlp("default", "one", 6), invalid("default", "x")},
		"duplicate ID":  {rlp("default", "one", 6), rlp("default", "one", 7)},
		"nil policy":    {nil},
		"other's ID":    {rlp("default", "two", 6)},
		"zero capacity": {rlp("default", "one", 0)},
	} {
		if err := p.Apply("file:a", bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	p.Fail("file:a", errors.New("yaml: line 3: mapping values are not allowed"))
	if target.swaps() != swaps {
		t.Errorf("a rejected contribution swapped (%d swaps, want %d)", target.swaps(), swaps)
	}
	if got := p.Policies("file:a"); !slices.Equal(got, []v1alpha1.PolicyID{"default/one"}) {
		t.Errorf("origin a keeps %v, want its last good [default/one]", got)
	}
	if s, f := rec.counts(); s != 2 || f != 6 {
		t.Errorf("reloads: %d successes, %d failures; want 2, 6", s, f)
	}
	if !bytes.Contains(logs.Bytes(), []byte(`"msg":"policy contribution rejected"`)) ||
		!bytes.Contains(logs.Bytes(), []byte(`"origin":"file:a"`)) {
		t.Errorf("rejections not logged with their origin:\n%s", logs)
	}
}

func TestPipelineConflictResolvesWhenTheIDIsFreed(t *testing.T) {
	p, target, rec, _ := newTestPipeline(t)
	if err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "shared", 1)}); err != nil {
		t.Fatal(err)
	}
	err := p.Apply("file:b", []*v1alpha1.RateLimitPolicy{rlp("default", "shared", 2), rlp("default", "own", 1)})
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("conflicting contribution: %v, want ErrConflict", err)
	}
	if got := target.loaded(); !slices.Equal(got, []v1alpha1.PolicyID{"default/shared"}) {
		t.Fatalf("loaded %v, want only a's policy", got)
	}
	// a moves its policy away: b's waiting contribution goes in with the same swap.
	if err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "renamed", 1)}); err != nil {
		t.Fatal(err)
	}
	if got, want := target.loaded(), []v1alpha1.PolicyID{"default/own", "default/renamed", "default/shared"}; !slices.Equal(got, want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
	if got := p.Policies("file:b"); !slices.Equal(got, []v1alpha1.PolicyID{"default/own", "default/shared"}) {
		t.Errorf("b contributes %v", got)
	}
	if s, f := rec.counts(); s != 2 || f != 1 {
		t.Errorf("reloads: %d successes, %d failures; want 2, 1", s, f)
	}
}

func TestPipelineFailureReplacesAWaitingConflict(t *testing.T) {
	p, target, _, _ := newTestPipeline(t)
	_ = p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "shared", 1)})
	_ = p.Apply("file:b", []*v1alpha1.RateLimitPolicy{rlp("default", "shared", 2)})
	p.Fail("file:b", errors.New("unreadable")) // b's content changed again, to something broken
	p.Remove("file:a")
	if got := target.loaded(); len(got) != 0 {
		t.Fatalf("loaded %v, want nothing: b's conflicting content was superseded", got)
	}
}

func TestPipelineReadiness(t *testing.T) {
	e := engine.New(engine.Options{})
	rec := &recorder{}
	p := NewPipeline(e, PipelineOptions{Observer: rec, Logger: slog.New(slog.DiscardHandler)})
	p.Fail("file:a", errors.New("missing"))
	_ = p.Apply("file:b", []*v1alpha1.RateLimitPolicy{invalid("default", "x")})
	if err := p.Apply("file:c", nil); err != nil { // an empty contribution is valid...
		t.Fatal(err)
	}
	if e.Ready() {
		t.Fatal("ready without any policy") // ...but does not make the engine ready
	}
	if err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "one", 1)}); err != nil {
		t.Fatal(err)
	}
	if !e.Ready() || e.Policies().Len() != 1 {
		t.Fatalf("after a good contribution: ready %v", e.Ready())
	}
	p.Remove("file:a")
	if !e.Ready() || e.Policies().Len() != 0 {
		t.Fatalf("after removing the only origin: ready %v, %d policies; want ready with none", e.Ready(), e.Policies().Len())
	}
}

func TestPipelineDoesNotModifyItsInput(t *testing.T) {
	p, _, _, _ := newTestPipeline(t)
	in := rlp("", "one", 1)
	before := in.DeepCopy()
	if err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{in}); err != nil {
		t.Fatal(err)
	}
	if in.Namespace != before.Namespace || in.Spec.Tiers[0].TokenBucket.RefillPeriod != nil {
		t.Errorf("Apply modified its input: %+v", in)
	}
}

// quotaPolicy returns a valid policy <namespace>/<name> with one quota tier: 100 a day in zone.
func quotaPolicy(namespace, name, zone string) *v1alpha1.RateLimitPolicy {
	p := rlp(namespace, name, 1)
	p.Spec.Tiers[0] = v1alpha1.Tier{Name: "standard", Algorithm: v1alpha1.AlgorithmQuota,
		Quota: &v1alpha1.Quota{Limit: 100, Period: v1alpha1.CalendarPeriodDay, TimeZone: zone}}
	return p
}

// TestPipelineRefusesUnknownTimeZone: a zone the API server's tz database has (it refuses the
// others) may be missing from a replica's older one, and a policy file never met the API server.
// The pipeline refuses a zone it does not know, naming the field, and the origin's last good
// version of the policy keeps serving.
func TestPipelineRefusesUnknownTimeZone(t *testing.T) {
	p, target, rec, logs := newTestPipeline(t)
	if err := p.Apply("configmap:ns/a", []*v1alpha1.RateLimitPolicy{quotaPolicy("default", "metered", "Europe/Berlin")}); err != nil {
		t.Fatal(err)
	}
	swaps := target.swaps()
	err := p.Apply("configmap:ns/a", []*v1alpha1.RateLimitPolicy{quotaPolicy("default", "metered", "Europe/Atlantis")})
	if err == nil || !strings.Contains(err.Error(), `spec.tiers[0].quota.timeZone: Invalid value: "Europe/Atlantis": unknown time zone`) {
		t.Fatalf("Apply of an unknown zone: %v, want it refused naming spec.tiers[0].quota.timeZone", err)
	}
	if target.swaps() != swaps {
		t.Errorf("a policy of an unknown zone was swapped in")
	}
	if s, f := rec.counts(); s != 1 || f != 1 {
		t.Errorf("reloads: %d successes, %d failures; want 1, 1", s, f)
	}
	if !bytes.Contains(logs.Bytes(), []byte("unknown time zone")) {
		t.Errorf("the rejection's log does not say why:\n%s", logs)
	}
	set := target.sets[len(target.sets)-1]
	served, ok := set.Get("default/metered")
	if !ok {
		t.Fatal("the last good version is not served")
	}
	if q, _ := served.Default.Limit(0).(*limiter.Quota); q == nil {
		t.Fatalf("served tier %T, want the last good quota", served.Default.Limit(0))
	} else if _, _, loc := q.Params(); loc.String() != "Europe/Berlin" {
		t.Errorf("served zone %v, want the last good Europe/Berlin", loc)
	}
}

// TestPipelineCheck: a policy the Check option refuses is rejected as an invalid one.
func TestPipelineCheck(t *testing.T) {
	target, rec := &swapRecorder{}, &recorder{}
	refused := errors.New("not on this store")
	p := NewPipeline(target, PipelineOptions{
		Logger:   slog.New(slog.DiscardHandler),
		Observer: rec,
		Check: func(c *policy.Policy) error {
			if c.Default.Limit(0).Algorithm() == limiter.AlgorithmQuota {
				return refused
			}
			return nil
		},
	})
	if err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "one", 5)}); err != nil {
		t.Fatal(err)
	}
	err := p.Apply("file:a", []*v1alpha1.RateLimitPolicy{rlp("default", "two", 5), quotaPolicy("default", "one", "UTC")})
	if !errors.Is(err, refused) || !strings.Contains(err.Error(), "policy default/one: not on this store") {
		t.Fatalf("Apply of a policy Check refuses: %v", err)
	}
	if got := target.loaded(); !slices.Equal(got, []v1alpha1.PolicyID{"default/one"}) {
		t.Errorf("loaded %v, want the last good [default/one]", got)
	}
	if s, f := rec.counts(); s != 1 || f != 1 {
		t.Errorf("reloads: %d successes, %d failures; want 1, 1", s, f)
	}
}
