package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
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
