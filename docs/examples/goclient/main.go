// Command goclient asks limiterd (`make run`) for decisions with the Go client.
package main

import (
	"context"
	"fmt"
	"log"

	"github.com/limiterd/limiterd/client"
)

func main() {
	// New returns an error for a malformed URL. WithPolicy names the policy: without it
	// limiterd decides under its only policy, and answers 400 to every call once several
	// policies are loaded.
	c, err := client.New("http://localhost:8080", client.WithPolicy("default/public-api"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	d, err := c.Allow(ctx, "sub:alice")
	switch {
	case client.Unavailable(err):
		// Unreachable, a timeout, a 5xx: choose to fail open or closed.
		log.Fatalf("limiterd unavailable: %v", err)
	case err != nil:
		// A 4xx (unknown policy, policy omitted while several are loaded) or a key that is not
		// UTF-8: the call is wrong, and fails the same way every time.
		log.Fatal(err)
	case d.Allowed:
		fmt.Printf("allowed, %d of %d left\n", d.Remaining, d.Limit)
	default:
		fmt.Printf("rejected, retry after %v\n", d.RetryAfter)
	}

	// Many decisions in one call. A zero Cost is one request; Peek spends nothing.
	results, err := c.AllowBatch(ctx, []client.BatchItem{
		{Key: "sub:alice"},
		{Key: "sub:acme-corp", Cost: 5},
		{Key: "sub:bob", Peek: true},
	})
	if err != nil {
		log.Fatal(err) // the whole batch failed
	}
	for _, r := range results {
		if r.Err != nil {
			fmt.Println("not decided:", r.Err)
			continue
		}
		fmt.Printf("allowed=%t remaining=%d of %d\n", r.Allowed, r.Remaining, r.Limit)
	}
}
