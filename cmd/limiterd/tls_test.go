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
