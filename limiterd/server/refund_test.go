package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/adminauth"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/reservation"
)

// withRefunds enables refunds on a policy.
func withRefunds(p *v1alpha1.RateLimitPolicy) *v1alpha1.RateLimitPolicy {
	p.Spec.Refunds = v1alpha1.RefundsEnabled
	return p
}

// reservationOf returns the reservation of an answer ("" if none).
func reservationOf(t testing.TB, body string) string {
	t.Helper()
	var v struct {
		Reservation string `json:"reservation"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	return v.Reservation
}

// remaining peeks a client's remaining units.
func remaining(t testing.TB, h http.Handler, policy, key string) string {
	t.Helper()
	a := serve(t, h, http.MethodPost, "/v1/allow", `{"policy":"`+policy+`","key":"`+key+`","cost":0}`)
	var v struct {
		Remaining json.Number `json:"remaining"`
	}
	if err := json.Unmarshal([]byte(a.body), &v); err != nil {
		t.Fatalf("peek: %s", a.body)
	}
	return v.Remaining.String()
}

// TestRefund checks that a refund names the reservation of an admitted decision and returns
// its units to the client's allowance, for each algorithm and a stack, and answers 200 with a
// peek after it.
func TestRefund(t *testing.T) {
	stack := v1alpha1.Tier{Name: "standard", Limits: []v1alpha1.Limit{
		{Name: "burst", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: testsupport.TokenBucketTier("x", 10, 1, time.Hour).TokenBucket},
		{Name: "daily", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: testsupport.TokenBucketTier("x", 20, 1, time.Hour).TokenBucket},
	}}
	// A sliding window cannot enable refunds: a refund could not remove the charge's own entry.
	for name, tier := range map[string]v1alpha1.Tier{
		"SlidingWindow": testsupport.SlidingWindowTier("standard", 10, time.Hour),
		"stack with a SlidingWindow": {Name: "standard", Limits: []v1alpha1.Limit{stack.Limits[0],
			{Name: "daily", Algorithm: v1alpha1.AlgorithmSlidingWindow, SlidingWindow: testsupport.SlidingWindowTier("x", 20, time.Hour).SlidingWindow}}},
	} {
		if _, err := policy.Compile(withRefunds(newPolicy("api", tier))); err == nil || !strings.Contains(err.Error(), "spec.refunds") {
			t.Errorf("%s: refunds enabled: %v, want spec.refunds refused", name, err)
		}
	}
	for name, tier := range map[string]v1alpha1.Tier{
		"TokenBucket": testsupport.TokenBucketTier("standard", 10, 1, time.Hour),
		"stack":       stack,
	} {
		t.Run(name, func(t *testing.T) {
			h := NewDecisions(newEngine(t, testsupport.NewClock(), withRefunds(newPolicy("api", tier))), nil)
			// Reserve an estimate of 8, use 3, refund 5.
			a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":8}`)
			rsv := reservationOf(t, a.body)
			if a.status != 200 || rsv == "" {
				t.Fatalf("reserve: %d %s, want a reservation", a.status, a.body)
			}
			a = serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+rsv+`","cost":5}`)
			if a.status != 200 || !strings.HasPrefix(a.body, `{"allowed":true,"limit":10,"remaining":7,`) ||
				!strings.Contains(a.header.Get("RateLimit"), `;r=7;`) {
				t.Fatalf("refund: %d %v %s", a.status, a.header, a.body)
			}
			// Once: the same reservation again (a retry) refunds nothing more, for any cost.
			for _, body := range []string{`{"reservation":"` + rsv + `","cost":5}`, `{"reservation":"` + rsv + `"}`} {
				a = serve(t, h, http.MethodPost, "/v1/refund", body)
				if a.status != 409 || !strings.Contains(a.errorText(t), "already refunded") {
					t.Fatalf("second refund: %d %s, want 409", a.status, a.body)
				}
			}
			if got := remaining(t, h, "default/api", "k"); got != "7" {
				t.Fatalf("after a repeated refund: remaining %s, want 7", got)
			}
			// No cost: the whole reservation.
			a = serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":7}`)
			if a.status != 200 {
				t.Fatalf("spend the refunded allowance: %d %s", a.status, a.body)
			}
			a = serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+reservationOf(t, a.body)+`"}`)
			if a.status != 200 || !strings.Contains(a.body, `"remaining":7,`) {
				t.Fatalf("refund of a whole reservation: %d %s", a.status, a.body)
			}
		})
	}
}

// TestRefundIsBound is the rule of SECURITY.md's "Refunds": a refund without a reservation,
// with a forged one, another client's, a repeated one, one past its cost, an expired one, or
// on a policy that does not enable refunds refunds nothing.
func TestRefundIsBound(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, withRefunds(newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Hour))),
		newPolicy("plain", testsupport.TokenBucketTier("standard", 3, 1, time.Hour)))
	h := NewDecisions(e, nil)
	spend := func(policy, key string) string {
		t.Helper()
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"policy":"`+policy+`","key":"`+key+`","cost":3}`)
		if a.status != 200 {
			t.Fatalf("spend: %d %s", a.status, a.body)
		}
		return reservationOf(t, a.body)
	}
	alice := spend("default/api", "alice")
	mallory := spend("default/api", "mallory")
	if alice == "" || mallory == "" {
		t.Fatal("no reservation on a policy that enables refunds")
	}
	if r := spend("default/plain", "mallory"); r != "" {
		t.Fatalf("a policy without refunds answered a reservation %q", r)
	}
	// A forgery: mallory's reservation with its key bytes rewritten to alice's would need the
	// signature; flipping any bit breaks it. The bit is one of the decoded bytes, re-encoded, so
	// the forgery is always well-formed base64url (flipping a bit of the text can leave the
	// alphabet, which is malformed, a 400, not a forgery).
	raw, err := base64.RawURLEncoding.DecodeString(mallory)
	if err != nil {
		t.Fatalf("mallory's reservation %q: %v", mallory, err)
	}
	raw[len(raw)/2] ^= 1
	forged := base64.RawURLEncoding.EncodeToString(raw)
	for _, tc := range []struct {
		name, body string
		status     int
		check      string // the client whose allowance must stay spent
		policy     string
	}{
		{"no reservation: refill by key", `{"policy":"default/api","key":"mallory","amount":1000000000}`, 400, "mallory", "default/api"},
		{"no reservation", `{"cost":3}`, 400, "mallory", "default/api"},
		{"forged", `{"reservation":"` + forged + `"}`, 403, "mallory", "default/api"},
		{"garbage", `{"reservation":"eyJrZXkiOiJtYWxsb3J5In0"}`, 400, "mallory", "default/api"},
		{"past its cost", `{"reservation":"` + mallory + `","cost":4}`, 400, "mallory", "default/api"},
		{"policy without refunds", `{"policy":"default/plain","key":"mallory","amount":3}`, 400, "mallory", "default/plain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := serve(t, h, http.MethodPost, "/v1/refund", tc.body)
			if a.status != tc.status {
				t.Fatalf("%d %s, want %d", a.status, a.body, tc.status)
			}
			a.errorText(t)
			if got := remaining(t, h, tc.policy, tc.check); got != "0" {
				t.Fatalf("%s has %s remaining, want nothing refunded", tc.check, got)
			}
		})
	}
	// Another client's reservation refunds that client, never the caller.
	if a := serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+alice+`","cost":1}`); a.status != 200 {
		t.Fatalf("alice's refund: %d %s", a.status, a.body)
	}
	if got := remaining(t, h, "default/api", "mallory"); got != "0" {
		t.Fatalf("alice's reservation refunded mallory: %s remaining", got)
	}
	// Twice: nothing more.
	if a := serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+alice+`","cost":1}`); a.status != 409 {
		t.Fatalf("alice's second refund: %d %s, want 409", a.status, a.body)
	}
	if got := remaining(t, h, "default/api", "alice"); got != "1" {
		t.Fatalf("alice has %s remaining after one refund of 1, want 1", got)
	}
	// Expired: a bucket of 3 refilling 1 an hour is whole 3 hours after it was emptied.
	clock.Advance(3 * time.Hour)
	spend("default/api", "mallory")
	late := mallory
	if a := serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+late+`"}`); a.status != 410 {
		t.Fatalf("an expired reservation: %d %s, want 410", a.status, a.body)
	}
	if got := remaining(t, h, "default/api", "mallory"); got != "0" {
		t.Fatalf("an expired reservation refunded: %s remaining", got)
	}
	// A policy that stopped enabling refunds refuses its reservations.
	fresh := spend("default/api", "zed")
	off, err := policy.Compile(newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.NewSet(off)
	if err != nil {
		t.Fatal(err)
	}
	e.Swap(set)
	if a := serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+fresh+`"}`); a.status != 403 {
		t.Fatalf("a policy without refunds: %d %s, want 403", a.status, a.body)
	}
	if got := remaining(t, h, "default/api", "zed"); got != "0" {
		t.Fatalf("refunded on a policy without refunds: %s remaining", got)
	}
}

func TestRefundRejectsBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name, method, body string
		status             int
	}{
		{"no reservation", "POST", `{}`, 400},
		{"reservation empty", "POST", `{"reservation":""}`, 400},
		{"reservation null", "POST", `{"reservation":null}`, 400},
		{"reservation number", "POST", `{"reservation":3}`, 400},
		{"reservation too long", "POST", `{"reservation":"` + strings.Repeat("A", 4097) + `"}`, 400},
		{"cost zero", "POST", `{"reservation":"x","cost":0}`, 400},
		{"cost negative", "POST", `{"reservation":"x","cost":-2}`, 400},
		{"cost fraction", "POST", `{"reservation":"x","cost":1.5}`, 400},
		{"cost string", "POST", `{"reservation":"x","cost":"2"}`, 400},
		{"cost too large", "POST", `{"reservation":"x","cost":1000000001}`, 400},
		{"amount", "POST", `{"reservation":"x","amount":2}`, 400},
		{"key", "POST", `{"key":"k","amount":2}`, 400},
		{"reservation twice", "POST", `{"reservation":"x","reservation":"x"}`, 400},
		{"malformed", "POST", `{"reservation":"x"`, 400},
		{"trailing data", "POST", `{"reservation":"x"}x`, 400},
		{"not a reservation", "POST", `{"reservation":"x"}`, 400},
		{"GET", "GET", ``, 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewDecisions(newEngine(t, testsupport.NewClock(), withRefunds(newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Hour)))), nil)
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":3}`); a.status != 200 {
				t.Fatal(a.body)
			}
			a := serve(t, h, tc.method, "/v1/refund", tc.body)
			if a.status != tc.status {
				t.Fatalf("%d %s, want %d", a.status, a.body, tc.status)
			}
			a.errorText(t)
			// An error refunds nothing.
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":0}`); !strings.Contains(a.body, `"remaining":0,`) {
				t.Fatalf("after the error: %s, want nothing refunded", a.body)
			}
		})
	}
}

// TestBatchReservations checks that admitted batch items answer reservations that refund.
func TestBatchReservations(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), withRefunds(newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Hour)))), nil)
	a := serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[{"key":"k","cost":2},{"key":"k","cost":2},{"key":"k","cost":0}]}`)
	var v struct {
		Results []struct {
			Allowed     bool   `json:"allowed"`
			Reservation string `json:"reservation"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(a.body), &v); err != nil || len(v.Results) != 3 {
		t.Fatalf("batch: %d %s", a.status, a.body)
	}
	if v.Results[0].Reservation == "" || v.Results[1].Reservation != "" || v.Results[2].Reservation != "" {
		t.Fatalf("batch: %s; want a reservation for the admitted item only", a.body)
	}
	if a := serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+v.Results[0].Reservation+`"}`); a.status != 200 || !strings.Contains(a.body, `"remaining":3,`) {
		t.Fatalf("refund of a batch item: %d %s", a.status, a.body)
	}
}

// FuzzDecodeRefundRequest checks the decoder against encoding/json: whatever it accepts is
// valid JSON that encoding/json decodes to the same request, and it re-encodes to itself.
func FuzzDecodeRefundRequest(f *testing.F) {
	for _, seed := range []string{
		`{"reservation":"AQAAAAAAAAAA","cost":1}`, `{"reservation":"abc-_"}`, `{"cost":null,"reservation":"\u0041"}`,
		`{"reservation":"x","cost":1.5}`, `{"reservation":"x","cost":0}`, `{"key":"k","amount":1}`, `{"reservation":""}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := DecodeRefundRequest(body)
		if err != nil {
			var reqErr errRequest
			if !errors.As(err, &reqErr) {
				t.Fatalf("error %v is not a client error", err)
			}
			return
		}
		if got.Reservation == "" || len(got.Reservation) > reservation.MaxTokenBytes || !utf8.ValidString(got.Reservation) ||
			got.Cost < 0 || got.Cost > MaxCost {
			t.Fatalf("accepted %+v", got)
		}
		var std struct {
			Reservation *string      `json:"reservation"`
			Cost        *json.Number `json:"cost"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		dec.UseNumber()
		if err := dec.Decode(&std); err != nil || dec.More() {
			t.Fatalf("accepted %q, which encoding/json rejects: %v", body, err)
		}
		if std.Reservation == nil || *std.Reservation != got.Reservation {
			t.Fatalf("%+v, encoding/json says %+v", got, std)
		}
		if (std.Cost == nil && got.Cost != 0) || (std.Cost != nil && std.Cost.String() != strconv.FormatInt(got.Cost, 10)) {
			t.Fatalf("cost %d, encoding/json says %v", got.Cost, std.Cost)
		}
		fields := map[string]any{"reservation": got.Reservation}
		if got.Cost > 0 {
			fields["cost"] = got.Cost
		}
		again, err := json.Marshal(fields)
		if err != nil {
			t.Fatal(err)
		}
		if round, err := DecodeRefundRequest(again); err != nil || round != got {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, round, err, got)
		}
	})
}

// TestRefundAfterAdminReset is issue 34's attack from the outside: spend the whole allowance,
// have the client reset through the admin API, spend it again, then refund the reservation from
// before the reset. The reset erased that charge, so the refund answers 410 and gives nothing
// back (before the fix: 200 and 9 units, 29 admitted out of 10 within seconds); a reservation
// issued after the reset still refunds.
func TestRefundAfterAdminReset(t *testing.T) {
	clock := testsupport.NewClock()
	e := newEngine(t, clock, withRefunds(newPolicy("api", testsupport.TokenBucketTier("standard", 10, 1, time.Hour))))
	h := NewDecisions(e, nil)
	admin := NewAdmin(e, AdminOptions{Auth: adminauth.Open()})
	spend := func() string {
		t.Helper()
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":10}`)
		rsv := reservationOf(t, a.body)
		if a.status != 200 || !strings.Contains(a.body, `"allowed":true`) || rsv == "" {
			t.Fatalf("spend 10: %d %s, want admitted with a reservation", a.status, a.body)
		}
		return rsv
	}
	before := spend()
	clock.Advance(time.Millisecond)
	if a := serve(t, admin, http.MethodDelete, "/v1/clients?key=k", ""); a.status != http.StatusNoContent {
		t.Fatalf("reset: %d %s", a.status, a.body)
	}
	clock.Advance(time.Millisecond)
	after := spend()
	clock.Advance(time.Millisecond)
	for range 2 {
		a := serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+before+`","cost":9}`)
		if a.status != http.StatusGone || !strings.Contains(a.errorText(t), "reset") {
			t.Fatalf("refund of the reservation from before the reset: %d %s, want 410", a.status, a.body)
		}
	}
	if got := remaining(t, h, "default/api", "k"); got != "0" {
		t.Fatalf("after the refund of a reservation the reset voided: remaining %s, want 0", got)
	}
	a := serve(t, h, http.MethodPost, "/v1/refund", `{"reservation":"`+after+`","cost":4}`)
	if a.status != 200 || !strings.Contains(a.body, `"remaining":4,`) {
		t.Fatalf("refund of the reservation from after the reset: %d %s, want 200 and 4 remaining", a.status, a.body)
	}
}

// TestRefundSaysWhatCameBack: a refund's answer says how many units came back, "refunded", as
// the store counted them in the refund (how many more units the client may spend right after it
// than right before), and a stack's says it per limit too. Before, the answer said nothing of
// it, and a refund that gave back less than it asked looked like one that gave it all.
func TestRefundSaysWhatCameBack(t *testing.T) {
	clock := testsupport.NewClock()
	// 10 tokens, 1 a second.
	h := NewDecisions(newEngine(t, clock, withRefunds(newPolicy("api", testsupport.TokenBucketTier("standard", 10, 10, 10*time.Second)))), nil)
	reserve := func(key string, cost int) string {
		t.Helper()
		a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"`+key+`","cost":`+strconv.Itoa(cost)+`}`)
		if a.status != 200 || strings.Contains(a.body, "refunded") {
			t.Fatalf("reserve %d: %d %s, want 200 without refunded", cost, a.status, a.body)
		}
		return reservationOf(t, a.body)
	}
	refund := func(rsv, cost string) answer {
		t.Helper()
		body := `{"reservation":"` + rsv + `"}`
		if cost != "" {
			body = `{"reservation":"` + rsv + `","cost":` + cost + `}`
		}
		a := serve(t, h, http.MethodPost, "/v1/refund", body)
		if a.status != 200 {
			t.Fatalf("refund: %d %s", a.status, a.body)
		}
		return a
	}
	// All of 10, at once: all of it.
	if a := refund(reserve("a", 10), ""); !strings.Contains(a.body, `"remaining":10,`) || !strings.HasSuffix(strings.TrimSpace(a.body), `,"refunded":10}`) {
		t.Errorf("a prompt refund of 10: %s, want remaining 10 and refunded 10", a.body)
	}
	// Part of a reservation: that part.
	if a := refund(reserve("b", 4), "1"); !strings.Contains(a.body, `"remaining":7,`) || !strings.HasSuffix(strings.TrimSpace(a.body), `,"refunded":1}`) {
		t.Errorf("a refund of 1 of 4: %s, want remaining 7 and refunded 1", a.body)
	}
	// A bucket in debt: of 5 asked 2 s after the charge, the 2 s it refilled since do not come
	// back: 3 do, and the answer says 3.
	reserve("c", 5)
	late := reserve("c", 5)
	clock.Advance(2 * time.Second)
	if a := refund(late, "5"); !strings.Contains(a.body, `"remaining":5,`) || !strings.HasSuffix(strings.TrimSpace(a.body), `,"refunded":3}`) {
		t.Errorf("a refund of 5, 2 s late on an empty bucket: %s, want remaining 5 and refunded 3", a.body)
	}

	// A stack: per limit, and the binding limit's at the top.
	stack := v1alpha1.Tier{Name: "standard", Limits: []v1alpha1.Limit{
		{Name: "burst", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: testsupport.TokenBucketTier("x", 10, 1, time.Hour).TokenBucket},
		{Name: "daily", Algorithm: v1alpha1.AlgorithmTokenBucket, TokenBucket: testsupport.TokenBucketTier("x", 20, 1, time.Hour).TokenBucket},
	}}
	h = NewDecisions(newEngine(t, clock, withRefunds(newPolicy("api", stack))), nil)
	a := refund(reserve("d", 8), "5")
	var v struct {
		Remaining int64  `json:"remaining"`
		Refunded  *int64 `json:"refunded"`
		Limits    []struct {
			Name      string `json:"name"`
			Remaining int64  `json:"remaining"`
			Refunded  *int64 `json:"refunded"`
		} `json:"limits"`
	}
	if err := json.Unmarshal([]byte(a.body), &v); err != nil {
		t.Fatalf("stack refund %s: %v", a.body, err)
	}
	if v.Refunded == nil || *v.Refunded != 5 || v.Remaining != 7 || len(v.Limits) != 2 {
		t.Fatalf("stack refund: %s, want remaining 7 and refunded 5", a.body)
	}
	for _, l := range v.Limits {
		if l.Refunded == nil || *l.Refunded != 5 {
			t.Errorf("stack refund, limit %s: %s, want refunded 5", l.Name, a.body)
		}
	}
	// A peek of the stack says nothing of refunds.
	if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"d","cost":0}`); strings.Contains(a.body, "refunded") {
		t.Errorf("a peek: %s, want no refunded", a.body)
	}
}
