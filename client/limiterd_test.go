package client_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/policy"
	"github.com/limiterd/limiterd/limiterd/server"
)

// startLimiterd serves limiterd's real decisions API for the policies of a policy file, on a
// clock that never moves (so that answers are deterministic), until the test ends.
func startLimiterd(tb testing.TB, policies string) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(server.NewDecisions(newEngine(tb, policies), nil))
	tb.Cleanup(srv.Close)
	return srv
}

func newEngine(tb testing.TB, policies string) *engine.Engine {
	tb.Helper()
	e, err := loadEngine(policies)
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// loadEngine returns an engine deciding for the policies of a policy file on a clock that never
// moves.
func loadEngine(policies string) (*engine.Engine, error) {
	docs, err := v1alpha1.DecodePolicies([]byte(policies))
	if err != nil {
		return nil, err
	}
	var compiled []*policy.Policy
	for i := range docs {
		p, err := policy.Compile(&docs[i])
		if err != nil {
			return nil, err
		}
		compiled = append(compiled, p)
	}
	set, err := policy.NewSet(compiled...)
	if err != nil {
		return nil, err
	}
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	e := engine.New(engine.Options{Clock: func() time.Time { return now }})
	e.Swap(set)
	return e, nil
}

// apiPolicy is default/api: 2 requests per client, then one a second.
const apiPolicy = `
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: standard
  tiers:
    - name: standard
      algorithm: TokenBucket
      tokenBucket:
        capacity: 2
        refillRate: 1
    - name: internal
      algorithm: Unlimited
  overrides:
    - tier: internal
      clientPrefixes: ["svc:"]
`

// otherPolicy is shop/other, so that two policies are loaded.
const otherPolicy = `
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: other
  namespace: shop
spec:
  defaultTier: all
  tiers:
    - name: all
      algorithm: SlidingWindow
      slidingWindow:
        limit: 100
        window: 1m
`

// stackedPolicy is default/api whose tier "paid" stacks burst, a bucket of 2 refilled by 1 a
// second, and daily, a bucket of 3 refilled by 3 a day (token buckets: refunds are enabled).
const stackedPolicy = `
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: paid
  refunds: Enabled
  tiers:
    - name: paid
      limits:
        - name: burst
          algorithm: TokenBucket
          tokenBucket: {capacity: 2, refillRate: 1}
        - name: daily
          algorithm: TokenBucket
          tokenBucket: {capacity: 3, refillRate: 3, refillPeriod: 24h}
`
