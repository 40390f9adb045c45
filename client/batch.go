package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
)

// MaxBatchItems is the most items limiterd decides in one AllowBatch call.
const MaxBatchItems = 1000

// maxBatchAnswerBytes bounds a batch's answer read from limiterd: MaxBatchItems results with
// long error messages.
const maxBatchAnswerBytes = 8 << 20

// BatchItem is one request of a batch.
type BatchItem struct {
	// Policy names the item's policy ("<namespace>/<name>"); "" uses the Client's (WithPolicy),
	// or limiterd's only policy.
	Policy string
	// Key identifies the client.
	Key string
	// Cost is what the request spends; 0 peeks, as AllowN does (set it to 1 for one request).
	Cost int64
}

// Result is limiterd's answer to one item of a batch: its Decision, or Err, an *Error with the
// status a single call would have answered (400 for an invalid item, 404 for an unknown policy),
// when the item was not decided and consumed nothing. A batch answer has no header fields, so
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
// limiterd far less than one call each. It returns one Result per item, in the order of items:
// limiterd decides them in that order, so that items on one client key are decided as
// successive AllowN calls would be, and a bad item fails alone (Result.Err). It returns an
// *Error, and no result, when limiterd refuses the whole batch (413 for more than
// MaxBatchItems items, 503 before any policy is loaded), and another error when limiterd could
// not be asked or answered something that is no batch answer. No items: no call.
func (c *Client) AllowBatch(ctx context.Context, items []BatchItem) ([]Result, error) {
	if len(items) == 0 {
		return nil, nil
	}
	req := batchRequest{Items: make([]allowRequest, len(items))}
	for i, it := range items {
		req.Items[i] = allowRequest(it)
		if it.Policy == "" {
			req.Items[i].Policy = c.policy
		}
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
	if len(answer.Results) != len(items) {
		return nil, fmt.Errorf("limiterd answered %d results for %d items", len(answer.Results), len(items))
	}
	out := make([]Result, len(items))
	for i, r := range answer.Results {
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
