package main

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/limiterd/limiterd/client"
	"github.com/limiterd/limiterd/internal/testcerts"
)

func TestTLSFlags(t *testing.T) {
	for args, want := range map[string]string{
		"--policy-file a --tls-cert-file c":                      "go together",
		"--policy-file a --tls-key-file k":                       "go together",
		"--policy-file a --tls-client-ca-file ca":                "needs --tls-cert-file",
		"--policy-file a --tls-cert-file c --tls-key-file k --x": "flag provided but not defined",
	} {
		if _, err := parseFlags(strings.Fields(args), io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", args, err, want)
		}
	}
	cfg, err := parseFlags(strings.Fields("--policy-file a --tls-cert-file c --tls-key-file k --tls-client-ca-file ca"), io.Discard)
	if err != nil || cfg.tls != (tlsFlags{certFile: "c", keyFile: "k", clientCAFile: "ca"}) {
		t.Errorf("TLS flags: %+v %v", cfg.tls, err)
	}
}

// TestTLSServers serves the decisions and admin APIs over TLS with mutual TLS on decisions:
// the Go client with a certificate of the client CA is served, a client without one is
// refused, and the admin API asks for no client certificate.
func TestTLSServers(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := testcerts.NewCA(t, "server-ca"), testcerts.NewCA(t, "client-ca")
	files := testcerts.Write(t, dir, serverCA.Server(t), clientCA)
	d := start(t, hooks{}, "--policy-file", policyFile(t, dir, tokenBucketPolicy),
		"--tls-cert-file", files.Cert, "--tls-key-file", files.Key, "--tls-client-ca-file", files.CA)
	decisions := strings.Replace(d.decisions, "http://", "https://", 1)
	admin := strings.Replace(d.admin, "http://", "https://", 1)
	trust := &tls.Config{RootCAs: serverCA.Pool(), MinVersion: tls.VersionTLS12}

	withCert := trust.Clone()
	withCert.Certificates = []tls.Certificate{clientCA.Client(t, "shop").TLS(t)}
	c, err := client.New(decisions, client.WithTLSConfig(withCert), client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if dec, err := c.Allow(t.Context(), "alice"); err != nil || !dec.Allowed || dec.Limit != 3 {
		t.Fatalf("decision over mutual TLS: %+v %v", dec, err)
	}
	bare, err := client.New(decisions, client.WithTLSConfig(trust), client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Allow(t.Context(), "alice"); err == nil {
		t.Error("a client without a certificate was served")
	}
	plain, err := client.New(d.decisions, client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Allow(t.Context(), "alice"); err == nil {
		t.Error("a plaintext client was served")
	}

	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: trust.Clone()}, Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, admin+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("admin over TLS without a client certificate: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("admin /healthz over TLS: %d", resp.StatusCode)
	}
}

// TestGRPCOverTLS serves Envoy's rate-limit service with the daemon's TLS under mutual TLS.
func TestGRPCOverTLS(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA := testcerts.NewCA(t, "server-ca"), testcerts.NewCA(t, "client-ca")
	files := testcerts.Write(t, dir, serverCA.Server(t), clientCA)
	d := &daemon{log: slog.New(slog.DiscardHandler)}
	if err := d.addTLS(tlsFlags{certFile: files.Cert, keyFile: files.Key, clientCAFile: files.CA}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, loop := range d.background {
		go func() { _ = loop(ctx) }()
	}
	g := startGRPC(t, time.Now, time.Minute) // a plaintext server, for its engine
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- serveGRPC(ctx, nil, "127.0.0.1:0", time.Minute, grpcLimits{}, g.engine, d.log, func(a net.Addr) { addrs <- a },
			grpc.Creds(d.tls.grpcCredentials()))
	}()
	var addr string
	select {
	case a := <-addrs:
		addr = a.String()
	case err := <-done:
		t.Fatalf("serveGRPC: %v", err)
	}
	call := func(cfg *tls.Config) error {
		conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return err
		}
		defer conn.Close()
		callCtx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(callCtx, allowRequest())
		return err
	}
	trust := &tls.Config{RootCAs: serverCA.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
	withCert := trust.Clone()
	withCert.Certificates = []tls.Certificate{clientCA.Client(t, "envoy").TLS(t)}
	if err := call(withCert); err != nil {
		t.Errorf("gRPC over mutual TLS: %v", err)
	}
	if err := call(trust); err == nil {
		t.Error("a gRPC client without a certificate was served")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serveGRPC: %v", err)
	}
}

// TestHTTP2IsBounded checks what the decisions and admin APIs grant an HTTP/2 client over TLS:
// at most http2MaxStreams requests at once and http2ReceiveBuffer body bytes ahead of the
// handlers, per stream and per connection (net/http's defaults, 1 MiB a connection, let each
// connection hold a MiB of bodies that no body budget had granted).
func TestHTTP2IsBounded(t *testing.T) {
	dir := t.TempDir()
	serverCA := testcerts.NewCA(t, "server-ca")
	files := testcerts.Write(t, dir, serverCA.Server(t), testcerts.NewCA(t, "client-ca"))
	d := start(t, hooks{}, "--policy-file", policyFile(t, dir, tokenBucketPolicy),
		"--tls-cert-file", files.Cert, "--tls-key-file", files.Key)
	for name, base := range map[string]string{"decisions": d.decisions, "admin": d.admin} {
		t.Run(name, func(t *testing.T) {
			c, err := tls.Dial("tcp", strings.TrimPrefix(base, "http://"),
				&tls.Config{RootCAs: serverCA.Pool(), MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
				t.Fatalf("negotiated %q, want h2", p)
			}
			if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
				t.Fatal(err)
			}
			fr := http2.NewFramer(c, c)
			if err := fr.WriteSettings(); err != nil {
				t.Fatal(err)
			}
			// The server's first frame is its SETTINGS; a WINDOW_UPDATE of the connection may
			// follow at once. Read until the connection is quiet.
			streams, streamWindow, connWindow := uint32(0), uint32(65535), uint32(65535)
			sawSettings := false
			for {
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				f, err := fr.ReadFrame()
				if err != nil {
					break
				}
				switch f := f.(type) {
				case *http2.SettingsFrame:
					if f.IsAck() {
						continue
					}
					sawSettings = true
					if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
						streams = v
					}
					if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
						streamWindow = v
					}
				case *http2.WindowUpdateFrame:
					if f.StreamID == 0 {
						connWindow += f.Increment
					}
				}
			}
			if !sawSettings {
				t.Fatal("no SETTINGS frame from the server")
			}
			if streams == 0 || streams > http2MaxStreams {
				t.Errorf("MAX_CONCURRENT_STREAMS %d, want 1 to %d", streams, http2MaxStreams)
			}
			if streamWindow > http2ReceiveBuffer {
				t.Errorf("a stream's window is %d bytes, want at most %d", streamWindow, http2ReceiveBuffer)
			}
			if connWindow > http2ReceiveBuffer {
				t.Errorf("the connection's window is %d bytes, want at most %d", connWindow, http2ReceiveBuffer)
			}

			// And a request over HTTP/2 is served as one: the TLS listener is the outermost,
			// so the server sees the TLS connection it negotiated h2 on.
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{ForceAttemptHTTP2: true,
				TLSClientConfig: &tls.Config{RootCAs: serverCA.Pool(), MinVersion: tls.VersionTLS12}}}
			defer hc.CloseIdleConnections()
			url := strings.Replace(base, "http://", "https://", 1) + "/healthz"
			if name == "decisions" {
				url = strings.Replace(base, "http://", "https://", 1) + "/v1/allow?policy=default/api&key=h2"
			}
			resp, err := hc.Get(url)
			if err != nil {
				t.Fatalf("GET over HTTP/2: %v", err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
				t.Errorf("GET %s: %d over %s, want 200 over HTTP/2", url, resp.StatusCode, resp.Proto)
			}
		})
	}
}
