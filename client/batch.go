package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// MaxBatchItems is the most items limiterd decides in one AllowBatch call.
const MaxBatchItems = 1000

// maxBatchAnswerBytes bounds a batch's answer read from limiterd: MaxBatchItems results with
// long error messages.
const maxBatchAnswerBytes = 8 << 20

// BatchItem is one request of a batch. Its zero Cost spends one unit, as Allow does: an item
// that says nothing about its cost is one request, never a free look. Set Peek to look without
// spending.
//
//	{Key: "alice"}              // one request: spends 1
//	{Key: "alice", Cost: 5}     // spends 5
//	{Key: "alice", Peek: true}  // what a one-unit request would get now; spends nothing
type BatchItem struct {
	// Policy names the item's policy ("<namespace>/<name>", or "<name>" in namespace default);
	// "" uses the Client's (WithPolicy), or limiterd's only policy.
	Policy string
	// Key identifies the client.
	Key string
	// Cost is what the request spends; 0 means 1 (as an omitted cost does in limiterd's API),
	// so that a batch that forgets its costs still limits. A negative Cost is sent as it is,
	// and limiterd refuses the item (400).
	Cost int64
	// Peek asks what a one-unit request of Key would get now, consuming nothing, as
	// Client.Peek does. Cost must then be 0: an item with both is not sent, and its
	// Result.Err wraps ErrPeekWithCost.
	Peek bool
}

// ErrPeekWithCost is the error, wrapped, of a BatchItem with Peek set and a Cost other than 0:
// it asks both to spend and not to spend, so the Client refuses it without sending it, and
// nothing is decided or consumed for it.
var ErrPeekWithCost = errors.New("a peek has no cost: set Peek or Cost, not both")

// wireCost is the cost an item sends: 0 for a peek, 1 for the zero Cost.
func (it BatchItem) wireCost() (int64, error) {
	switch {
	case it.Peek && it.Cost != 0:
		return 0, ErrPeekWithCost
	case it.Peek:
		return 0, nil
	case it.Cost == 0:
		return 1, nil
	}
	return it.Cost, nil
}

// Result is limiterd's answer to one item of a batch: its Decision, or Err when the item was not
// decided and consumed nothing: an *Error with the status a single call would have answered (400
// for an invalid item, 404 for an unknown policy), or an error wrapping ErrKeyNotUTF8 for a key
// the Client refused without sending it, as AllowN does, or ErrPeekWithCost for a peek with a
// cost. A batch answer has no header fields, so
// Decision's RateLimitPolicy and RateLimit are "".
type Result struct {
	Decision
	Err error
}

// batchRequest is the body of POST /v1/allow:batch.
type batchRequest struct {
	Items []allowRequest `json:"items"`
}

// batchResult is one result of a batch: a decision, or an error with its status.
type batchResult struct {
	answer
	Error  *string `json:"error"`
	Status int     `json:"status"`
}

// AllowBatch asks for the decisions of up to MaxBatchItems items in one call, which costs
// limiterd far less than one call each. Each item spends its Cost, 1 when Cost is 0, or nothing
// when it is a Peek (see BatchItem). It returns one Result per item, in the order of items:
// limiterd decides them in that order, so that items on one client key are decided as
// successive AllowN calls would be, and a bad item fails alone (Result.Err). An item whose key
// is not valid UTF-8, or a Peek with a Cost, is not sent: its Result.Err wraps ErrKeyNotUTF8 or
// ErrPeekWithCost, and the other items are decided as if it were not there (as limiterd skips
// an invalid item). It returns an *Error,
// and no result, when limiterd refuses the whole batch (413 for more than MaxBatchItems items
// sent, 503 before any policy is loaded), and another error when limiterd could not be asked
// or answered something that is no batch answer. No items to send: no call.
func (c *Client) AllowBatch(ctx context.Context, items []BatchItem) ([]Result, error) {
	if len(items) == 0 {
		return nil, nil
	}
	out := make([]Result, len(items))
	// sent are the indexes in items of the items sent, in order: all but refused keys.
	sent := make([]int, 0, len(items))
	req := batchRequest{Items: make([]allowRequest, 0, len(items))}
	for i, it := range items {
		if err := checkKey(it.Key); err != nil {
			out[i].Err = fmt.Errorf("item %d: %w", i, err)
			continue
		}
		cost, err := it.wireCost()
		if err != nil {
			out[i].Err = fmt.Errorf("item %d: %w", i, err)
			continue
		}
		if it.Policy == "" {
			it.Policy = c.policy
		}
		req.Items = append(req.Items, allowRequest{Policy: it.Policy, Key: it.Key, Cost: cost})
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return out, nil
	}
	body, err := json.Marshal(req)
	if err != nil { // unreachable: strings and integers always marshal
		return nil, fmt.Errorf("encode batch request: %w", err)
	}
	ans, err := c.send(ctx, c.allowURL+":batch", body, maxBatchAnswerBytes)
	if err != nil {
		return nil, err
	}
	if ans.status != http.StatusOK {
		return nil, errorOf(ans.status, ans.data)
	}
	var answer struct {
		Results []batchResult `json:"results"`
	}
	if err := json.Unmarshal(ans.data, &answer); err != nil {
		return nil, fmt.Errorf("decode limiterd's batch answer: %w", err)
	}
	if len(answer.Results) != len(sent) {
		return nil, fmt.Errorf("limiterd answered %d results for %d items", len(answer.Results), len(sent))
	}
	for j, r := range answer.Results {
		i := sent[j]
		if r.Error != nil {
			if r.Status < 400 || r.Status > 599 {
				return nil, fmt.Errorf("limiterd's result %d is an error with status %d", i, r.Status)
			}
			out[i].Err = &Error{StatusCode: r.Status, Message: *r.Error}
			continue
		}
		if out[i].Decision, err = r.decision(); err != nil {
			return nil, fmt.Errorf("limiterd's result %d %w", i, err)
		}
	}
	return out, nil
}
