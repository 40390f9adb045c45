package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net/http/httptest"

	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/limiterd/server"
)

// exampleLimiterd serves limiterd's real decisions API with default/api loaded (2 requests per
// client, then 1 a second) on a clock that does not move. In production, baseURL is limiterd's
// --addr, e.g. "http://limiterd.limits.svc:8080".
func exampleLimiterd() *httptest.Server {
	e, err := loadEngine(apiPolicy)
	if err != nil {
		log.Fatal(err)
	}
	return httptest.NewServer(server.NewDecisions(e, nil))
}

func Example() {
	limiterd := exampleLimiterd()
	defer limiterd.Close()

	c, err := client.New(limiterd.URL, client.WithPolicy("default/api"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		d, err := c.Allow(context.Background(), "alice")
		if err != nil {
			fmt.Println(err) // limiterd unreachable or misconfigured: fail open or closed
			return
		}
		if d.Allowed {
			fmt.Printf("allowed, %d of %d left\n", d.Remaining, d.Limit)
		} else {
			fmt.Printf("rejected, retry after %v (RateLimit: %s)\n", d.RetryAfter, d.RateLimit)
		}
	}
	// Output:
	// allowed, 1 of 2 left
	// allowed, 0 of 2 left
	// rejected, retry after 1s (RateLimit: "standard";r=0;t=2)
}

func ExampleClient_AllowN() {
	limiterd := exampleLimiterd()
	defer limiterd.Close()

	c, err := client.New(limiterd.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	// A batch of 3 costs 3 units: more than the bucket holds, so no wait admits it, and the
	// rejection has no retry time.
	d, err := c.AllowN(context.Background(), "bob", 3)
	fmt.Println(d.Allowed, d.Limit, d.RetryAfter, err)
	// Output: false 2 0s <nil>
}

func ExampleError() {
	limiterd := exampleLimiterd()
	defer limiterd.Close()

	c, err := client.New(limiterd.URL, client.WithPolicy("default/typo"))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = c.Allow(context.Background(), "alice")
	var e *client.Error
	if errors.As(err, &e) {
		fmt.Println(e.StatusCode, e.Message)
	}
	// Output: 404 unknown policy "default/typo"
}

func ExampleClient_AllowBatch() {
	limiterd := exampleLimiterd()
	defer limiterd.Close()

	c, err := client.New(limiterd.URL, client.WithPolicy("default/api"))
	if err != nil {
		fmt.Println(err)
		return
	}
	// One call decides every item, in order: alice's third request finds her 2 tokens spent.
	results, err := c.AllowBatch(context.Background(), []client.BatchItem{
		{Key: "alice", Cost: 1},
		{Key: "alice", Cost: 1},
		{Key: "alice", Cost: 1},
		{Key: "bob", Cost: 2},
		{Policy: "default/typo", Key: "carol", Cost: 1},
	})
	if err != nil {
		fmt.Println(err) // the whole batch failed: limiterd unreachable, or too many items
		return
	}
	for _, r := range results {
		switch {
		case r.Err != nil:
			fmt.Println("not decided:", r.Err)
		case r.Allowed:
			fmt.Printf("allowed, %d of %d left\n", r.Remaining, r.Limit)
		default:
			fmt.Printf("rejected, retry after %v\n", r.RetryAfter)
		}
	}
	// Output:
	// allowed, 1 of 2 left
	// allowed, 0 of 2 left
	// rejected, retry after 1s
	// allowed, 0 of 2 left
	// not decided: limiterd answered 404 Not Found: unknown policy "default/typo"
}

// A key is UTF-8: the client refuses raw bytes, such as a digest, before asking limiterd.
// Encode binary data first (hex or base64), which gives each value its own key.
func ExampleErrKeyNotUTF8() {
	limiterd := exampleLimiterd()
	defer limiterd.Close()

	c, err := client.New(limiterd.URL, client.WithPolicy("default/api"))
	if err != nil {
		fmt.Println(err)
		return
	}
	digest := sha256.Sum256([]byte("device-serial-4711"))
	_, err = c.Allow(context.Background(), string(digest[:]))
	fmt.Println(errors.Is(err, client.ErrKeyNotUTF8), client.Unavailable(err))

	d, err := c.Allow(context.Background(), "device:"+hex.EncodeToString(digest[:]))
	fmt.Println(d.Allowed, err)
	// Output:
	// true false
	// true <nil>
}

// A concurrency limit admits at most so many of a client's requests at once: each admitted
// request holds a place by its lease until it releases it (or the lease times out).
func ExampleClient_Release() {
	e, err := loadEngine(concurrencyPolicy) // default/jobs: 1 request per client in flight
	if err != nil {
		log.Fatal(err)
	}
	limiterd := httptest.NewServer(server.NewDecisions(e, nil))
	defer limiterd.Close()
	c, err := client.New(limiterd.URL, client.WithPolicy("default/jobs"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	d, err := c.Allow(ctx, "alice")
	if err != nil || !d.Allowed {
		log.Fatal(d, err)
	}
	fmt.Println("admitted, lease of", d.Lease.Timeout)
	second, err := c.Allow(ctx, "alice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("while it runs, another request admitted:", second.Allowed)
	// ... the work ...
	// Release under a context that outlives a cancellation of the request's.
	if err := c.Release(context.WithoutCancel(ctx), d.Lease); err != nil {
		log.Print(err) // its place comes back at d.Lease.ExpiresAt anyway
	}
	third, err := c.Allow(ctx, "alice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after the release, admitted:", third.Allowed)

	// A lease releases once: a second release changes nothing.
	var e409 *client.Error
	if err := c.Release(ctx, d.Lease); errors.As(err, &e409) && e409.StatusCode == 409 {
		fmt.Println("released before")
	}
	// Output:
	// admitted, lease of 30s
	// while it runs, another request admitted: false
	// after the release, admitted: true
	// released before
}
