package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	redisstore "github.com/limiterd/limiterd/limiterd/store/redis"
)

// TestRedisRefusesConcurrencyPolicies: on --store redis, the pipeline's check (redisDecides)
// refuses a compiled policy with a Concurrency limit, a tier's own or a stacked one, naming
// where it is, and accepts the algorithms the Redis scripts decide. (The tiers are built here
// as policy.Compile builds them; TestPolicyFileWithConcurrencyRefusedOnRedis goes through a
// policy file.)
func TestRedisRefusesConcurrencyPolicies(t *testing.T) {
	cc, err := limiter.NewConcurrency(3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := limiter.NewTokenBucket(3, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	stack := func(names []string, limits ...limiter.RateLimiter) *limiter.Stack {
		st, err := limiter.NewStack(names, limits)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, c := range []struct {
		tier  *policy.Tier
		where string // "": accepted
	}{
		{&policy.Tier{Name: "rated", Stack: stack([]string{limiter.DefaultLimitName}, tb)}, ""},
		{&policy.Tier{Name: "free"}, ""}, // Unlimited
		{&policy.Tier{Name: "slow", Stack: stack([]string{limiter.DefaultLimitName}, cc)}, "tier slow:"},
		{&policy.Tier{Name: "both", Stacked: true, Stack: stack([]string{"rate", "inflight"}, tb, cc)}, "tier both, limit inflight:"},
	} {
		err := redisDecides(&policy.Policy{Tiers: []*policy.Tier{c.tier}})
		switch {
		case c.where == "" && err != nil:
			t.Errorf("tier %s: refused: %v", c.tier.Name, err)
		case c.where != "" && (!errors.Is(err, redisstore.ErrConcurrencyUnsupported) || !strings.HasPrefix(err.Error(), c.where)):
			t.Errorf("tier %s: %v, want ErrConcurrencyUnsupported after %q", c.tier.Name, err, c.where)
		}
	}
}
