package server

import (
	"bytes"
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
)

// TestRefund checks that a refund returns units to the client's allowance, clamped to the
// limit, for both algorithms, and answers 200 with a peek after it.
func TestRefund(t *testing.T) {
	for _, tier := range []v1alpha1.Tier{
		testsupport.TokenBucketTier("standard", 10, 1, time.Hour),
		testsupport.SlidingWindowTier("standard", 10, time.Hour),
	} {
		t.Run(string(tier.Algorithm), func(t *testing.T) {
			h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("api", tier)), nil)
			// Reserve an estimate of 8, use 3, refund 5.
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":8}`); a.status != 200 {
				t.Fatalf("reserve: %d %s", a.status, a.body)
			}
			a := serve(t, h, http.MethodPost, "/v1/refund", `{"policy":"default/api","key":"k","amount":5}`)
			if a.status != 200 || !strings.HasPrefix(a.body, `{"allowed":true,"limit":10,"remaining":7,`) ||
				!strings.HasPrefix(a.header.Get("RateLimit"), `"standard";r=7;`) {
				t.Fatalf("refund: %d %v %s", a.status, a.header, a.body)
			}
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":7}`); a.status != 200 {
				t.Fatalf("spend the refunded allowance: %d %s", a.status, a.body)
			}
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`); a.status != 429 {
				t.Fatalf("beyond the limit: %d %s, want 429", a.status, a.body)
			}
			// Clamped: a refund larger than what was spent leaves exactly the limit.
			if a := serve(t, h, http.MethodPost, "/v1/refund", `{"key":"k","amount":1000}`); a.status != 200 || !strings.Contains(a.body, `"remaining":10,`) {
				t.Fatalf("refund of 1000: %d %s, want remaining 10", a.status, a.body)
			}
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k","cost":10}`); a.status != 200 || !strings.Contains(a.body, `"remaining":0,`) {
				t.Fatalf("after the clamped refund: %d %s", a.status, a.body)
			}
			if a := serve(t, h, http.MethodPost, "/v1/allow", `{"key":"k"}`); a.status != 429 {
				t.Fatalf("the clamped refund gave more than the limit: %d %s", a.status, a.body)
			}
		})
	}
}

func TestRefundRejectsBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name, method, body string
		status             int
	}{
		{"no amount", "POST", `{"key":"k"}`, 400},
		{"amount zero", "POST", `{"key":"k","amount":0}`, 400},
		{"amount negative", "POST", `{"key":"k","amount":-2}`, 400},
		{"amount null", "POST", `{"key":"k","amount":null}`, 400},
		{"amount fraction", "POST", `{"key":"k","amount":1.5}`, 400},
		{"amount string", "POST", `{"key":"k","amount":"2"}`, 400},
		{"amount too large", "POST", `{"key":"k","amount":1000000001}`, 400},
		{"cost is not a refund field", "POST", `{"key":"k","cost":2}`, 400},
		{"no key", "POST", `{"amount":2}`, 400},
		{"amount twice", "POST", `{"key":"k","amount":1,"amount":1}`, 400},
		{"malformed", "POST", `{"key":"k","amount":1`, 400},
		{"trailing data", "POST", `{"key":"k","amount":1}x`, 400},
		{"unknown policy", "POST", `{"policy":"default/nope","key":"k","amount":1}`, 404},
		{"GET", "GET", ``, 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("api", testsupport.TokenBucketTier("standard", 3, 1, time.Hour))), nil)
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

// FuzzDecodeRefundRequest checks the decoder against encoding/json: whatever it accepts is
// valid JSON that encoding/json decodes to the same request, and it re-encodes to itself.
func FuzzDecodeRefundRequest(f *testing.F) {
	for _, seed := range []string{
		`{"key":"k","amount":1}`, `{"policy":"default/api","key":"alice","amount":300}`, `{"key":"\u00e9","amount":2}`,
		`{"key":"k","amount":1.5}`, `{"key":"k","amount":0}`, `{"amount":1,"key":"k","policy":null}`, `{"key":"k"}`,
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
		if got.Key == "" || len(got.Key) > len(body) || !utf8.ValidString(got.Key) ||
			len(got.Policy) > MaxPolicyBytes || !utf8.ValidString(got.Policy) || got.Amount < 1 || got.Amount > MaxCost {
			t.Fatalf("accepted %+v", got)
		}
		var std struct {
			Policy *string      `json:"policy"`
			Key    *string      `json:"key"`
			Amount *json.Number `json:"amount"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		dec.UseNumber()
		if err := dec.Decode(&std); err != nil || dec.More() {
			t.Fatalf("accepted %q, which encoding/json rejects: %v", body, err)
		}
		if std.Key == nil || *std.Key != got.Key || (std.Policy != nil && *std.Policy != got.Policy) || (std.Policy == nil && got.Policy != "") {
			t.Fatalf("%+v, encoding/json says %+v", got, std)
		}
		if std.Amount == nil || std.Amount.String() != strconv.FormatInt(got.Amount, 10) {
			t.Fatalf("amount %d, encoding/json says %v", got.Amount, std.Amount)
		}
		again, err := json.Marshal(map[string]any{"policy": got.Policy, "key": got.Key, "amount": got.Amount})
		if err != nil {
			t.Fatal(err)
		}
		if round, err := DecodeRefundRequest(again); err != nil || round != got {
			t.Fatalf("re-encoded %s decodes to %+v, %v; want %+v", again, round, err, got)
		}
	})
}
