package client_test

import (
	"context"
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
