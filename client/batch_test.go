package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/limiterd/limiterd/client"
)

// TestAllowBatchMatchesAllowN sends one batch to a limiterd and the same items one by one to
// another: every result must be the single call's decision (header fields aside) or its error.
func TestAllowBatchMatchesAllowN(t *testing.T) {
	batched, err := client.New(startLimiterd(t, apiPolicy+"---"+otherPolicy).URL, client.WithPolicy("default/api"))
	if err != nil {
		t.Fatal(err)
	}
	singleURL := startLimiterd(t, apiPolicy+"---"+otherPolicy).URL
	items := []client.BatchItem{
		{Key: "alice", Cost: 1}, {Key: "alice", Peek: true}, {Key: "alice"}, {Key: "alice", Cost: 1},
		{Key: "svc:billing", Cost: 50}, {Policy: "shop/other", Key: "alice", Cost: 1},
		{Policy: "default/missing", Key: "alice", Cost: 1}, {Key: "", Cost: 1}, {Key: "bob", Cost: -1}, {Key: "bob", Cost: 3},
		{Key: "carol\xff", Cost: 1}, {Key: "carol\xfe", Cost: 1}, {Key: "carol\uFFFD", Cost: 2},
	}
	results, err := batched.AllowBatch(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(items) {
		t.Fatalf("%d results for %d items", len(results), len(items))
	}
	for i, it := range items {
		policy := it.Policy
		if policy == "" {
			policy = "default/api"
		}
		single, err := client.New(singleURL, client.WithPolicy(policy))
		if err != nil {
			t.Fatal(err)
		}
		cost := it.Cost // what the item means: 0 is one request, a peek spends nothing
		switch {
		case it.Peek:
			cost = 0
		case cost == 0:
			cost = 1
		}
		want, werr := single.AllowN(context.Background(), it.Key, cost)
		got := results[i]
		var we, ge *client.Error
		switch {
		case errors.Is(werr, client.ErrKeyNotUTF8): // refused by the client, not sent
			if !errors.Is(got.Err, client.ErrKeyNotUTF8) {
				t.Errorf("item %d %+v: result %+v %v, single call %v", i, it, got.Decision, got.Err, werr)
			}
		case werr != nil && !errors.As(werr, &we):
			t.Fatalf("item %d: single call failed: %v", i, werr)
		case werr != nil:
			if !errors.As(got.Err, &ge) || *ge != *we {
				t.Errorf("item %d %+v: result %+v %v, single call %v", i, it, got.Decision, got.Err, werr)
			}
		default:
			want.RateLimitPolicy, want.RateLimit = "", "" // a batch answer has no header fields
			if got.Err != nil || !reflect.DeepEqual(got.Decision, want) {
				t.Errorf("item %d %+v:\n batch  %+v %v\n single %+v", i, it, got.Decision, got.Err, want)
			}
		}
	}
}

// TestAllowBatchRefusedWhole checks the errors of a batch limiterd refuses as a whole, and of
// answers limiterd never gives.
func TestAllowBatchRefusedWhole(t *testing.T) {
	c, err := client.New(startLimiterd(t, apiPolicy).URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.AllowBatch(context.Background(), make([]client.BatchItem, client.MaxBatchItems+1))
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("too many items: %v, want a 413 *client.Error", err)
	}
	if r, err := c.AllowBatch(context.Background(), nil); r != nil || err != nil {
		t.Fatalf("no items: %v %v", r, err)
	}
	for _, tc := range []struct{ name, body, errSubstr string }{
		{"fewer results", `{"results":[]}`, "0 results for 1 items"},
		{"not JSON", `ok`, "decode limiterd's batch answer"},
		{"no allowed", `{"results":[{"limit":1}]}`, `result 0 has no "allowed"`},
		{"error without status", `{"results":[{"error":"x"}]}`, "error with status 0"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/allow:batch" {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write([]byte(tc.body))
		}))
		c, err := client.New(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.AllowBatch(context.Background(), []client.BatchItem{{Key: "a", Cost: 1}}); err == nil || !strings.Contains(err.Error(), tc.errSubstr) {
			t.Errorf("%s: %v, want one containing %q", tc.name, err, tc.errSubstr)
		}
		srv.Close()
	}
}

// TestBatchItemCost checks what a batch item spends: its zero Cost is one request (as an
// omitted cost on the wire), Peek spends nothing, and a peek with a cost is refused unsent.
func TestBatchItemCost(t *testing.T) {
	limiterd := startLimiterd(t, apiPolicy) // 2 tokens, then 1 a second, on a clock that does not move
	var sent []int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		var req struct {
			Items []struct {
				Cost *int64 `json:"cost"`
			} `json:"items"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("batch body %s: %v", body, err)
		}
		for _, it := range req.Items {
			if it.Cost == nil {
				t.Errorf("batch body %s: an item without cost", body)
				continue
			}
			sent = append(sent, *it.Cost)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		limiterd.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, client.WithPolicy("default/api"))
	if err != nil {
		t.Fatal(err)
	}
	results, err := c.AllowBatch(context.Background(), []client.BatchItem{
		{Key: "alice"}, {Key: "alice"}, {Key: "alice"}, // the zero Cost: one request each
		{Key: "bob", Peek: true}, {Key: "bob", Peek: true}, {Key: "bob", Peek: true},
		{Key: "carol", Peek: true, Cost: 1},
		{Key: "dave", Cost: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{1, 1, 1, 0, 0, 0, 2}; !reflect.DeepEqual(sent, want) {
		t.Errorf("costs sent %v, want %v (carol's item unsent)", sent, want)
	}
	type outcome struct {
		allowed   bool
		remaining int64
	}
	want := []outcome{{true, 1}, {true, 0}, {false, 0}, {true, 2}, {true, 2}, {true, 2}, {}, {true, 0}}
	for i, r := range results {
		if i == 6 {
			if !errors.Is(r.Err, client.ErrPeekWithCost) || client.Unavailable(r.Err) || r.Allowed {
				t.Errorf("item %d, a peek with a cost: %+v %v; want ErrPeekWithCost", i, r.Decision, r.Err)
			}
			continue
		}
		if r.Err != nil || (outcome{r.Allowed, r.Remaining}) != want[i] {
			t.Errorf("item %d: %+v %v; want allowed=%t remaining=%d", i, r.Decision, r.Err, want[i].allowed, want[i].remaining)
		}
	}
	// The peeks spent nothing: bob still has both tokens.
	if d, err := c.AllowN(context.Background(), "bob", 2); err != nil || !d.Allowed {
		t.Errorf("bob's 2 units after 3 peeks: %+v %v", d, err)
	}
}
