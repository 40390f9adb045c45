package redis

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/reservation"
	decisions "github.com/limiterd/limiterd/limiterd/server"
)

// TestRefundOverHTTPTwoReplicas runs two replicas' decisions APIs on one Redis with one shared
// reservation key: a reservation issued by one refunds through the other once; a retry through
// either, a forged one, one past its cost, and one of a replica with another key refund
// nothing.
func TestRefundOverHTTPTwoReplicas(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	_, set := refundPolicy(t, 3, 1, time.Hour)
	key := []byte(strings.Repeat("k", reservation.MinKeyBytes))
	replica := func(key []byte) *httptest.Server {
		signer, err := reservation.NewSigner(key)
		if err != nil {
			t.Fatal(err)
		}
		e := engine.New(engine.Options{Reservations: signer,
			NewStore: func(id v1alpha1.PolicyID) limiter.Store { return c.Store(string(id)) }})
		e.Swap(set)
		srv := httptest.NewServer(decisions.NewDecisions(e, nil))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b, other := replica(key), replica(key), replica([]byte(strings.Repeat("o", reservation.MinKeyBytes)))
	post := func(srv *httptest.Server, path, body string) (int, map[string]any) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s: %q", path, raw)
		}
		return resp.StatusCode, v
	}
	remaining := func(client string) float64 {
		t.Helper()
		_, v := post(a, "/v1/allow", `{"key":"`+client+`","cost":0}`)
		return v["remaining"].(float64)
	}
	_, v := post(a, "/v1/allow", `{"key":"alice","cost":3}`)
	rsv, _ := v["reservation"].(string)
	_, v = post(other, "/v1/allow", `{"key":"mallory","cost":3}`)
	otherRsv, _ := v["reservation"].(string)
	if rsv == "" || otherRsv == "" {
		t.Fatal("no reservation")
	}
	forged := []byte(rsv)
	forged[10] = map[bool]byte{true: 'B', false: 'A'}[forged[10] == 'A']
	for _, tc := range []struct {
		srv    *httptest.Server
		body   string
		status int
	}{
		{b, `{"key":"alice","amount":3}`, 400},
		{b, `{"reservation":"` + string(forged) + `"}`, 403},
		{b, `{"reservation":"` + rsv + `","cost":4}`, 400},
		{a, `{"reservation":"` + otherRsv + `"}`, 403}, // signed under another key
	} {
		if status, v := post(tc.srv, "/v1/refund", tc.body); status != tc.status {
			t.Fatalf("%s: %d %v, want %d", tc.body, status, v, tc.status)
		}
		if r := remaining("alice"); r != 0 {
			t.Fatalf("%s refunded: %v remaining", tc.body, r)
		}
	}
	if status, v := post(b, "/v1/refund", `{"reservation":"`+rsv+`","cost":2}`); status != 200 || v["remaining"].(float64) != 2 {
		t.Fatalf("refund through the other replica: %d %v", status, v)
	}
	for _, srv := range []*httptest.Server{a, b} {
		if status, v := post(srv, "/v1/refund", `{"reservation":"`+rsv+`","cost":1}`); status != 409 {
			t.Fatalf("retry: %d %v, want 409", status, v)
		}
	}
	if r := remaining("alice"); r != 2 {
		t.Fatalf("after retries: %v remaining, want 2", r)
	}
}

// refundPolicy returns a policy named after the test, of one token-bucket tier of capacity
// refilled by rate every period, with refunds enabled, and the set of it alone.
func refundPolicy(t *testing.T, capacity, rate int64, period time.Duration) (*policy.Policy, *policy.Set) {
	t.Helper()
	src := &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Name: strings.ToLower(t.Name()), Namespace: "default"},
		Spec: v1alpha1.RateLimitPolicySpec{DefaultTier: "standard", Refunds: v1alpha1.RefundsEnabled, Tiers: []v1alpha1.Tier{{
			Name: "standard", Algorithm: v1alpha1.AlgorithmTokenBucket,
			TokenBucket: &v1alpha1.TokenBucket{Capacity: capacity, RefillRate: rate, RefillPeriod: &metav1.Duration{Duration: period}}}}}}
	p, err := policy.Compile(src)
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.NewSet(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, set
}

// TestRefundAtOnceOverHTTP is the commonest refund, "this request failed, give its unit back",
// against the decisions API on the real clock, on both stores: of a bucket of 100 refilling one
// an hour, a unit charged and refunded at once comes back (200, then all 100 are spendable),
// and so do all of 10 charged; a whole-token bound lost the token being refilled, so the first
// answered 410 and the second returned 9.
func TestRefundAtOnceOverHTTP(t *testing.T) {
	t.Parallel()
	c := newClient(t, testOptions(shared(t).Addr()))
	_, set := refundPolicy(t, 100, 1, time.Hour)
	for _, tc := range []struct {
		name  string
		store func(id v1alpha1.PolicyID) limiter.Store
	}{
		{"memory", nil}, // the engine's own
		{"redis", func(id v1alpha1.PolicyID) limiter.Store { return c.Store(string(id)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			signer, err := reservation.NewSigner([]byte(strings.Repeat("k", reservation.MinKeyBytes)))
			if err != nil {
				t.Fatal(err)
			}
			e := engine.New(engine.Options{Reservations: signer, NewStore: tc.store})
			e.Swap(set)
			srv := httptest.NewServer(decisions.NewDecisions(e, nil))
			t.Cleanup(srv.Close)
			post := func(path, body string) (int, map[string]any) {
				t.Helper()
				resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				raw, _ := io.ReadAll(resp.Body)
				var v map[string]any
				if err := json.Unmarshal(raw, &v); err != nil {
					t.Fatalf("%s: %q", path, raw)
				}
				return resp.StatusCode, v
			}
			for _, cost := range []int{1, 10} {
				client := "client-" + strconv.Itoa(cost)
				status, v := post("/v1/allow", `{"key":"`+client+`","cost":`+strconv.Itoa(cost)+`}`)
				rsv, _ := v["reservation"].(string)
				if status != 200 || rsv == "" || v["remaining"].(float64) != float64(100-cost) {
					t.Fatalf("charge of %d: %d %v", cost, status, v)
				}
				time.Sleep(2 * time.Millisecond) // "at once", but some time has passed
				// The answer says how many came back: all of them.
				if status, v := post("/v1/refund", `{"reservation":"`+rsv+`"}`); status != 200 || v["remaining"].(float64) != 100 || v["refunded"] != float64(cost) {
					t.Fatalf("refund of all %d units at once: %d %v, want 200, 100 remaining and %d refunded", cost, status, v, cost)
				}
				if status, v := post("/v1/allow", `{"key":"`+client+`","cost":100}`); status != 200 || v["allowed"] != true {
					t.Fatalf("the whole bucket after the refund of %d: %d %v, want admitted", cost, status, v)
				}
			}
		})
	}
}
