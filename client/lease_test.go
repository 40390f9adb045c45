package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/limiterd/limiterd/client"
)

// concurrencyPolicy is default/jobs: one request per client in flight, a lease held for 30s at
// most.
const concurrencyPolicy = `
apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: jobs
spec:
  defaultTier: reports
  tiers:
    - name: reports
      algorithm: Concurrency
      concurrency: {limit: 1, leaseTimeout: 30s}
`

// newLeaseClient returns a client of a limiterd serving concurrencyPolicy.
func newLeaseClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(startLimiterd(t, concurrencyPolicy).URL)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// acquire asks for alice's place and fails the test unless it was admitted with a lease.
func acquire(t *testing.T, c *client.Client) client.Lease {
	t.Helper()
	d, err := c.Allow(t.Context(), "alice")
	if err != nil || !d.Allowed || d.Lease.Token == "" {
		t.Fatalf("Allow(alice) = %+v, %v; want admitted with a lease", d, err)
	}
	return d.Lease
}

// rejected fails the test unless alice is refused: her one place is held.
func rejected(t *testing.T, c *client.Client, when string) {
	t.Helper()
	d, err := c.Allow(t.Context(), "alice")
	if err != nil || d.Allowed || d.Lease != (client.Lease{}) {
		t.Fatalf("Allow(alice) %s = %+v, %v; want rejected without a lease", when, d, err)
	}
}

// statusOf returns the status of a *client.Error, or 0.
func statusOf(err error) int {
	var e *client.Error
	if errors.As(err, &e) {
		return e.StatusCode
	}
	return 0
}

// TestReleaseFreesAPlace checks that an admission's Lease is read whole, holds the client's
// place until Release, and that Release frees it: a client at its limit is admitted again.
func TestReleaseFreesAPlace(t *testing.T) {
	c := newLeaseClient(t)
	lease := acquire(t, c)
	wantExpiry := time.Date(2030, 1, 2, 3, 4, 35, 0, time.UTC) // the frozen clock + 30s
	if !lease.ExpiresAt.Equal(wantExpiry) || lease.Timeout != 30*time.Second {
		t.Errorf("lease expires at %v after %v, want %v after 30s", lease.ExpiresAt, lease.Timeout, wantExpiry)
	}
	rejected(t, c, "while her lease is held")
	if err := c.Release(t.Context(), lease); err != nil {
		t.Fatalf("Release: %v", err)
	}
	acquire(t, c)
}

// TestReleaseTwice checks that a lease releases once: the second release is the typed 409, and
// changes nothing (the place taken since stays held). The zero Lease is refused unsent.
func TestReleaseTwice(t *testing.T) {
	c := newLeaseClient(t)
	lease := acquire(t, c)
	if err := c.Release(t.Context(), lease); err != nil {
		t.Fatalf("Release: %v", err)
	}
	acquire(t, c)
	err := c.Release(t.Context(), lease)
	if statusOf(err) != 409 || client.Unavailable(err) {
		t.Fatalf("second Release: %v, want a 409 *client.Error", err)
	}
	rejected(t, c, "after a refused release")
	if err := c.Release(t.Context(), client.Lease{}); !errors.Is(err, client.ErrNoLease) {
		t.Errorf("Release(zero Lease): %v, want ErrNoLease", err)
	}
	if _, err := c.Extend(t.Context(), client.Lease{}); !errors.Is(err, client.ErrNoLease) {
		t.Errorf("Extend(zero Lease): %v, want ErrNoLease", err)
	}
}

// TestExtend checks that Extend answers a new lease that keeps the place, that the old lease is
// spent (409), and that the new one releases it.
func TestExtend(t *testing.T) {
	c := newLeaseClient(t)
	old := acquire(t, c)
	lease, err := c.Extend(t.Context(), old)
	if err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if lease.Token == "" || lease.Token == old.Token || lease.Timeout != 30*time.Second || lease.ExpiresAt.IsZero() {
		t.Fatalf("Extend = %+v, want a new lease of 30s (the old: %+v)", lease, old)
	}
	rejected(t, c, "while her extended lease is held")
	if err := c.Release(t.Context(), old); statusOf(err) != 409 {
		t.Fatalf("Release of the extended lease: %v, want a 409 *client.Error", err)
	}
	if _, err := c.Extend(t.Context(), old); statusOf(err) != 409 {
		t.Fatalf("Extend of the extended lease: %v, want a 409 *client.Error", err)
	}
	rejected(t, c, "after refused releases of the old lease")
	if err := c.Release(t.Context(), lease); err != nil {
		t.Fatalf("Release of the new lease: %v", err)
	}
	acquire(t, c)
}

// TestBatchItemLease checks that a batch's admitted item carries its lease, which releases.
func TestBatchItemLease(t *testing.T) {
	c := newLeaseClient(t)
	results, err := c.AllowBatch(t.Context(), []client.BatchItem{{Key: "alice"}, {Key: "alice"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := results[0]; r.Err != nil || !r.Allowed || r.Lease.Token == "" || r.Lease.Timeout != 30*time.Second {
		t.Fatalf("item 0 = %+v, want admitted with a lease", r)
	}
	if r := results[1]; r.Err != nil || r.Allowed || r.Lease.Token != "" {
		t.Fatalf("item 1 = %+v, want rejected without a lease", r)
	}
	if err := c.Release(t.Context(), results[0].Lease); err != nil {
		t.Fatalf("Release: %v", err)
	}
	acquire(t, c)
}
