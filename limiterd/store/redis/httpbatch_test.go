package redis

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	limiterdserver "github.com/limiterd/limiterd/limiterd/server"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// TestHTTPBatchCannotChooseFailureMode is the reported attack from the outside: batches of
// 1,000 items of a 4-limit stacked tier, on a key of 1,024 '{', through the decisions handler
// and the engine on Redis with failure mode Open (the default). Redis decides every item: 5 are
// admitted over all batches, as the tier's first limit says, none by the failure mode, and the
// breaker stays closed for the other clients. Before, every batch timed out as a whole and Open
// admitted all 1,000 items of each.
func TestHTTPBatchCannotChooseFailureMode(t *testing.T) {
	srv := redistest.Start(t)
	// A timeout of 2 s: above the default 50 ms, so that a piece is not failed by a starved
	// CPU on a shared test machine (TestLargeBatchIsDecidedByRedis checks the bound against a
	// batch of more than a timeout's worth of Redis time on any machine). With 500 ms, a make
	// test run at load average 19 on 2 cores timed pieces out, and failure mode Open admitted
	// 17: a fault of the machine, not the failure mode chosen by the batch.
	c := newClient(t, Options{Addrs: []string{srv.Addr()}, Timeout: 2 * time.Second})
	e := engineWith(t, c, `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: stacked, namespace: default}
spec:
  defaultTier: metered
  tiers:
  - name: metered
    limits:
    - {name: burst, algorithm: TokenBucket, tokenBucket: {capacity: 5, refillRate: 1, refillPeriod: 1h}}
    - {name: minute, algorithm: SlidingWindow, slidingWindow: {limit: 50, window: 1m}}
    - {name: second, algorithm: TokenBucket, tokenBucket: {capacity: 500, refillRate: 1, refillPeriod: 1s}}
    - {name: daily, algorithm: SlidingWindow, slidingWindow: {limit: 5000, window: 24h}}
`)
	hs := httptest.NewServer(limiterdserver.NewDecisions(e, nil))
	defer hs.Close()

	item := `{"key": "` + strings.Repeat("{", 1024) + `", "cost": 1}`
	body := `{"items": [` + strings.Repeat(item+",", 999) + item + `]}`
	admitted := 0
	for range 6 {
		resp, err := http.Post(hs.URL+"/v1/allow:batch", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var answer struct {
			Results []struct {
				Allowed bool `json:"allowed"`
			} `json:"results"`
		}
		err = json.NewDecoder(resp.Body).Decode(&answer)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || len(answer.Results) != 1000 {
			t.Fatalf("batch: status %d, %d results, %v", resp.StatusCode, len(answer.Results), err)
		}
		for _, r := range answer.Results {
			if r.Allowed {
				admitted++
			}
		}
	}
	if admitted != 5 {
		t.Errorf("6 batches of 1,000 items admitted %d, want the tier's 5", admitted)
	}
	if c.BreakerTrips() != 0 {
		t.Errorf("the breaker opened %d times", c.BreakerTrips())
	}
	r, err := e.Decide(t.Context(), "", "unrelated", 1)
	if err != nil || r.StoreError != nil || !r.Allowed {
		t.Errorf("an unrelated client after the batches: %+v, %v", r, err)
	}
}
