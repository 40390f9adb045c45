package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// closeSlack is how late after its bound a connection may be closed: the server's deadlines are
// exact, the rest is scheduling on a loaded machine.
const closeSlack = 1500 * time.Millisecond

// TestSlowClientsLoseTheirConnection checks that a client trickling a request, one byte every
// 2 s, has its connection closed within --read-timeout of its first byte, on both APIs.
func TestSlowClientsLoseTheirConnection(t *testing.T) {
	const readTimeout = 3 * time.Second
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	d := start(t, hooks{}, "--policy-file", path, "--read-timeout", readTimeout.String())
	for _, tc := range []struct{ name, base, head, trickle string }{
		{"decisions body", d.decisions, "POST /v1/allow HTTP/1.1\r\nHost: localhost\r\nContent-Length: 40\r\n\r\n", `{"key":"slow","policy":"default/api"}`},
		{"decisions headers", d.decisions, "POST /v1/allow HTTP/1.1\r\n", "Host: limiterd\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n"},
		{"admin headers", d.admin, "GET /readyz HTTP/1.1\r\n", "Host: limiterd\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := net.Dial("tcp", strings.TrimPrefix(tc.base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			begin := time.Now()
			if _, err := io.WriteString(c, tc.head); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			defer close(stop)
			go func() { // one byte every 2 s until the server closes or the test ends
				ticker := time.NewTicker(2 * time.Second)
				defer ticker.Stop()
				for i := 0; i < len(tc.trickle); i++ {
					select {
					case <-stop:
						return
					case <-ticker.C:
					}
					if _, err := c.Write([]byte{tc.trickle[i]}); err != nil {
						return
					}
				}
			}()
			closedWithin(t, c, begin, readTimeout)
		})
	}
}

// TestIdleConnectionsAreClosed checks that a keep-alive connection with no next request is
// closed after --idle-timeout.
func TestIdleConnectionsAreClosed(t *testing.T) {
	const idleTimeout = time.Second
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	d := start(t, hooks{}, "--policy-file", path, "--idle-timeout", idleTimeout.String())
	c, err := net.Dial("tcp", strings.TrimPrefix(d.decisions, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /v1/policies HTTP/1.1\r\nHost: limiterd\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	idle := time.Now()
	closedWithin(t, &bufferedConn{Conn: c, r: br}, idle, idleTimeout)
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// closedWithin reads c until the server closes it, and fails unless that happens within bound
// (plus closeSlack) of since.
func closedWithin(t *testing.T, c net.Conn, since time.Time, bound time.Duration) {
	t.Helper()
	if err := c.SetReadDeadline(since.Add(bound + 4*closeSlack)); err != nil {
		t.Fatal(err)
	}
	_, err := io.Copy(io.Discard, c) // an answer (400, 408) may come before the close
	took := time.Since(since)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("connection still open after %v, bound %v", took.Round(time.Millisecond), bound)
	case took > bound+closeSlack:
		t.Fatalf("connection closed after %v, bound %v", took.Round(time.Millisecond), bound)
	}
	t.Logf("closed after %v (bound %v)", took.Round(time.Millisecond), bound)
}

// TestSlowBodiesCannotStarveOthers sends batch bodies of 1 MiB that stop before their last byte,
// more than --max-inflight-body-bytes holds, as issue 34's attacker did: a well-behaved client
// is still answered at once, 200 or 503 with Retry-After, never left hanging, and is served
// again once the slow clients go.
func TestSlowBodiesCannotStarveOthers(t *testing.T) {
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	d := start(t, hooks{}, "--policy-file", path, "--max-inflight-body-bytes", "2Mi")
	addr := strings.TrimPrefix(d.decisions, "http://")
	const slowClients, size = 6, 1 << 20
	head := "POST /v1/allow:batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(size) + "\r\n\r\n"
	body := strings.Repeat(" ", size-1)
	var conns []net.Conn
	for range slowClients {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		// Writes to a client refused (and closed) block or fail: neither matters.
		go func() { _, _ = io.WriteString(c, head+body) }()
	}
	closeSlow := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	defer closeSlow()

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	post := func() (*http.Response, time.Duration) {
		t.Helper()
		begin := time.Now()
		res, err := client.Post(d.decisions+"/v1/allow", "application/json", strings.NewReader(`{"key":"svc-probe"}`))
		if err != nil {
			t.Fatalf("a well-behaved POST was not answered: %v", err)
		}
		_ = res.Body.Close()
		return res, time.Since(begin)
	}
	// Once two slow bodies hold the budget, a POST is refused, at once.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, took := post()
		if took > time.Second {
			t.Errorf("a well-behaved POST took %v", took)
		}
		if res.StatusCode == http.StatusServiceUnavailable {
			if got := res.Header.Get("Retry-After"); got != "1" {
				t.Errorf("503 with Retry-After %q, want 1", got)
			}
			break
		}
		if res.StatusCode != http.StatusOK {
			t.Fatalf("a well-behaved POST: %d", res.StatusCode)
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow bodies never spent the budget")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// GETs read no body: served whatever the budget.
	res, err := client.Get(d.decisions + "/v1/allow?key=svc-probe")
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET while the budget is spent: %v %v", res, err)
	}
	_ = res.Body.Close()

	closeSlow()
	for deadline = time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if res, _ := post(); res.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("POSTs still refused after the slow clients left")
		}
	}
}

// TestConnectionsAreBounded checks --max-connections: connections past it wait until one
// closes, and a header past 64 KiB is refused.
func TestConnectionsAreBounded(t *testing.T) {
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	d := start(t, hooks{}, "--policy-file", path, "--max-connections", "2")
	addr := strings.TrimPrefix(d.decisions, "http://")
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	get := func(timeout time.Duration, header string) (*http.Response, error) {
		client := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
		req, err := http.NewRequest(http.MethodGet, d.decisions+"/v1/allow?key=svc-probe", nil)
		if err != nil {
			t.Fatal(err)
		}
		if header != "" {
			req.Header.Set("X-Big", header)
		}
		res, err := client.Do(req)
		if err == nil {
			_ = res.Body.Close()
		}
		return res, err
	}
	if res, err := get(500*time.Millisecond, ""); err == nil {
		t.Fatalf("a third connection was served (%d) while two were held", res.StatusCode)
	}
	_ = held[0].Close()
	if res, err := get(5*time.Second, ""); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("after a held connection closed: %v %v", res, err)
	}
	if res, err := get(5*time.Second, strings.Repeat("a", 100<<10)); err != nil || res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a 100 KiB header: %v %v, want 431", res, err)
	}
}
