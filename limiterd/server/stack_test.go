package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
)

// stackedPolicy is the policy default/api whose default tier "paid" stacks burst, a bucket of 2
// refilled by 1 a second (full in 2 s), and daily, a window of 3 an hour; the client "svc" is
// unlimited.
func stackedPolicy() *v1alpha1.RateLimitPolicy {
	p := newPolicy("api", testsupport.StackedTier("paid",
		testsupport.TokenBucketLimit("burst", 2, 1, time.Second), testsupport.SlidingWindowLimit("daily", 3, time.Hour)),
		testsupport.UnlimitedTier("internal"))
	p.Spec.Overrides = []v1alpha1.Override{overrideOf("internal", []string{"svc"}, nil)}
	return p
}

// limitJSON is the JSON of one limit of a stacked answer.
func limitJSON(name string, allowed bool, limit, remaining int64, reset time.Duration) string {
	return `{"name":"` + name + `","allowed":` + strconv.FormatBool(allowed) + `,"limit":` + strconv.FormatInt(limit, 10) +
		`,"remaining":` + strconv.FormatInt(remaining, 10) + `,"resetAfterSeconds":` + strconv.FormatInt(int64((reset+time.Second-1)/time.Second), 10) +
		`,"resetAfterMs":` + strconv.FormatInt(reset.Milliseconds(), 10) + `}`
}

// TestAllowStackedTierAnswersAndHeaders checks a stacked tier's answers: RateLimit-Policy lists
// every limit, RateLimit and the top-level fields report the limit closest to exhaustion (or
// of a rejection the one that must wait longest), the JSON lists every limit, and Retry-After
// is the wait until every limit admits.
func TestAllowStackedTierAnswersAndHeaders(t *testing.T) {
	clock := testsupport.NewClock()
	h := NewDecisions(newEngine(t, clock, stackedPolicy()), nil)
	const hour = time.Hour
	for i, step := range []struct {
		advance                    time.Duration
		status                     int
		top, rateLimit, retryAfter string
		burst, daily               string
	}{
		{0, 200, `"allowed":true,"limit":2,"remaining":1,"resetAfterSeconds":1,"retryAfterSeconds":0,"resetAfterMs":1000,"retryAfterMs":0`,
			`"paid/burst";r=1;t=1`, "", limitJSON("burst", true, 2, 1, time.Second), limitJSON("daily", true, 3, 2, hour)},
		{0, 200, `"allowed":true,"limit":2,"remaining":0,"resetAfterSeconds":2,"retryAfterSeconds":0,"resetAfterMs":2000,"retryAfterMs":0`,
			`"paid/burst";r=0;t=2`, "", limitJSON("burst", true, 2, 0, 2*time.Second), limitJSON("daily", true, 3, 1, hour)},
		// burst rejects: daily, which would admit, is not charged and still says so.
		{0, 429, `"allowed":false,"limit":2,"remaining":0,"resetAfterSeconds":2,"retryAfterSeconds":1,"resetAfterMs":2000,"retryAfterMs":1000`,
			`"paid/burst";r=0;t=2`, "1", limitJSON("burst", false, 2, 0, 2*time.Second), limitJSON("daily", true, 3, 1, hour)},
		// 2 s later burst is full again; daily is the closest to exhaustion.
		{2 * time.Second, 200, `"allowed":true,"limit":3,"remaining":0,"resetAfterSeconds":3600,"retryAfterSeconds":0,"resetAfterMs":3600000,"retryAfterMs":0`,
			`"paid/daily";r=0;t=3600`, "", limitJSON("burst", true, 2, 1, time.Second), limitJSON("daily", true, 3, 0, hour)},
		// daily rejects until its first unit leaves the window: the wait of the stack.
		{2 * time.Second, 429, `"allowed":false,"limit":3,"remaining":0,"resetAfterSeconds":3598,"retryAfterSeconds":3596,"resetAfterMs":3598000,"retryAfterMs":3596000`,
			`"paid/daily";r=0;t=3598`, "3596", limitJSON("burst", true, 2, 2, 0), limitJSON("daily", false, 3, 0, hour-2*time.Second)},
	} {
		clock.Advance(step.advance)
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"alice"}`)
		want := "{" + step.top + `,"limits":[` + step.burst + "," + step.daily + "]}"
		if a.status != step.status || strings.TrimSpace(a.body) != want {
			t.Fatalf("request %d: %d %s\n want %d %s", i, a.status, a.body, step.status, want)
		}
		if got := a.header.Get("RateLimit-Policy"); got != `"paid/burst";q=2;w=2, "paid/daily";q=3;w=3600` {
			t.Errorf("request %d: RateLimit-Policy = %q", i, got)
		}
		if got := a.header.Get("RateLimit"); got != step.rateLimit {
			t.Errorf("request %d: RateLimit = %q, want %q", i, got, step.rateLimit)
		}
		if got := a.header.Get("Retry-After"); got != step.retryAfter {
			t.Errorf("request %d: Retry-After = %q, want %q", i, got, step.retryAfter)
		}
		// The body is JSON, and says what the header fields say.
		var body struct {
			Allowed bool
			Limits  []struct {
				Name      string
				Remaining int64
			}
		}
		if err := json.Unmarshal([]byte(a.body), &body); err != nil || len(body.Limits) != 2 || body.Limits[1].Name != "daily" {
			t.Fatalf("request %d: body %s: %v", i, a.body, err)
		}
	}
}

// TestStackedTierPeekRefundLegacyAndAdmin checks a stacked tier's peeks, refunds (every limit
// gets the units back), legacy header fields (the binding limit's) and the admin API's answer.
func TestStackedTierPeekRefundLegacyAndAdmin(t *testing.T) {
	clock := testsupport.NewClock()
	// Refunds need token buckets: daily is a bucket of 3 refilling 1 every 30 minutes (2 charged:
	// full again in 1h, as the window of stackedPolicy).
	p := stackedPolicy()
	p.Spec.Tiers[0].Limits[1] = testsupport.TokenBucketLimit("daily", 3, 1, 30*time.Minute)
	e := newEngine(t, clock, withRefunds(p))
	h := NewDecisions(e, nil, WithLegacyHeaders())
	a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":2}`)
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.body)
	}
	rsv := reservationOf(t, a.body)
	a = serve(t, h, http.MethodGet, "/v1/allow?key=k&cost=0", "")
	if a.status != 429 || !strings.HasSuffix(strings.TrimSpace(a.body), `"limits":[`+limitJSON("burst", false, 2, 0, 2*time.Second)+","+
		limitJSON("daily", true, 3, 1, time.Hour)+"]}") || a.header.Get("Retry-After") != "1" {
		t.Fatalf("a peek: %d %s %v", a.status, a.body, a.header)
	}
	if a.header.Get("X-RateLimit-Limit") != "2" || a.header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("legacy fields of a peek: %v, want the binding limit's", a.header)
	}
	a = serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+rsv+`","cost":1}`)
	// A refund's answer says what came back: the binding limit's, and each limit's.
	refunded := func(limit string, n int) string {
		return strings.TrimSuffix(limit, "}") + `,"refunded":` + strconv.Itoa(n) + "}"
	}
	if a.status != 200 || !strings.HasSuffix(strings.TrimSpace(a.body), `"refunded":1,"limits":[`+refunded(limitJSON("burst", true, 2, 1, time.Second), 1)+","+
		refunded(limitJSON("daily", true, 3, 2, 30*time.Minute), 1)+"]}") || a.header.Get("RateLimit") != `"paid/burst";r=1;t=1` {
		t.Fatalf("a refund: %d %s %v", a.status, a.body, a.header)
	}
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"svc"}`); strings.Contains(a.body, "limits") || a.header.Get("RateLimit-Policy") != "" {
		t.Fatalf("an unlimited tier: %s %v", a.body, a.header)
	}

	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})
	a = serve(t, admin, http.MethodGet, "/v1/clients?key=k", "")
	var c ClientAnswer
	if err := json.Unmarshal([]byte(a.body), &c); err != nil || a.status != 200 {
		t.Fatalf("admin: %d %s: %v", a.status, a.body, err)
	}
	if c.Tier != "paid" || *c.Limit != 2 || *c.Remaining != 1 || len(c.Limits) != 2 ||
		c.Limits[0] != (ClientLimit{Name: "burst", Allowed: true, Limit: 2, Remaining: 1, ResetAfterSeconds: 1}) ||
		c.Limits[1] != (ClientLimit{Name: "daily", Allowed: true, Limit: 3, Remaining: 2, ResetAfterSeconds: 1800}) {
		t.Fatalf("admin answer: %+v", c)
	}
	if a := serve(t, admin, http.MethodDelete, "/v1/clients?key=k", ""); a.status != http.StatusNoContent {
		t.Fatalf("reset: %d %s", a.status, a.body)
	}
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":2}`); a.status != 200 {
		t.Fatalf("after a reset, every limit is whole: %d %s", a.status, a.body)
	}
}
