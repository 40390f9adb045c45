package redis

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// TestTokenBucketDecisionMakesTwoFunctions checks that in every script that decides a token
// bucket, a decision on one bucket (decide.lua's head, which returns it) comes after no function
// but the token bucket's decision, tbDebt and tbSet: Redis makes each function a script's body
// reaches anew on every call, and the most common call must not pay for the library's others.
func TestTokenBucketDecisionMakesTwoFunctions(t *testing.T) {
	function := regexp.MustCompile(`(?m)^\s*local function (\w+)`)
	for set := withTokenBucket; set <= withAll; set++ {
		if set&withTokenBucket == 0 {
			continue
		}
		for full := range 2 {
			src := decideScripts[set][full].source
			head, _, ok := strings.Cut(src, entrySplit)
			if !ok {
				t.Fatalf("script of set %d (full %d): no line %q", set, full, entrySplit)
			}
			var made []string
			for _, m := range function.FindAllStringSubmatch(head, -1) {
				made = append(made, m[1])
			}
			if want := []string{"tbDebt", "tbSet"}; !slices.Equal(made, want) {
				t.Errorf("script of set %d (full %d): a decision on one token bucket makes the functions %v, want %v", set, full, made, want)
			}
			if !strings.Contains(head, "return reply") {
				t.Errorf("script of set %d (full %d): the head does not answer a decision on one token bucket", set, full)
			}
		}
	}
}

// TestTokenBucketDecisionOwnWay checks that the head of a token bucket's script (its first
// sections and decide.lua up to entrySplit) answers, by itself, each decision on one bucket whose
// key holds its own state or none, admitted, rejected or over the capacity, on either clock: the
// decision returns before the script makes the rest of the library (which a script cut there
// lacks: it answers an error instead). A key that another strategy wrote goes the general way.
func TestTokenBucketDecisionOwnWay(t *testing.T) {
	t.Parallel()
	caller := newClient(t, testOptions(shared(t).Addr()))
	server := newClient(t, Options{Addrs: []string{shared(t).Addr()}, ExpirySlack: time.Hour, Timeout: 10 * time.Second})
	head, _, _ := strings.Cut(decideScripts[withTokenBucket][0].source, entrySplit)
	const general = "the general way"
	cut := rueidis.NewLuaScript(head + "\nreturn redis.error_reply('" + general + "')")
	run := func(c *Client, key string, now time.Time, cost int64) (int64, error) {
		t.Helper()
		cn, err := c.get()
		if err != nil {
			t.Fatal(err)
		}
		s := c.Store(t.Name())
		call := s.newCall(key, limitertest.One(tokenBucket(t, 3, 1, time.Second)), now, cost, modeDecide)
		arr, err := cut.Exec(t.Context(), cn, call.keys, s.callArgs(call)).ToArray()
		if err != nil {
			return 0, err
		}
		head, err := integers(arr, replyLimits)
		if err != nil {
			t.Fatal(err)
		}
		return head[replyOutcome], nil
	}
	for _, step := range []struct {
		c       *Client
		key     string
		at      time.Duration // after T0 (the server's clock ignores it)
		cost    int64
		outcome int64
	}{
		{caller, "k", 0, 1, outcomeAdmitted}, // fresh
		{caller, "k", 0, 2, outcomeAdmitted}, // on its TAT
		{caller, "k", 0, 1, outcomeRejected},
		{caller, "k", 0, 4, outcomeRejected}, // over the capacity
		{caller, "k", time.Second, 1, outcomeAdmitted},
		{server, "s", 0, 1, outcomeAdmitted},
		{server, "s", 0, 1, outcomeAdmitted},
	} {
		if got, err := run(step.c, step.key, limitertest.T0.Add(step.at), step.cost); err != nil || got != step.outcome {
			t.Fatalf("%s at %v, cost %d: outcome %d, %v; want %d from the head", step.key, step.at, step.cost, got, err, step.outcome)
		}
	}
	do(t, caller, "SET", Key(t.Name(), "other"), "tb:1:2:3 0 0 0")
	if _, err := run(caller, "other", limitertest.T0, 1); err == nil || !strings.Contains(err.Error(), general) {
		t.Fatalf("a key another strategy wrote: %v, want the general way", err)
	}
}
