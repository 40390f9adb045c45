package envoyrls

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/server"
)

const (
	ok        = rlsv3.RateLimitResponse_OK
	overLimit = rlsv3.RateLimitResponse_OVER_LIMIT
)

func TestSingleDescriptorOKThenOverLimit(t *testing.T) {
	clock := testsupport.NewClock()
	// 2 tokens, 1 a second: a full refill takes 2 s.
	e := newEngine(t, clock, newPolicy("edge", "api", testsupport.TokenBucketTier("standard", 2, 1, time.Second)))
	c := dial(t, e)
	req := request("edge/api", entries("client", "alice"))
	wantLimit := &rlsv3.RateLimitResponse_RateLimit{
		Name: "standard", RequestsPerUnit: 2, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND,
		UnitMultiplier: wrapperspb.UInt32(2),
	}
	for i, w := range []struct {
		code                  rlsv3.RateLimitResponse_Code
		remaining             uint32
		reset                 time.Duration
		rateLimit, retryAfter string
	}{
		{ok, 1, time.Second, `"standard";r=1;t=1`, ""},
		{ok, 0, 2 * time.Second, `"standard";r=0;t=2`, ""},
		{overLimit, 0, 2 * time.Second, `"standard";r=0;t=2`, "1"},
	} {
		resp, err := c.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		want := &rlsv3.RateLimitResponse{
			OverallCode: w.code,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
				Code: w.code, CurrentLimit: wantLimit, LimitRemaining: w.remaining,
				DurationUntilReset: durationpb.New(w.reset),
			}},
		}
		got := proto.Clone(resp).(*rlsv3.RateLimitResponse)
		got.ResponseHeadersToAdd = nil
		if !proto.Equal(got, want) {
			t.Errorf("request %d:\n got %v\nwant %v", i, got, want)
		}
		h := headerMap(t, resp)
		if h["Ratelimit-Policy"] != `"standard";q=2;w=2` || h["Ratelimit"] != w.rateLimit || h["Retry-After"] != w.retryAfter {
			t.Errorf("request %d: headers %q, want RateLimit %q and Retry-After %q", i, h, w.rateLimit, w.retryAfter)
		}
		if n := len(resp.GetResponseHeadersToAdd()); w.retryAfter == "" && n != 2 {
			t.Errorf("request %d: %d headers, want 2", i, n)
		}
	}
	// Half a token back after 0.5 s: still over limit; a whole one after 1 s.
	clock.Advance(500 * time.Millisecond)
	if resp, err := c.ShouldRateLimit(t.Context(), req); err != nil || resp.GetOverallCode() != overLimit {
		t.Fatalf("after 0.5 s: %v %v, want OVER_LIMIT", resp, err)
	}
	clock.Advance(500 * time.Millisecond)
	if resp, err := c.ShouldRateLimit(t.Context(), req); err != nil || resp.GetOverallCode() != ok {
		t.Fatalf("after 1 s: %v %v, want OK", resp, err)
	}
}

// TestHeadersMatchTheHTTPAPI runs the same decisions through the HTTP API and the gRPC service
// (two engines on one clock) and compares the header fields each answer carries.
func TestHeadersMatchTheHTTPAPI(t *testing.T) {
	dryRun := testsupport.SlidingWindowTier("trial", 1, time.Minute)
	dryRun.DryRun = true
	tiers := []v1alpha1.Tier{
		testsupport.TokenBucketTier("bucket", 3, 2, 1500*time.Millisecond),
		testsupport.SlidingWindowTier("window", 2, 90*time.Second),
		testsupport.UnlimitedTier("free"),
		dryRun,
		testsupport.StackedTier("stack", testsupport.TokenBucketLimit("burst", 3, 2, 1500*time.Millisecond),
			testsupport.SlidingWindowLimit("minute", 4, time.Minute)),
	}
	for _, tier := range tiers {
		t.Run(tier.Name, func(t *testing.T) {
			clock := testsupport.NewClock()
			p := newPolicy("default", "api", tier)
			h := server.NewDecisions(newEngine(t, clock, p), nil)
			c := dial(t, newEngine(t, clock, p))
			for i := range 6 {
				cost := int64(i%2 + 1)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/allow?policy=default/api&key=k&cost="+strconv.FormatInt(cost, 10), nil))
				req := request("api", entries("k", "v"))
				req.HitsAddend = uint32(cost)
				resp, err := c.ShouldRateLimit(t.Context(), req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if (rec.Code == http.StatusTooManyRequests) != (resp.GetOverallCode() == overLimit) {
					t.Errorf("request %d: HTTP %d, gRPC %v", i, rec.Code, resp.GetOverallCode())
				}
				got := headerMap(t, resp)
				for _, name := range []string{"Ratelimit-Policy", "Ratelimit", "Retry-After"} {
					if want := strings.Join(rec.Header().Values(name), ", "); got[name] != want {
						t.Errorf("request %d: %s = %q over gRPC, %q over HTTP", i, name, got[name], want)
					}
				}
				// HTTP also has Content-Type, and a dry-run tier's Limiterd-Dry-Run, which is for
				// limiterd's caller: over gRPC, Envoy would add it to its client's response.
				httpOnly := 1
				if tier.DryRun {
					httpOnly++
					if _, ok := got["Limiterd-Dry-Run"]; ok {
						t.Errorf("request %d: Limiterd-Dry-Run over gRPC", i)
					}
				}
				if len(got) != len(rec.Header())-httpOnly {
					t.Errorf("request %d: gRPC headers %q, HTTP headers %q", i, got, rec.Header())
				}
				clock.Advance(400 * time.Millisecond)
			}
		})
	}
}

func TestSeveralDescriptorsAreDecidedIndependently(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("default", "api", testsupport.TokenBucketTier("standard", 5, 1, time.Second)))
	c := dial(t, e)
	busy := request("api", entries("user", "busy"))
	busy.HitsAddend = 5
	if resp, err := c.ShouldRateLimit(t.Context(), busy); err != nil || resp.GetOverallCode() != ok {
		t.Fatalf("exhaust busy: %v %v", resp, err)
	}

	both := request("api", entries("user", "idle"), entries("user", "busy"), entries("user", "other"))
	resp, err := c.ShouldRateLimit(t.Context(), both)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != overLimit {
		t.Errorf("overall %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	var codes []rlsv3.RateLimitResponse_Code
	var left []uint32
	for _, s := range resp.GetStatuses() {
		codes = append(codes, s.GetCode())
		left = append(left, s.GetLimitRemaining())
	}
	if want := []rlsv3.RateLimitResponse_Code{ok, overLimit, ok}; !slices.Equal(codes, want) || !slices.Equal(left, []uint32{4, 0, 4}) {
		t.Errorf("codes %v remaining %v, want %v [4 0 4]", codes, left, want)
	}
	// The descriptors under their limits consumed their cost although the request is over limit.
	if got := remaining(t, e, "default/api", "user=idle"); got != 4 {
		t.Errorf("idle has %d left, want 4", got)
	}
	if got := remaining(t, e, "default/api", "user=other"); got != 4 {
		t.Errorf("other has %d left, want 4", got)
	}
	// The headers describe the descriptor over its limit.
	if h := headerMap(t, resp); h["Ratelimit"] != `"standard";r=0;t=5` || h["Retry-After"] != "1" {
		t.Errorf("headers %q, want those of busy", h)
	}

	// All under their limits: the headers describe the one with the least left.
	clock.Advance(5 * time.Second)
	resp, err = c.ShouldRateLimit(t.Context(), request("api", entries("user", "a"), entries("user", "idle"), entries("user", "b")))
	if err != nil || resp.GetOverallCode() != ok {
		t.Fatalf("all under: %v %v", resp, err)
	}
	if h := headerMap(t, resp); h["Ratelimit"] != `"standard";r=4;t=1` || h["Retry-After"] != "" {
		t.Errorf("headers %q, want those of the first with 4 left", h)
	}
}

// TestDescriptorsOfOneClientAreDecidedInOrder: several descriptors of one client in a request
// (decided as one batch) are decided in order, each on the state the one before left, with a
// peek and a refused refund among them: what one call per descriptor would answer.
func TestDescriptorsOfOneClientAreDecidedInOrder(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("default", "api", testsupport.TokenBucketTier("standard", 5, 1, time.Hour)))
	c := dial(t, e)
	peek, refund, three := entries("user", "u"), entries("user", "u"), entries("user", "u")
	peek.HitsAddend = wrapperspb.UInt64(0)
	refund.IsNegativeHits = true
	three.HitsAddend = wrapperspb.UInt64(3)
	req := request("api", entries("user", "u"), three, peek, refund, entries("user", "u"), entries("user", "u"), peek)
	resp, err := c.ShouldRateLimit(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range resp.GetStatuses() {
		got = append(got, fmt.Sprintf("%v/%d", s.GetCode(), s.GetLimitRemaining()))
	}
	// 1 (4 left), 3 (1 left), a peek (1 left), the refund refused, 1 (0 left), 1 over the
	// limit, a peek over the limit.
	want := []string{"OK/4", "OK/1", "OK/1", "UNKNOWN/0", "OK/0", "OVER_LIMIT/0", "OVER_LIMIT/0"}
	if !slices.Equal(got, want) || resp.GetOverallCode() != overLimit {
		t.Errorf("statuses %v, overall %v; want %v, OVER_LIMIT", got, resp.GetOverallCode(), want)
	}
	if got := remaining(t, e, "default/api", "user=u"); got != 0 {
		t.Errorf("u has %d left, want 0", got)
	}
}

func TestOverLimitHeadersDescribeTheLongestWait(t *testing.T) {
	clock := testsupport.NewClock()
	p := newPolicy("default", "api", testsupport.TokenBucketTier("fast", 1, 1, time.Second), testsupport.TokenBucketTier("slow", 1, 1, time.Minute))
	p.Spec.Overrides = []v1alpha1.Override{{Tier: "slow", Clients: []string{"s"}}}
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "client"}
	c := dial(t, newEngine(t, clock, p))
	req := request("api", entries("client", "f"), entries("client", "s"), entries("client", "f2"))
	if _, err := c.ShouldRateLimit(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	resp, err := c.ShouldRateLimit(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	h := headerMap(t, resp)
	if h["Ratelimit-Policy"] != `"slow";q=1;w=60` || h["Ratelimit"] != `"slow";r=0;t=60` || h["Retry-After"] != "60" {
		t.Errorf("headers %q, want the slow tier's", h)
	}
}

func TestDomainNamesThePolicy(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock,
		newPolicy("default", "api", testsupport.TokenBucketTier("d", 10, 1, time.Second)),
		newPolicy("edge", "api", testsupport.TokenBucketTier("e", 10, 1, time.Second)))
	c := dial(t, e)
	for domain, tier := range map[string]string{"api": "d", "default/api": "d", "edge/api": "e"} {
		resp, err := c.ShouldRateLimit(t.Context(), request(domain, entries("k", "v")))
		if err != nil {
			t.Fatalf("domain %q: %v", domain, err)
		}
		if got := resp.GetStatuses()[0].GetCurrentLimit().GetName(); got != tier {
			t.Errorf("domain %q decided by tier %q, want %q", domain, got, tier)
		}
	}
}

func TestErrorsConsumeNothing(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("default", "api", testsupport.TokenBucketTier("standard", 5, 1, time.Second)))
	c := dial(t, e)
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		code codes.Code
		msg  string
	}{
		{"unknown domain", request("nope", entries("k", "a")), codes.NotFound, `unknown policy "default/nope"`},
		{"unknown namespace", request("other/api", entries("k", "a")), codes.NotFound, `unknown policy "other/api"`},
		{"empty domain", request("", entries("k", "a")), codes.InvalidArgument, "domain is required"},
		{"no descriptors", request("api"), codes.InvalidArgument, "at least one descriptor"},
		{"no entries", request("api", entries("k", "a"), &ratelimitv3.RateLimitDescriptor{}), codes.InvalidArgument, "descriptor 1: has no entries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.ShouldRateLimit(t.Context(), tc.req)
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("got %v %v, want %v containing %q", resp, err, tc.code, tc.msg)
			}
			if got := remaining(t, e, "default/api", "k=a"); got != 5 {
				t.Errorf("k=a has %d left, want 5: the refused request consumed", got)
			}
		})
	}
}

func TestNotReadyIsUnavailable(t *testing.T) {
	c := dial(t, newEngine(t, testsupport.NewClock()))
	_, err := c.ShouldRateLimit(t.Context(), request("api", entries("k", "a")))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
}

func TestHitsAddendIsTheCost(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("default", "api", testsupport.TokenBucketTier("standard", 100, 1, time.Second)))
	c := dial(t, e)
	withHits := func(d *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(hits)
		return d
	}
	for _, tc := range []struct {
		name        string
		requestHits uint32
		descriptor  *ratelimitv3.RateLimitDescriptor
		key         string
		want        int64
	}{
		{"unset is 1", 0, entries("k", "a"), "k=a", 99},
		{"request", 7, entries("k", "b"), "k=b", 93},
		{"descriptor overrides request", 7, withHits(entries("k", "c"), 3), "k=c", 97},
		{"descriptor 0 peeks", 7, withHits(entries("k", "d"), 0), "k=d", 100},
		{"descriptor 0 and request 0 peeks", 0, withHits(entries("k", "e"), 0), "k=e", 100},
		{"descriptor alone", 0, withHits(entries("k", "f"), 40), "k=f", 60},
	} {
		req := request("api", tc.descriptor)
		req.HitsAddend = tc.requestHits
		resp, err := c.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := resp.GetStatuses()[0].GetLimitRemaining(); int64(got) != tc.want {
			t.Errorf("%s: status says %d left, want %d", tc.name, got, tc.want)
		}
		if got := remaining(t, e, "default/api", tc.key); got != tc.want {
			t.Errorf("%s: engine says %d left, want %d", tc.name, got, tc.want)
		}
	}
	// A cost above the capacity is over limit, never admitted, and so has no Retry-After;
	// its headers win over a rejection that a wait cures.
	req := request("api", entries("k", "g"))
	req.HitsAddend = 101
	resp, err := c.ShouldRateLimit(t.Context(), req)
	if err != nil || resp.GetOverallCode() != overLimit {
		t.Fatalf("cost above capacity: %v %v, want OVER_LIMIT", resp, err)
	}
	if h := headerMap(t, resp); h["Ratelimit"] != `"standard";r=100;t=0` || h["Retry-After"] != "" {
		t.Errorf("cost above capacity: headers %q, want the fresh state and no Retry-After", h)
	}
}

// TestNeverAdmittedBeatsAWait checks that among rejected descriptors, one whose cost no wait
// admits describes the answer (no Retry-After), whichever comes first.
func TestNeverAdmittedBeatsAWait(t *testing.T) {
	clock := testsupport.NewClock()
	c := dial(t, newEngine(t, clock, newPolicy("default", "api", testsupport.TokenBucketTier("standard", 2, 1, time.Second))))
	for _, order := range [][2]string{{"never", "wait"}, {"wait", "never"}} {
		var descriptors []*ratelimitv3.RateLimitDescriptor
		for _, which := range order {
			d := entries("k", which+"-"+order[0])
			if which == "never" {
				d.HitsAddend = wrapperspb.UInt64(3)
			} else {
				d.HitsAddend = wrapperspb.UInt64(2)
			}
			descriptors = append(descriptors, d)
		}
		// Exhaust the "wait" client first, so that its second request waits a second.
		if _, err := c.ShouldRateLimit(t.Context(), request("api", entries("k", "wait-"+order[0]))); err != nil {
			t.Fatal(err)
		}
		resp, err := c.ShouldRateLimit(t.Context(), request("api", descriptors...))
		if err != nil || resp.GetOverallCode() != overLimit {
			t.Fatalf("%v: %v %v, want OVER_LIMIT", order, resp, err)
		}
		if h := headerMap(t, resp); h["Retry-After"] != "" || h["Ratelimit"] != `"standard";r=2;t=0` {
			t.Errorf("%v: headers %q, want the never-admitted descriptor's, without Retry-After", order, h)
		}
	}
}

func TestDescriptorKeySelectsTheClient(t *testing.T) {
	clock := testsupport.NewClock()
	p := newPolicy("edge", "ip", testsupport.TokenBucketTier("per-ip", 3, 1, time.Second), testsupport.TokenBucketTier("vip", 100, 1, time.Second))
	p.Spec.Overrides = []v1alpha1.Override{{Tier: "vip", Clients: []string{"10.0.0.9"}}}
	p.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "remote_address"}
	e := newEngine(t, clock, p)
	c := dial(t, e)

	// The HTTP API and the gRPC service share the client "10.0.0.1".
	h := server.NewDecisions(e, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/allow?policy=edge/ip&key=10.0.0.1", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("HTTP: %d %s", rec.Code, rec.Body)
	}
	resp, err := c.ShouldRateLimit(t.Context(), request("edge/ip",
		entries("generic_key", "api", "remote_address", "10.0.0.1"),
		entries("remote_address", "10.0.0.9", "remote_address", "10.0.0.1"), // the first entry counts
		entries("generic_key", "api"),                                       // not limited by this policy
	))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.GetStatuses()
	if st[0].GetCurrentLimit().GetName() != "per-ip" || st[0].GetLimitRemaining() != 1 {
		t.Errorf("10.0.0.1: %v, want per-ip with 1 left (one HTTP, one gRPC decision)", st[0])
	}
	if st[1].GetCurrentLimit().GetName() != "vip" || st[1].GetLimitRemaining() != 99 {
		t.Errorf("10.0.0.9: %v, want the vip override with 99 left", st[1])
	}
	if want := (&rlsv3.RateLimitResponse_DescriptorStatus{Code: ok}); !proto.Equal(st[2], want) {
		t.Errorf("descriptor without remote_address: %v, want %v", st[2], want)
	}
	if h := headerMap(t, resp); h["Ratelimit"] != `"per-ip";r=1;t=2` {
		t.Errorf("headers %q, want those of 10.0.0.1", h)
	}

	// Only unlimited descriptors: OK, no headers.
	resp, err = c.ShouldRateLimit(t.Context(), request("edge/ip", entries("generic_key", "api")))
	if err != nil || resp.GetOverallCode() != ok || len(resp.GetResponseHeadersToAdd()) != 0 {
		t.Fatalf("no remote_address: %v %v, want OK without headers", resp, err)
	}
	// An empty value is the client "", with the default tier (see TestClientInputNeverFailsARequest).
}

func TestWholeDescriptorIsTheDefaultKey(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("default", "api", testsupport.TokenBucketTier("standard", 10, 1, time.Second)))
	c := dial(t, e)
	d := entries("a", "x=1&y", "b%", "")
	if _, err := c.ShouldRateLimit(t.Context(), request("api", d)); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, e, "default/api", "a=x%3D1%26y&b%25="); got != 9 {
		t.Errorf("the joined key has %d left, want 9", got)
	}
}

func TestJoinEntriesIsInjective(t *testing.T) {
	for _, c := range []struct {
		kv   []string
		want string
	}{
		{[]string{"remote_address", "10.0.0.1"}, "remote_address=10.0.0.1"},
		{[]string{"generic_key", "api", "remote_address", "::1"}, "generic_key=api&remote_address=::1"},
		{[]string{"k", "a&b=c"}, "k=a%26b%3Dc"},
		{[]string{"k", "a", "b", "c"}, "k=a&b=c"},
		{[]string{"k", "%26"}, "k=%2526"},
		{[]string{"k", "&"}, "k=%26"},
		{[]string{"", ""}, "="},
	} {
		if got := JoinEntries(entries(c.kv...).GetEntries()); got != c.want {
			t.Errorf("JoinEntries(%q) = %q, want %q", c.kv, got, c.want)
		}
	}
}

func TestCurrentLimitUnits(t *testing.T) {
	const (
		sec  = rlsv3.RateLimitResponse_RateLimit_SECOND
		min  = rlsv3.RateLimitResponse_RateLimit_MINUTE
		hour = rlsv3.RateLimitResponse_RateLimit_HOUR
		day  = rlsv3.RateLimitResponse_RateLimit_DAY
	)
	for _, c := range []struct {
		tier       v1alpha1.Tier
		perUnit    uint32
		unit       rlsv3.RateLimitResponse_RateLimit_Unit
		multiplier uint32 // 0: unset
	}{
		{testsupport.SlidingWindowTier("w", 5, time.Second), 5, sec, 0},
		{testsupport.SlidingWindowTier("w", 5, 250*time.Millisecond), 5, sec, 0},
		{testsupport.SlidingWindowTier("w", 5, 1500*time.Millisecond), 5, sec, 2},
		{testsupport.SlidingWindowTier("w", 5, 90*time.Second), 5, sec, 90},
		{testsupport.SlidingWindowTier("w", 5, time.Minute), 5, min, 0},
		{testsupport.SlidingWindowTier("w", 5, 30*time.Minute), 5, min, 30},
		{testsupport.SlidingWindowTier("w", 5, time.Hour), 5, hour, 0},
		{testsupport.SlidingWindowTier("w", 5, 24*time.Hour), 5, day, 0},
		// A token bucket's window is its full refill: 1000 tokens at 1 per 10 minutes take 10000 minutes.
		{testsupport.TokenBucketTier("b", 1000, 1, 10*time.Minute), 1000, min, 10000},
		{testsupport.TokenBucketTier("b", 1_000_000_000, 1_000_000_000, time.Second), 1_000_000_000, sec, 0},
		{testsupport.TokenBucketTier("b", 366, 1, 24*time.Hour), 366, day, 366},
		// A concurrency limit's window is its lease timeout: over gRPC, with no release, each
		// admission holds its place that long (TestConcurrencyTierOverGRPC).
		{concurrencyTier("c", 3, 30*time.Second), 3, sec, 30},
		{concurrencyTier("c", 3, 2*time.Minute), 3, min, 2},
		{concurrencyTier("c", 3, time.Millisecond), 3, sec, 0},
		// A quota's unit is its calendar period's, one of it, whatever the zone.
		{testsupport.QuotaTier("q", 1000, v1alpha1.CalendarPeriodDay, "Europe/Berlin"), 1000, day, 0},
		{testsupport.QuotaTier("q", 1000, v1alpha1.CalendarPeriodDay, "America/New_York"), 1000, day, 0},
		{testsupport.QuotaTier("q", 1000, v1alpha1.CalendarPeriodWeek, ""), 1000, rlsv3.RateLimitResponse_RateLimit_WEEK, 0},
		{testsupport.QuotaTier("q", 1000, v1alpha1.CalendarPeriodMonth, "Asia/Tokyo"), 1000, rlsv3.RateLimitResponse_RateLimit_MONTH, 0},
		{testsupport.QuotaTier("q", 1000, v1alpha1.CalendarPeriodYear, ""), 1000, rlsv3.RateLimitResponse_RateLimit_YEAR, 0},
	} {
		p, err := policy.Compile(newPolicy("default", "p", c.tier))
		if err != nil {
			t.Fatal(err)
		}
		rl := fillCurrentLimit(&rlsv3.RateLimitResponse_RateLimit{}, p.Default, 0)
		if rl.GetName() != c.tier.Name || rl.GetRequestsPerUnit() != c.perUnit || rl.GetUnit() != c.unit ||
			(rl.GetUnitMultiplier() == nil) != (c.multiplier == 0) || rl.GetUnitMultiplier().GetValue() != c.multiplier {
			t.Errorf("%v per %v: %v, want %d per %d %v", p.Default.Limit(0).Limit(), p.Default.Limit(0).Window(), rl, c.perUnit, c.multiplier, c.unit)
		}
	}
}

func TestUnlimitedAndDryRunTiers(t *testing.T) {
	clock := testsupport.NewClock()
	dry := testsupport.TokenBucketTier("trial", 1, 1, time.Minute)
	dry.DryRun = true
	p := newPolicy("default", "api", testsupport.UnlimitedTier("free"), dry)
	p.Spec.Overrides = []v1alpha1.Override{{Tier: "trial", Clients: []string{"k=t"}}}
	c := dial(t, newEngine(t, clock, p))
	for range 3 {
		resp, err := c.ShouldRateLimit(t.Context(), request("api", entries("k", "u"), entries("k", "t")))
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != ok {
			t.Errorf("overall %v, want OK: unlimited and dry-run tiers always admit", resp.GetOverallCode())
		}
		if st := resp.GetStatuses()[0]; !proto.Equal(st, &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok}) {
			t.Errorf("unlimited status %v, want OK without a limit", st)
		}
		if h := headerMap(t, resp); h["Ratelimit-Policy"] != `"trial";q=1;w=60` || h["Retry-After"] != "" {
			t.Errorf("headers %q, want the dry-run tier's without Retry-After", h)
		}
	}
}

// TestDescriptorHitsZeroPeeks checks that a descriptor whose hits_addend is set to 0 answers the
// client's state as one unit would see it, over limit when one unit would be rejected, and
// consumes nothing.
func TestDescriptorHitsZeroPeeks(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, newPolicy("default", "api", testsupport.TokenBucketTier("standard", 2, 1, time.Second)))
	c := dial(t, e)
	peek := func() *rlsv3.RateLimitResponse {
		t.Helper()
		d := entries("k", "p")
		d.HitsAddend = wrapperspb.UInt64(0)
		req := request("api", d)
		req.HitsAddend = 5 // the descriptor's own 0 wins
		resp, err := c.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for range 3 {
		if resp := peek(); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 2 {
			t.Fatalf("peek at a fresh client: %v", resp)
		}
	}
	for i := range 2 {
		resp, err := c.ShouldRateLimit(t.Context(), request("api", entries("k", "p")))
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d after the peeks: %v %v, want OK: a peek consumed", i, resp, err)
		}
	}
	resp := peek()
	if resp.GetOverallCode() != overLimit || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Fatalf("peek at an exhausted client: %v, want OVER_LIMIT", resp)
	}
	if h := headerMap(t, resp); h["Retry-After"] != "1" {
		t.Errorf("peek at an exhausted client: headers %q, want Retry-After 1", h)
	}
	if got := remaining(t, e, "default/api", "k=p"); got != 0 {
		t.Fatalf("%d left after the peek, want 0", got)
	}
	clock.Advance(time.Second)
	if got := remaining(t, e, "default/api", "k=p"); got != 1 {
		t.Fatalf("%d left a second later, want 1: the peek consumed", got)
	}
}

// TestNegativeHitsRefused checks that is_negative_hits refunds nothing, whatever its cost and
// the policy's refunds (it names no reservation: anyone could refill anyone), answers UNKNOWN
// for its descriptor, and never fails the request: the other descriptors are decided, and a
// rejection among them still rejects.
func TestNegativeHitsRefused(t *testing.T) {
	for _, refunds := range []v1alpha1.Refunds{v1alpha1.RefundsDisabled, v1alpha1.RefundsEnabled} {
		t.Run(string(refunds), func(t *testing.T) {
			p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 5, 1, time.Hour))
			p.Spec.Refunds = refunds
			e := newEngine(t, testsupport.NewClock(), p)
			c := dial(t, e)
			spend := request("api", entries("k", "r"))
			spend.HitsAddend = 5
			if resp, err := c.ShouldRateLimit(t.Context(), spend); err != nil || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
				t.Fatalf("spend 5: %v %v", resp, err)
			}
			for _, hits := range []uint64{0, 1, 1e9} {
				d := entries("k", "r")
				d.IsNegativeHits, d.HitsAddend = true, wrapperspb.UInt64(hits)
				other := entries("k", "o")
				resp, err := c.ShouldRateLimit(t.Context(), request("api", d, other))
				if err != nil {
					t.Fatalf("refund of %d with another descriptor: %v", hits, err)
				}
				st := resp.GetStatuses()
				if len(st) != 2 || st[0].GetCode() != rlsv3.RateLimitResponse_UNKNOWN || st[0].GetCurrentLimit() != nil ||
					st[1].GetCode() != rlsv3.RateLimitResponse_OK || st[1].GetCurrentLimit() == nil {
					t.Fatalf("refund of %d: %v; want UNKNOWN for the refund, the other decided", hits, resp)
				}
				if got := remaining(t, e, "default/api", "k=r"); got != 0 {
					t.Fatalf("is_negative_hits of %d refunded: %d left", hits, got)
				}
				// Beside an exhausted client, the request is still rejected.
				resp, err = c.ShouldRateLimit(t.Context(), request("api", d, entries("k", "r")))
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Fatalf("refund beside a rejected descriptor: %v %v, want OVER_LIMIT", resp, err)
				}
			}
		})
	}
}

// TestStackedTierStatus checks a descriptor of a stacked tier: decided all or nothing, its
// status reports the binding limit (current_limit named "<tier>/<limit>"), and its headers list
// every limit; a peek reads every limit.
func TestStackedTierStatus(t *testing.T) {
	e := newEngine(t, testsupport.NewClock(), newPolicy("default", "api", testsupport.StackedTier("paid",
		testsupport.TokenBucketLimit("burst", 3, 1, time.Second), testsupport.SlidingWindowLimit("daily", 4, 24*time.Hour))))
	c := dial(t, e)
	decide := func(hits uint32) *rlsv3.RateLimitResponse {
		t.Helper()
		req := request("api", entries("k", "v"))
		req.HitsAddend = hits
		resp, err := c.ShouldRateLimit(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	status := func(resp *rlsv3.RateLimitResponse) string {
		st := resp.GetStatuses()[0]
		return fmt.Sprintf("%v %s %d/%v*%d %d %v", st.GetCode(), st.GetCurrentLimit().GetName(), st.GetCurrentLimit().GetRequestsPerUnit(),
			st.GetCurrentLimit().GetUnit(), st.GetCurrentLimit().GetUnitMultiplier().GetValue(), st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
	}
	resp := decide(3)
	if got, want := status(resp), "OK paid/burst 3/SECOND*3 0 3s"; got != want {
		t.Fatalf("3 hits: %s, want %s", got, want)
	}
	if h := headerMap(t, resp); h["Ratelimit-Policy"] != `"paid/burst";q=3;w=3, "paid/daily";q=4;w=86400` || h["Ratelimit"] != `"paid/burst";r=0;t=3` {
		t.Fatalf("headers %q", h)
	}
	// burst rejects one more: daily is not charged.
	if got, want := status(decide(1)), "OVER_LIMIT paid/burst 3/SECOND*3 0 3s"; got != want {
		t.Fatalf("1 more hit: %s, want %s", got, want)
	}
	if r, _ := e.Peek(t.Context(), "default/api", "k=v"); r.Limits[1].Remaining != 1 {
		t.Fatalf("daily after the rejection: %+v, want 1 left (3 of 4 used)", r.Limits[1])
	}
	// A peek (its own hits_addend 0) consumes nothing.
	peek := entries("k", "v")
	peek.HitsAddend = wrapperspb.UInt64(0)
	for range 2 {
		resp, err := c.ShouldRateLimit(t.Context(), request("api", peek))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := status(resp), "OVER_LIMIT paid/burst 3/SECOND*3 0 3s"; got != want {
			t.Fatalf("a peek: %s, want %s", got, want)
		}
	}
}
