package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testbin"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// TestSlowBodiesRSS is issue 34's HTTP memory attack against a built limiterd, measured as the
// kernel sees it: 150 connections each send the header of a 2 MiB batch and all of its body but
// the last byte, then wait. Before the body budget, an in-memory replica went from 45 MB to
// 590 MB RSS in half a second. With the defaults (--max-inflight-body-bytes 64Mi), the bodies
// being read hold at most the budget, and between collections the heap may hold as much again
// in freed buffers: the RSS the attack adds stays under twice the budget plus the connections'
// own (SECURITY.md), and a well-behaved client is answered meanwhile, never left hanging.
func TestSlowBodiesRSS(t *testing.T) {
	bin := testbin.Need(t, testbin.Limiterd)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(tokenBucketPolicy, "default")), 0o600); err != nil {
		t.Fatal(err)
	}
	decisions, admin := freeAddr(t), freeAddr(t)
	p := startProcess(t, "limiterd", "", bin, "--policy-file", policy, "--addr", decisions, "--admin-addr", admin,
		"--admin-insecure-no-auth", "--shutdown-delay", "0s")
	testsupport.Eventually(t, waitTimeout, "limiterd ready", func() error {
		if !p.running() {
			t.Fatalf("limiterd exited: %v\n%s", p.err, p.logs)
		}
		return get("http://" + admin + "/readyz")
	})
	pid := p.cmd.Process.Pid
	base := rss(t, pid)

	const (
		conns  = 150
		size   = 2 << 20  // a batch body's limit
		budget = 64 << 20 // --max-inflight-body-bytes' default
		// A connection's header buffer, net/http's buffers and its goroutine (SECURITY.md).
		perConn = 28 << 10
	)
	bound := 2*budget + conns*perConn
	head := "POST /v1/allow:batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(size) + "\r\n\r\n"
	body := strings.Repeat(" ", size-1)
	var wg sync.WaitGroup
	var held []net.Conn
	for range conns {
		c, err := net.Dial("tcp", decisions)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		// A connection refused (503, closed) makes its write fail: that is the bound at work.
		wg.Go(func() { _, _ = io.WriteString(c, head+body) })
	}
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
		wg.Wait()
	}()

	// The peak over 2 s of the attack, while a well-behaved client asks for decisions.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	peak := base
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		peak = max(peak, rss(t, pid))
		begin := time.Now()
		res, err := client.Get("http://" + decisions + "/v1/allow?key=svc-probe")
		if err != nil {
			t.Fatalf("a well-behaved GET during the attack: %v", err)
		}
		_ = res.Body.Close()
		if took := time.Since(begin); took > time.Second || (res.StatusCode != http.StatusOK && res.StatusCode != http.StatusTooManyRequests) {
			t.Fatalf("a well-behaved GET during the attack: %d after %v", res.StatusCode, took)
		}
	}
	t.Logf("RSS %d MiB before the attack, peak %d MiB during it (+%d MiB; bound +%d MiB)",
		base>>20, peak>>20, (peak-base)>>20, bound>>20)
	if peak-base > bound {
		t.Errorf("150 slow 2 MiB bodies added %d MiB of RSS, want at most %d MiB (twice the body budget and the connections')",
			(peak-base)>>20, bound>>20)
	}
}

// rss returns the resident set size of process pid, in bytes.
func rss(t *testing.T, pid int) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
