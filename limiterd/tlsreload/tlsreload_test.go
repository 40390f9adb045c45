package tlsreload

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testcerts"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// serveTLS serves a handler answering "ok" over TLS with c until the test ends, and returns its
// address.
func serveTLS(t *testing.T, c *Config) string {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          nil,
	}
	go func() { _ = srv.Serve(tls.NewListener(ln, c.ServerConfig())) }()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = srv.Close()
	})
	return ln.Addr().String()
}

// get makes one request on a new connection and returns the serial of the server's certificate.
func get(addr string, cfg *tls.Config) (string, error) {
	client := &http.Client{
		Transport: &http.Transport{TLSClientConfig: cfg.Clone(), DisableKeepAlives: true, ForceAttemptHTTP2: true},
		Timeout:   10 * time.Second,
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "https://"+addr+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 || string(body) != "ok" {
		return "", fmt.Errorf("answer %d %q", resp.StatusCode, body)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber.String(), nil
}

func TestHandshake(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	pair := ca.Server(t)
	files := testcerts.Write(t, t.TempDir(), pair, nil)
	c, err := New(Options{CertFile: files.Cert, KeyFile: files.Key})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, c)
	serial, err := get(addr, &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12})
	if err != nil || serial != pair.Serial.String() {
		t.Fatalf("handshake: serial %s, %v; want %s", serial, err, pair.Serial)
	}
	if _, err := get(addr, &tls.Config{RootCAs: testcerts.NewCA(t, "other").Pool(), MinVersion: tls.VersionTLS12}); err == nil {
		t.Error("a client trusting another CA completed the handshake")
	}
}

func TestNewRefusesBadFiles(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	dir := t.TempDir()
	files := testcerts.Write(t, dir, ca.Server(t), nil)
	other := testcerts.Write(t, t.TempDir(), ca.Server(t), nil)
	for name, opts := range map[string]Options{
		"no key":               {CertFile: files.Cert},
		"missing file":         {CertFile: files.Cert, KeyFile: dir + "/missing"},
		"key of another cert":  {CertFile: files.Cert, KeyFile: other.Key},
		"missing client CA":    {CertFile: files.Cert, KeyFile: files.Key, ClientCAFile: dir + "/missing"},
		"client CA not a cert": {CertFile: files.Cert, KeyFile: files.Key, ClientCAFile: files.Key},
	} {
		if _, err := New(opts); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestRotationUnderLoad replaces the certificate and key (one file after the other, so that
// they mismatch for a moment) while clients keep making new connections: every request
// succeeds, and new handshakes soon present the new certificate.
func TestRotationUnderLoad(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	dir := t.TempDir()
	first := ca.Server(t)
	files := testcerts.Write(t, dir, first, nil)
	c, err := New(Options{CertFile: files.Cert, KeyFile: files.Key})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, c)
	clientCfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}

	var (
		requests, failures atomic.Int64
		lastSerial         atomic.Value
		firstErr           error
		errOnce            sync.Once
		stop               = make(chan struct{})
		wg                 sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for n := 0; n < 100_000; n++ { // bounded; stopped much earlier
				select {
				case <-stop:
					return
				default:
				}
				serial, err := get(addr, clientCfg)
				requests.Add(1)
				if err != nil {
					failures.Add(1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				lastSerial.Store(serial)
			}
		})
	}
	var halted sync.Once
	halt := func() { halted.Do(func() { close(stop); wg.Wait() }) }
	defer halt()                    // a failed wait stops the clients too
	const within = 90 * time.Second // the files are re-read within a minute at worst
	testsupport.Eventually(t, within, "first requests", func() bool { return requests.Load() > 20 })

	second := ca.Server(t)
	// The certificate first, then the key a little later: in between they do not match.
	if err := os.WriteFile(files.Cert+".tmp", second.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(files.Cert+".tmp", files.Cert); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	testcerts.Write(t, dir, second, nil)
	testsupport.Eventually(t, within, "the new certificate served", func() bool { return lastSerial.Load() == second.Serial.String() })
	before := requests.Load()
	testsupport.Eventually(t, within, "requests after the rotation", func() bool { return requests.Load() > before+20 })
	halt()
	if failures.Load() != 0 {
		t.Fatalf("%d of %d requests failed across the rotation; first: %v", failures.Load(), requests.Load(), firstErr)
	}
	t.Logf("%d requests, none failed, across the rotation", requests.Load())
}

func TestMutualTLS(t *testing.T) {
	ca := testcerts.NewCA(t, "ca")
	clients := testcerts.NewCA(t, "clients")
	files := testcerts.Write(t, t.TempDir(), ca.Server(t), clients)
	c, err := New(Options{CertFile: files.Cert, KeyFile: files.Key, ClientCAFile: files.CA})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, c)
	base := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}

	if _, err := get(addr, base); err == nil {
		t.Error("a client without a certificate was served")
	}
	stranger := base.Clone()
	stranger.Certificates = []tls.Certificate{testcerts.NewCA(t, "other").Client(t, "mallory").TLS(t)}
	if _, err := get(addr, stranger); err == nil {
		t.Error("a client with a certificate of another CA was served")
	}
	trusted := base.Clone()
	trusted.Certificates = []tls.Certificate{clients.Client(t, "envoy").TLS(t)}
	if _, err := get(addr, trusted); err != nil {
		t.Errorf("a client with a certificate of the client CA: %v", err)
	}
	var netErr net.Error
	_, err = get(addr, base)
	if err == nil || errors.As(err, &netErr) && netErr.Timeout() {
		t.Errorf("refusal should be a handshake failure, not a timeout: %v", err)
	}
}
