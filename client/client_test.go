package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/limiterd/server"
)

func TestAllowDecisions(t *testing.T) {
	srv := startLimiterd(t, apiPolicy)
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []client.Decision{
		{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Second,
			RateLimitPolicy: `"standard";q=2;w=2`, RateLimit: `"standard";r=1;t=1`},
		{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 2 * time.Second,
			RateLimitPolicy: `"standard";q=2;w=2`, RateLimit: `"standard";r=0;t=2`},
		{Allowed: false, Limit: 2, Remaining: 0, ResetAfter: 2 * time.Second, RetryAfter: time.Second,
			RateLimitPolicy: `"standard";q=2;w=2`, RateLimit: `"standard";r=0;t=2`},
	} {
		got, err := c.Allow(t.Context(), "alice")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("request %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
	// A peek consumes nothing; a cost is spent at once; an unlimited tier has no quota.
	for range 2 {
		if d, err := c.Peek(t.Context(), "bob"); err != nil || !d.Allowed || d.Remaining != 2 {
			t.Errorf("Peek(bob) = %+v, %v", d, err)
		}
	}
	if d, err := c.AllowN(t.Context(), "bob", 2); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Errorf("AllowN(bob, 2) = %+v, %v", d, err)
	}
	if d, err := c.Peek(t.Context(), "bob"); err != nil || d.Allowed || d.RetryAfter != time.Second {
		t.Errorf("Peek(bob) after spending 2 = %+v, %v", d, err)
	}
	if d, err := c.AllowN(t.Context(), "bob", 1); err != nil || d.Allowed || d.RetryAfter != time.Second {
		t.Errorf("bob after spending 2 = %+v, %v", d, err)
	}
	want := client.Decision{Allowed: true}
	if d, err := c.AllowN(t.Context(), "svc:billing", 1000); err != nil || !reflect.DeepEqual(d, want) {
		t.Errorf("unlimited = %+v, %v; want %+v", d, err, want)
	}
}

// TestRefund checks the reserve-then-refund pattern: an estimate is spent, the unused part is
// refunded by the decision's reservation, once; a retry answers 409 and refunds nothing.
func TestRefund(t *testing.T) {
	srv := startLimiterd(t, strings.Replace(apiPolicy, "  defaultTier:", "  refunds: Enabled\n  defaultTier:", 1))
	c, err := client.New(srv.URL, client.WithPolicy("default/api"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	reserved, err := c.AllowN(ctx, "carol", 2)
	if err != nil || !reserved.Allowed || reserved.Reservation == "" {
		t.Fatalf("reserve 2: %+v %v", reserved, err)
	}
	var e *client.Error
	if _, err := c.Refund(ctx, reserved.Reservation, 3); !errors.As(err, &e) || e.StatusCode != 400 {
		t.Fatalf("Refund past its cost: %v, want a 400 *client.Error", err)
	}
	d, err := c.Refund(ctx, reserved.Reservation, 1)
	if err != nil || !d.Allowed || d.Remaining != 1 || d.RateLimit != `"standard";r=1;t=1` || d.Reservation != "" {
		t.Fatalf("Refund(1 of 2) = %+v, %v; want 1 remaining", d, err)
	}
	if _, err := c.Refund(ctx, reserved.Reservation, 0); !errors.As(err, &e) || e.StatusCode != 409 {
		t.Fatalf("a second refund: %v, want a 409 *client.Error", err)
	}
	if d, err := c.Peek(ctx, "carol"); err != nil || d.Remaining != 1 {
		t.Fatalf("after the second refund: %+v %v, want 1 remaining", d, err)
	}
}

func TestPolicySelection(t *testing.T) {
	srv := startLimiterd(t, apiPolicy+"---"+otherPolicy)
	c, err := client.New(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Allow(t.Context(), "alice")
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != http.StatusBadRequest || e.Message != "several policies are loaded: name one" {
		t.Fatalf("no policy among two: %v, want a 400 *client.Error", err)
	}
	c, err = client.New(srv.URL, client.WithPolicy("shop/other"))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := c.Allow(t.Context(), "alice"); err != nil || d.Limit != 100 || d.Remaining != 99 {
		t.Fatalf("shop/other: %+v, %v", d, err)
	}
}

func TestErrorAnswers(t *testing.T) {
	srv := startLimiterd(t, apiPolicy)
	unknown, err := client.New(srv.URL, client.WithPolicy("default/nope"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		call   func() (client.Decision, error)
		status int
		msg    string
	}{
		{"unknown policy", func() (client.Decision, error) { return unknown.Allow(t.Context(), "a") }, 404, `unknown policy "default/nope"`},
		{"empty key", func() (client.Decision, error) { return c.Allow(t.Context(), "") }, 400, "key is required"},
		{"negative cost", func() (client.Decision, error) { return c.AllowN(t.Context(), "a", -1) }, 400, "cost must be an integer between 0 and 1000000000"},
	} {
		d, err := tc.call()
		var e *client.Error
		if !errors.As(err, &e) || e.StatusCode != tc.status || e.Message != tc.msg {
			t.Errorf("%s: %+v %v, want *client.Error %d %q", tc.name, d, err, tc.status, tc.msg)
		}
	}
	if got := (&client.Error{StatusCode: 404, Message: "x"}).Error(); got != "limiterd answered 404 Not Found: x" {
		t.Errorf("Error() = %q", got)
	}
}

// TestAnswersThatAreNotLimiterd checks what a client makes of answers limiterd never gives,
// e.g. a proxy's error page.
func TestAnswersThatAreNotLimiterd(t *testing.T) {
	for _, tc := range []struct {
		name      string
		status    int
		body      string
		typed     bool // a *client.Error
		errSubstr string
	}{
		{"proxy error page", 502, "<html>Bad Gateway</html>", true, `502 Bad Gateway: not a limiterd error answer: "<html>Bad Gateway</html>"`},
		{"empty error", 503, "", true, `not a limiterd error answer: "(no body)"`},
		{"allowed with 429", 429, `{"allowed":true}`, false, "allowed=true with status 429"},
		{"rejected with 200", 200, `{"allowed":false}`, false, "allowed=false with status 200"},
		{"no allowed", 200, `{"limit":1}`, false, `has no "allowed"`},
		{"not JSON", 200, `ok`, false, "decode limiterd's decision (200)"},
		{"negative duration", 200, `{"allowed":true,"resetAfterSeconds":-1}`, false, "negative duration"},
		{"unnamed limit", 200, `{"allowed":true,"limits":[{"allowed":true,"limit":1}]}`, false, `without a name or "allowed"`},
		{"limit without allowed", 200, `{"allowed":true,"limits":[{"name":"a","limit":1}]}`, false, `without a name or "allowed"`},
		{"limit with a negative duration", 200, `{"allowed":true,"limits":[{"name":"a","allowed":true,"resetAfterMs":-1}]}`, false, `limit ("a") with a negative duration`},
		{"limits not a list", 200, `{"allowed":true,"limits":{"name":"a"}}`, false, "decode limiterd's decision (200)"},
		{"huge", 200, `{"allowed":true,"x":"` + strings.Repeat("x", 70<<10) + `"}`, false, "larger than 65536 bytes"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		}))
		c, err := client.New(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Allow(t.Context(), "a")
		var e *client.Error
		if err == nil || errors.As(err, &e) != tc.typed || !strings.Contains(err.Error(), tc.errSubstr) {
			t.Errorf("%s: %v (typed %t), want one containing %q (typed %t)", tc.name, err, errors.As(err, &e), tc.errSubstr, tc.typed)
		}
		srv.Close()
	}
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c, err := client.New(srv.URL, client.WithTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allow(t.Context(), "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow limiterd: %v, want context.DeadlineExceeded", err)
	}
	// The caller's context bounds the call too.
	unbounded, err := client.New(srv.URL, client.WithTimeout(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := unbounded.Allow(ctx, "a"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v, want context.Canceled", err)
	}
}

func TestUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c, err := client.New(url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Allow(t.Context(), "a")
	var e *client.Error
	if err == nil || errors.As(err, &e) || !strings.Contains(err.Error(), "ask limiterd") {
		t.Fatalf("closed server: %v, want an untyped error", err)
	}
}

func TestNewRejectsBadURLs(t *testing.T) {
	for _, u := range []string{"", "limiterd:8080", "ftp://limiterd", "http://", "http://h/?q=1", "http://h/#f", "http://h\x7f"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) accepted it", u)
		}
	}
	if _, err := client.New("http://h", client.WithTimeout(-time.Second)); err == nil {
		t.Error("a negative timeout was accepted")
	}
}

func TestPathPrefix(t *testing.T) {
	inner := startLimiterd(t, apiPolicy)
	mux := http.NewServeMux()
	mux.Handle("/limiterd/", http.StripPrefix("/limiterd", inner.Config.Handler))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c, err := client.New(srv.URL + "/limiterd")
	if err != nil {
		t.Fatal(err)
	}
	if d, err := c.Allow(t.Context(), "alice"); err != nil || !d.Allowed {
		t.Fatalf("behind a prefix: %+v %v", d, err)
	}
}

// TestConnectionsAreReused checks that sequential calls share one kept-alive connection.
func TestConnectionsAreReused(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(server.NewDecisions(newEngine(t, apiPolicy), nil))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := c.Allow(t.Context(), "k"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("20 sequential calls opened %d connections, want 1", n)
	}
}

// TestConcurrentCallsShareTheQuota has many goroutines spend one client's quota at once.
func TestConcurrentCallsShareTheQuota(t *testing.T) {
	srv := startLimiterd(t, apiPolicy)
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				d, err := c.Allow(t.Context(), "shared")
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 2 {
		t.Errorf("%d of 200 admitted, want the capacity, 2 (the clock does not move)", n)
	}
}

// TestMillisecondsWin checks that the millisecond fields, when limiterd sends them, give the
// exact waits that the seconds fields round up.
func TestMillisecondsWin(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"allowed":false,"limit":1,"remaining":0,"resetAfterSeconds":1,"retryAfterSeconds":1,"resetAfterMs":70,"retryAfterMs":69}`))
	}))
	defer srv.Close()
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Allow(t.Context(), "k")
	if err != nil || d.RetryAfter != 69*time.Millisecond || d.ResetAfter != 70*time.Millisecond {
		t.Fatalf("%+v %v, want a retry after 69ms and a reset after 70ms", d, err)
	}
}

// TestStackedTierDecisions checks the decisions of a stacked tier: every limit, with the
// top-level fields of the binding one, over single calls, peeks, refunds and batches.
func TestStackedTierDecisions(t *testing.T) {
	c, err := client.New(startLimiterd(t, stackedPolicy).URL)
	if err != nil {
		t.Fatal(err)
	}
	const day = 24 * time.Hour
	policy := `"paid/burst";q=2;w=2, "paid/daily";q=3;w=86400`
	var reservations []string
	for i, want := range []client.Decision{
		{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: time.Second, RateLimitPolicy: policy, RateLimit: `"paid/burst";r=1;t=1`,
			Limits: []client.Limit{{"burst", true, 2, 1, time.Second}, {"daily", true, 3, 2, day / 3}}},
		{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 2 * time.Second, RateLimitPolicy: policy, RateLimit: `"paid/burst";r=0;t=2`,
			Limits: []client.Limit{{"burst", true, 2, 0, 2 * time.Second}, {"daily", true, 3, 1, 2 * day / 3}}},
		// burst rejects: daily is not charged.
		{Allowed: false, Limit: 2, Remaining: 0, ResetAfter: 2 * time.Second, RetryAfter: time.Second, RateLimitPolicy: policy,
			RateLimit: `"paid/burst";r=0;t=2`, Limits: []client.Limit{{"burst", false, 2, 0, 2 * time.Second}, {"daily", true, 3, 1, 2 * day / 3}}},
	} {
		got, err := c.Allow(t.Context(), "alice")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if (got.Reservation != "") != got.Allowed {
			t.Fatalf("request %d: reservation %q of an answer allowed=%t", i, got.Reservation, got.Allowed)
		}
		if got.Reservation != "" {
			reservations = append(reservations, got.Reservation)
		}
		got.Reservation = ""
		if !reflect.DeepEqual(got, want) {
			t.Errorf("request %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
	var d client.Decision
	var err2 error
	for _, r := range reservations { // the two admitted units
		d, err2 = c.Refund(t.Context(), r, 0)
	}
	if err2 != nil || len(reservations) != 2 || !d.Allowed || len(d.Limits) != 2 || d.Limits[0].Remaining != 2 || d.Limits[1].Remaining != 3 {
		t.Fatalf("refunds of the 2 admitted units: %+v, %v; want both limits whole", d, err2)
	}
	results, err := c.AllowBatch(t.Context(), []client.BatchItem{{Key: "alice", Peek: true}, {Key: "bob", Cost: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if d := results[0].Decision; !d.Allowed || len(d.Limits) != 2 || d.Limits[1].Remaining != 3 {
		t.Errorf("a peek in a batch: %+v", d)
	}
	// 3 is above burst's capacity: never admitted, and nothing charged.
	if d := results[1].Decision; d.Allowed || d.RetryAfter != 0 || len(d.Limits) != 2 || d.Limits[0].Allowed || !d.Limits[1].Allowed {
		t.Errorf("a cost above burst in a batch: %+v", d)
	}
}

// Unavailable is true for what FailOpen may cover (no answer, a 5xx) and false for a 4xx, an
// answer that is not a decision, and nil.
func TestUnavailable(t *testing.T) {
	answering := func(status int, body string) *client.Client {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
		t.Cleanup(srv.Close)
		c, err := client.New(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// No answer from an address nobody else can take: a listener the test holds until it ends,
	// which resets every connection it accepts. (A closed server's port could be reused by the
	// next server of this very test, and answer 404.)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // closed
			}
			_ = conn.(*net.TCPConn).SetLinger(0) // close with a reset, not a clean end
			_ = conn.Close()
		}
	}()
	down, err := client.New("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    *client.Client
		want bool
	}{
		{"unreachable", down, true},
		{"503", answering(503, `{"error":"no policy is loaded yet"}`), true},
		{"502 from a proxy, larger than an answer", answering(502, strings.Repeat("x", 100<<10)), true},
		{"400", answering(400, `{"error":"key is required"}`), false},
		{"404", answering(404, `{"error":"unknown policy"}`), false},
		{"not a decision", answering(200, `<html></html>`), false},
	} {
		_, err := tc.c.Allow(t.Context(), "k")
		if err == nil || client.Unavailable(err) != tc.want {
			t.Errorf("%s: %v: Unavailable %t, want %t", tc.name, err, client.Unavailable(err), tc.want)
		}
	}
	if client.Unavailable(nil) {
		t.Error("Unavailable(nil)")
	}
}
