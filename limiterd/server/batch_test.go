package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/limiterd/limiterd/internal/testsupport"
)

// batchAnswer decodes a batch's 200 answer into its raw results.
func batchAnswer(t *testing.T, a answer) []json.RawMessage {
	t.Helper()
	if a.status != http.StatusOK {
		t.Fatalf("batch answered %d %s, want 200", a.status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q", ct)
	}
	var body struct {
		Results []json.RawMessage `json:"results"`
	}
	dec := json.NewDecoder(strings.NewReader(a.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Results == nil {
		t.Fatalf("batch answer %q: %v", a.body, err)
	}
	return body.Results
}

// TestBatchAnswersLikeSingleCalls sends one batch to a handler and its items one by one to
// another handler on the same policies: each result must be the single call's body, byte for
// byte, or its error and status. Items on one key are decided in order; bad items fail alone.
func TestBatchAnswersLikeSingleCalls(t *testing.T) {
	newHandler := func() *Decisions {
		clock := testsupport.NewClock()
		return NewDecisions(newEngine(t, clock,
			newPolicy("a", testsupport.TokenBucketTier("standard", 3, 1, time.Second), testsupport.UnlimitedTier("vip")),
			newPolicy("b", testsupport.SlidingWindowTier("strict", 2, time.Second)),
			newPolicy("c", testsupport.StackedTier("paid", testsupport.TokenBucketLimit("burst", 2, 1, time.Second),
				testsupport.SlidingWindowLimit("daily", 3, time.Hour)))), nil)
	}
	items := []string{
		`{"policy":"default/a","key":"alice"}`,
		`{"policy":"default/b","key":"alice","cost":1}`,
		`{"policy":"default/a","key":"alice","cost":2}`,
		`{"policy":"default/a","key":"alice"}`, // rejected: the two before spent the 3 tokens
		`{"policy":"default/b","key":"alice"}`,
		`{"policy":"default/b","key":"alice"}`,           // rejected
		`{"policy":"b","key":"alice"}`,                   // default/b: rejected too
		`{"policy":"missing","key":"alice"}`,             // default/missing: 404
		`{"policy":"default/a","key":"bob","cost":4}`,    // above the capacity: no wait admits it
		`{"policy":"default/missing","key":"alice"}`,     // 404
		`{"key":"alice"}`,                                // 400: two policies are loaded
		`{"policy":"default/a","key":"alice","cost":0}`,  // a peek
		`{"policy":"default/a","key":"alice","cost":-1}`, // 400
		`{"policy":"default/a"}`,                         // 400: no key
		`{"policy":"default/a","key":"x","colour":"red"}`,
		`{"policy":"default/a","key":"x","key":"y"}`,
		`{"policy":"default/a","key":"` + strings.Repeat("k", MaxKeyBytes+1) + `"}`,
		`{"policy":"default/a","key":"\ud800"}`, // a lone surrogate is not UTF-8
		`"default/a alice"`,
		`[1, {"key": "a"}]`,
		`null`,
		`{"policy":"default/a","key":"bob"}`,
		`{"policy":"default/c","key":"alice"}`,          // a stack: every limit's answer
		`{"policy":"default/c","key":"alice","cost":2}`, // burst rejects: daily is not charged
		`{"policy":"default/c","key":"alice","cost":0}`,
		`{"policy":"default/c","key":"alice","cost":1}`,
		`{"policy":"default/c","key":"alice","cost":5}`, // above both limits
	}
	batch := serve(t, newHandler(), http.MethodPost, "/v1/allow:batch", `{"items": [`+strings.Join(items, ",\n ")+`]}`)
	results := batchAnswer(t, batch)
	if len(results) != len(items) {
		t.Fatalf("%d results for %d items: %s", len(results), len(items), batch.body)
	}
	single := newHandler()
	for i, item := range items {
		one := serve(t, single, http.MethodPost, "/v1/allow", item)
		switch one.status {
		case http.StatusOK, http.StatusTooManyRequests:
			if got, want := string(results[i]), strings.TrimSpace(one.body); got != want {
				t.Errorf("item %d %s:\n batch  %s\n single %s", i, item, got, want)
			}
			continue
		}
		var e struct {
			Error  string `json:"error"`
			Status int    `json:"status"`
		}
		dec := json.NewDecoder(bytes.NewReader(results[i]))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil || e.Error == "" {
			t.Errorf("item %d %s: result %s is no error (single call: %d %s)", i, item, results[i], one.status, one.body)
			continue
		}
		if e.Status != one.status {
			t.Errorf("item %d %s: status %d, single call %d %s", i, item, e.Status, one.status, one.body)
		}
		if msg := one.errorText(t); msg != e.Error && !strings.Contains(msg, "body") {
			t.Errorf("item %d %s: error %q, single call %q", i, item, e.Error, msg)
		}
	}
}

func TestBatchItemErrorsSayItem(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("a", testsupport.TokenBucketTier("standard", 3, 1, time.Second))), nil)
	results := batchAnswer(t, serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[5,{"key":"a","key":"b"}]}`))
	want := []string{`{"error":"item must be a JSON object","status":400}`, `{"error":"item names a field twice","status":400}`}
	for i, w := range want {
		if string(results[i]) != w {
			t.Errorf("result %d: %s, want %s", i, results[i], w)
		}
	}
}

func TestBatchEmptyAndFull(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("a", testsupport.TokenBucketTier("standard", 600, 1, time.Second))), nil)
	if got := batchAnswer(t, serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[]}`)); len(got) != 0 {
		t.Fatalf("empty batch: %d results", len(got))
	}
	full := `{"items":[` + strings.TrimSuffix(strings.Repeat(`{"key":"k"},`, MaxBatchItems), ",") + `]}`
	results := batchAnswer(t, serve(t, h, http.MethodPost, "/v1/allow:batch", full))
	if len(results) != MaxBatchItems {
		t.Fatalf("%d results for %d items", len(results), MaxBatchItems)
	}
	// One key, 600 tokens: the first 600 are admitted in order, the rest rejected.
	for i, r := range results {
		allowed := strings.HasPrefix(string(r), `{"allowed":true,`)
		if allowed != (i < 600) {
			t.Fatalf("item %d of one key: %s", i, r)
		}
	}
	if want := `{"allowed":true,"limit":600,"remaining":599,`; !strings.HasPrefix(string(results[0]), want) {
		t.Fatalf("first item %s, want %s...", results[0], want)
	}
}

func TestBatchRefusesTheWholeBatch(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock(), newPolicy("a", testsupport.TokenBucketTier("standard", 3, 1, time.Second))), nil)
	tooMany := `{"items":[` + strings.TrimSuffix(strings.Repeat(`{"key":"k"},`, MaxBatchItems+1), ",") + `]}`
	tooLarge := `{"items":[{"key":"k","x":"` + strings.Repeat("x", MaxBatchBodyBytes) + `"}]}`
	for _, tc := range []struct {
		name, method, body string
		status             int
	}{
		{"empty body", http.MethodPost, "", 400},
		{"not JSON", http.MethodPost, `items=1`, 400},
		{"not an object", http.MethodPost, `[{"key":"k"}]`, 400},
		{"no items", http.MethodPost, `{}`, 400},
		{"unknown field", http.MethodPost, `{"items":[],"policy":"default/a"}`, 400},
		{"items twice", http.MethodPost, `{"items":[],"items":[]}`, 400},
		{"items not an array", http.MethodPost, `{"items":{"key":"k"}}`, 400},
		{"items null", http.MethodPost, `{"items":null}`, 400},
		{"malformed item", http.MethodPost, `{"items":[{"key":"k"},{"key":}]}`, 400},
		{"malformed value in an item", http.MethodPost, `{"items":[{"key":"k","x":[1,]}]}`, 400},
		{"unterminated", http.MethodPost, `{"items":[{"key":"k"}`, 400},
		{"trailing data", http.MethodPost, `{"items":[]} {}`, 400},
		{"too deep", http.MethodPost, `{"items":[{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}]}`, 400},
		{"too many items", http.MethodPost, tooMany, 413},
		{"body too large", http.MethodPost, tooLarge, 413},
		{"GET", http.MethodGet, "", 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := serve(t, h, tc.method, "/v1/allow:batch", tc.body)
			if a.status != tc.status {
				t.Fatalf("%d %s, want %d", a.status, a.body, tc.status)
			}
			a.errorText(t)
		})
	}
	// Nothing was decided: alice still has her 3 tokens.
	results := batchAnswer(t, serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[{"key":"k","cost":3}]}`))
	if !strings.HasPrefix(string(results[0]), `{"allowed":true,"limit":3,"remaining":0,`) {
		t.Fatalf("after refused batches: %s", results[0])
	}
}

func TestBatchBeforeAnyPolicyIs503(t *testing.T) {
	h := NewDecisions(newEngine(t, testsupport.NewClock()), nil)
	a := serve(t, h, http.MethodPost, "/v1/allow:batch", `{"items":[{"key":"k"}]}`)
	if a.status != http.StatusServiceUnavailable {
		t.Fatalf("%d %s, want 503", a.status, a.body)
	}
	a.errorText(t)
}

func FuzzDecodeBatchRequest(f *testing.F) {
	for _, seed := range []string{
		`{"items":[]}`, `{"items":[{"key":"k"},{"policy":"default/api","key":"alice","cost":3}]}`,
		`{"items":[{"key":"k","cost":1.5},5,"x",null,[{}],{"key":"\u00e9\ud83d\ude00"}]}`,
		`{"items":[{"key":"k","x":{"y":[true,false,null,-0.5e+3]}}]}`, `{"items":[{"key":"k"}],}`,
		`{"items":[{"key":"k"}]} `, `{"items":[{"key":"k","key":"j"}]}`, `{"items":[1,]}`, `{"items":[01]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		items, err := DecodeBatchRequest(body, nil)
		if err != nil {
			var reqErr errRequest
			if !errors.As(err, &reqErr) {
				t.Fatalf("error %v is not a client error", err)
			}
			if len(items) > MaxBatchItems {
				t.Fatalf("%d items decoded", len(items))
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted %q, which encoding/json rejects", body)
		}
		var std struct {
			Items []json.RawMessage `json:"items"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&std); err != nil {
			t.Fatalf("accepted %q, which encoding/json rejects: %v", body, err)
		}
		if len(std.Items) != len(items) || len(items) > MaxBatchItems {
			t.Fatalf("%d items, encoding/json says %d", len(items), len(std.Items))
		}
		for i, it := range items {
			// An item decodes as the body of a single call does.
			want, werr := DecodeAllowRequest(std.Items[i])
			if it.Err != nil {
				if strings.HasPrefix(it.Err.Error(), "malformed JSON") {
					t.Fatalf("item %d of a well-formed batch: %v", i, it.Err)
				}
				if werr == nil && bytes.HasPrefix(bytes.TrimSpace(std.Items[i]), []byte("{")) {
					t.Fatalf("item %d %s: %v, but it is a valid request", i, std.Items[i], it.Err)
				}
				continue
			}
			if werr != nil || want != it.AllowRequest {
				t.Fatalf("item %d %s: %+v, alone %+v %v", i, std.Items[i], it.AllowRequest, want, werr)
			}
			if it.Key == "" || !utf8.ValidString(it.Key) || it.Cost < 0 || it.Cost > MaxCost {
				t.Fatalf("item %d: accepted %+v", i, it.AllowRequest)
			}
		}
	})
}
