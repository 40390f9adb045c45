package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"

	"github.com/limiterd/limiterd/limiterd/server"
)

// Defaults of the HTTP servers' timeouts.
const (
	defaultReadTimeout = 10 * time.Second
	defaultIdleTimeout = 2 * time.Minute
	// defaultMaxInflightBodyBytes bounds the request bodies the decisions API holds at once:
	// 32 batches of the largest size, an eighth of the chart's 512 Mi memory limit.
	defaultMaxInflightBodyBytes = 64 << 20
	// defaultMaxHTTPConnections bounds each HTTP listener's connections, as gRPC's.
	defaultMaxHTTPConnections = 1024
	// maxHeaderBytes bounds a request's header on the decisions and admin APIs, as gRPC's
	// (envoyrls.MaxHeaderBytes): room for a GET of a long key and a bearer token, where
	// net/http's default of 1 MiB let each of --max-connections connections hold that much.
	maxHeaderBytes = 16 << 10
	// http2ReceiveBuffer bounds the request body bytes an HTTP/2 client (over TLS) may send
	// ahead of the handler, per connection and per stream: HTTP/2's flow-control windows, which
	// net/http sets to 1 MiB by default, so that each of --max-connections connections could
	// hold a MiB that no body budget has granted. 64 KiB is the least a connection's window may
	// be; a body larger than it arrives as the handler reads it.
	http2ReceiveBuffer = 64 << 10
	// http2MaxStreams bounds an HTTP/2 connection's concurrent requests, each of which may hold
	// a header of maxHeaderBytes while it is read.
	http2MaxStreams = 32
)

// httpConfig is what the HTTP server flags say: how long a client may hold a connection
// without sending what it must.
type httpConfig struct {
	readTimeout time.Duration
	idleTimeout time.Duration
	// maxInflightBodyBytes bounds the bytes of request bodies held at once
	// (server.WithBodyBudget).
	maxInflightBodyBytes byteSize
	// maxConnections bounds each HTTP listener's open connections.
	maxConnections int
}

// register adds the HTTP server flags to fs.
func (c *httpConfig) register(fs *flag.FlagSet) {
	fs.DurationVar(&c.readTimeout, "read-timeout", defaultReadTimeout,
		"most time a client may take to send a whole request, headers and body, on the decisions and admin APIs, and to complete a new connection's TLS and HTTP/2 handshake on gRPC; past it the connection is closed")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", defaultIdleTimeout,
		"how long a keep-alive connection may wait for its next request on the decisions and admin APIs, and a gRPC connection with no call in flight, before it is closed")
	c.maxInflightBodyBytes = defaultMaxInflightBodyBytes
	fs.Var(&c.maxInflightBodyBytes, "max-inflight-body-bytes",
		"most `bytes` of request bodies the decisions API reads and holds at once, over all requests (suffixes Ki, Mi, Gi; at least 2Mi, "+
			"a whole batch): a POST takes its Content-Length (or, chunked, its path's body limit) before its body is read, "+
			"and is answered 503 with Retry-After when too few are free")
	fs.IntVar(&c.maxConnections, "max-connections", defaultMaxHTTPConnections,
		"most open connections of each of the decisions and admin APIs; past it a new connection waits in the listen backlog until one closes")
}

// check validates the HTTP server flags after parsing.
func (c *httpConfig) check() error {
	switch {
	case c.readTimeout <= 0:
		return errors.New("--read-timeout must be positive")
	case c.idleTimeout <= 0:
		return errors.New("--idle-timeout must be positive")
	case c.maxInflightBodyBytes < server.MaxBatchBodyBytes:
		return fmt.Errorf("--max-inflight-body-bytes must be at least %d (2Mi, a whole batch's body)", server.MaxBatchBodyBytes)
	case c.maxConnections <= 0:
		return errors.New("--max-connections must be positive")
	}
	return nil
}

// server returns an HTTP server of h with the configured timeouts. A request must arrive whole
// (headers and body) within the read timeout of its first byte, so a client that stops sending
// mid-request, or trickles its body, loses its connection then and never holds up a shutdown
// past it; a header may hold at most maxHeaderBytes. Over TLS, where HTTP/2 is offered, a
// connection carries at most http2MaxStreams requests at once and may send at most
// http2ReceiveBuffer body bytes ahead of what handlers read. Answers are small and written at
// once, so there is no write timeout.
func (c httpConfig) server(h http.Handler, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: c.readTimeout,
		ReadTimeout:       c.readTimeout,
		IdleTimeout:       c.idleTimeout,
		ErrorLog:          errorLog,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          http2MaxStreams,
			MaxReceiveBufferPerConnection: http2ReceiveBuffer,
			MaxReceiveBufferPerStream:     http2ReceiveBuffer,
		},
	}
}

// limit returns ln accepting at most the configured number of open connections; past it,
// Accept waits until one closes, and new connections wait in the kernel's listen backlog.
func (c httpConfig) limit(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, c.maxConnections)
}
