package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	redisstore "github.com/limiterd/limiterd/limiterd/store/redis"
	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

func TestStoreFlags(t *testing.T) {
	base := []string{"--policy-file", "p.yaml"}
	cfg, err := parseFlags(base, io.Discard)
	if err != nil || cfg.store.kind != "memory" || cfg.store.flushDelay != redisstore.DefaultMaxFlushDelay {
		t.Fatalf("default store: %+v, %v; want memory", cfg.store, err)
	}
	cfg, err = parseFlags(append(base, "--store", "redis", "--redis-addr", "a:1,b:2", "--redis-addr", "c:3",
		"--store-timeout", "20ms", "--redis-clock", "client", "--redis-local-reject-cache", "1000",
		"--redis-max-flush-delay", "0s"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sentinel, err := parseFlags(append(base, "--store", "redis", "--redis-sentinel-master", "mymaster",
		"--redis-sentinel-addr", "s:1,t:2", "--redis-sentinel-password-file", "p"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := sentinel.store; c.sentinelMaster != "mymaster" || !reflect.DeepEqual(c.sentinelAddrs, []string{"s:1", "t:2"}) ||
		c.sentinelPasswordFile != "p" || len(c.redisAddrs) != 0 {
		t.Errorf("sentinel flags parsed as %+v", c)
	}
	if want := []string{"a:1", "b:2", "c:3"}; !reflect.DeepEqual(cfg.store.redisAddrs, want) {
		t.Errorf("--redis-addr gave %q, want %q", cfg.store.redisAddrs, want)
	}
	if cfg.store.timeout != 20*time.Millisecond || cfg.store.clock != "client" || cfg.store.rejectCache != 1000 ||
		cfg.store.flushDelay != 0 {
		t.Errorf("store flags parsed as %+v", cfg.store)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--store", "disk"}, "--store must be memory or redis"},
		{[]string{"--store", "redis"}, "needs --redis-addr"},
		{[]string{"--redis-addr", "a:1"}, "--redis-addr need --store redis"},
		{[]string{"--store", "redis", "--redis-addr", "a:1", "--redis-clock", "ntp"}, "--redis-clock must be"},
		{[]string{"--store", "redis", "--redis-addr", "a:1", "--store-timeout", "0s"}, "--store-timeout must be positive"},
		{[]string{"--store", "redis", "--redis-addr", "a:1", "--redis-cert-file", "c.pem"}, "go together"},
		{[]string{"--store", "redis", "--redis-addr", "a:1,,b:2"}, "empty address"},
		{[]string{"--store", "redis", "--redis-addr", "a:1", "--redis-max-flush-delay", "-1ms"}, "--redis-max-flush-delay must not be negative"},
		{[]string{"--store", "redis", "--redis-sentinel-addr", "s:1"}, "--redis-sentinel-addr needs --redis-sentinel-master"},
		{[]string{"--store", "redis", "--redis-sentinel-master", "m"}, "--redis-sentinel-master needs --redis-sentinel-addr"},
		{[]string{"--store", "redis", "--redis-sentinel-master", "m", "--redis-addr", "a:1"}, "--redis-sentinel-master needs --redis-sentinel-addr"},
		{[]string{"--store", "redis", "--redis-sentinel-master", "m", "--redis-sentinel-addr", "s:1", "--redis-addr", "a:1"}, "exclude each other"},
		{[]string{"--store", "redis", "--redis-addr", "a:1", "--redis-sentinel-password-file", "p"}, "--redis-sentinel-password-file needs --redis-sentinel-master"},
		{[]string{"--redis-sentinel-master", "m", "--redis-sentinel-addr", "s:1"}, "need --store redis"},
	} {
		if _, err := parseFlags(append(base, tc.args...), io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// writeCerts writes a CA and a server certificate for 127.0.0.1 into dir.
func writeCerts(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "limiterd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"redis.test"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", keyDER)
}

// TestRedisStoreOverTLS runs limiterd on a redis-server that takes TLS with client certificates
// and a password: decisions are shared in Redis and /readyz reports the store.
func TestRedisStoreOverTLS(t *testing.T) {
	redistest.Require(t)
	dir := t.TempDir()
	caFile, certFile, keyFile := writeCerts(t, dir)
	tlsPort := redistest.FreePort(t)
	srv := redistest.Start(t, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "yes", "--requirepass", "s3cret")
	passwordFile := filepath.Join(dir, "password")
	if err := os.WriteFile(passwordFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, hooks{}, "--policy-file", policyFile(t, dir, tokenBucketPolicy),
		"--store", "redis", "--redis-addr", "127.0.0.1:"+strconv.Itoa(tlsPort), "--store-timeout", "5s",
		"--redis-password-file", passwordFile, "--redis-ca-file", caFile, "--redis-tls-server-name", "redis.test",
		"--redis-cert-file", certFile, "--redis-key-file", keyFile)
	if status, body := get(t, d.admin+"/readyz"); status != http.StatusOK {
		t.Fatalf("/readyz: %d %s", status, body)
	}
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if got := decide(t, d.decisions, "tls-client"); got.status != want {
			t.Fatalf("decision %d: status %d, want %d (%v)", i, got.status, want, got.body)
		}
	}
	// The state is in Redis: the plain port (same server, password) holds the client's key.
	if keys := srv.Do(t, "-a", "s3cret", "--no-auth-warning", "DBSIZE"); keys != "1" {
		t.Errorf("redis holds %s keys, want the client's 1", keys)
	}
	// The store's metrics are served; limiterd_store_up is 1 once the first ping (at start)
	// answered.
	for _, name := range []string{"limiterd_reject_cache_hits_total", "limiterd_reject_cache_resets_received_total",
		"limiterd_store_breaker_open", "limiterd_store_breaker_trips_total"} {
		if got := metric(t, d.admin, name); got != 0 {
			t.Errorf("%s = %v, want 0", name, got)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); metric(t, d.admin, "limiterd_store_up") != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("limiterd_store_up is not 1 with redis up")
		}
	}
}

// TestRedisStoreThroughSentinels runs limiterd on a master found through 3 Sentinels that take
// a password: decisions are shared in the master, and /readyz reports the store.
func TestRedisStoreThroughSentinels(t *testing.T) {
	t.Parallel()
	g := redistest.StartSentinels(t, redistest.SentinelConfig{Name: "limiterd", SentinelPassword: "sentinel-s3cret"})
	dir := t.TempDir()
	passwordFile := filepath.Join(dir, "sentinel-password")
	if err := os.WriteFile(passwordFile, []byte("sentinel-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, hooks{}, "--policy-file", policyFile(t, dir, tokenBucketPolicy),
		"--store", "redis", "--redis-sentinel-master", "limiterd",
		"--redis-sentinel-addr", strings.Join(g.SentinelAddrs(), ","), "--redis-sentinel-password-file", passwordFile,
		"--store-timeout", "5s")
	if status, body := get(t, d.admin+"/readyz"); status != http.StatusOK {
		t.Fatalf("/readyz: %d %s", status, body)
	}
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if got := decide(t, d.decisions, "sentinel-client"); got.status != want {
			t.Fatalf("decision %d: status %d, want %d (%v)", i, got.status, want, got.body)
		}
	}
	if keys := g.Master.Do(t, "DBSIZE"); keys != "1" {
		t.Errorf("the master holds %s keys, want the client's 1", keys)
	}
}

const quotaPolicy = `apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata:
  name: api
spec:
  defaultTier: daily
  tiers:
  - name: daily
    algorithm: Quota
    quota: {limit: 3, period: Day, timeZone: Europe/Berlin}
`

// TestRedisStoreDecidesQuotas: a policy with a Quota tier is served on --store redis, its
// count kept in Redis (one key, the client's), as the memory store serves it.
func TestRedisStoreDecidesQuotas(t *testing.T) {
	t.Parallel()
	redistest.Require(t)
	srv := redistest.Start(t)
	for _, store := range [][]string{{"--store", "redis", "--redis-addr", srv.Addr(), "--store-timeout", "5s"}, nil} {
		d := start(t, hooks{}, append([]string{"--policy-file", policyFile(t, t.TempDir(), quotaPolicy)}, store...)...)
		for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
			if got := decide(t, d.decisions, "metered-client"); got.status != want {
				t.Fatalf("%v, decision %d: status %d, want %d (%v)", store, i, got.status, want, got.body)
			}
		}
	}
	if keys := srv.Do(t, "DBSIZE"); keys != "1" {
		t.Errorf("redis holds %s keys, want the client's 1", keys)
	}
}
