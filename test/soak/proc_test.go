//go:build soak

package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is a limiterd process on loopback ports.
type proc struct {
	name             string
	cmd              *exec.Cmd
	decisions, admin string // base URLs
	http             *http.Client
	transport        *http.Transport
	exited           chan struct{}
	exitCode         int

	mu   sync.Mutex
	logs []string // the last lines of its log
}

// maxLogLines is how many of a process's last log lines are kept for a failure report.
const maxLogLines = 200

// startProc runs limiterd (LIMITERD_BIN) with args until it serves, or fails the test.
func startProc(t *testing.T, bin, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64, IdleConnTimeout: time.Minute}
	p := &proc{name: name, cmd: cmd, transport: tr, http: &http.Client{Timeout: 10 * time.Second, Transport: tr},
		exited: make(chan struct{})}
	serving := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs = append(p.logs, line)
			if len(p.logs) > maxLogLines {
				p.logs = p.logs[len(p.logs)-maxLogLines:]
			}
			p.mu.Unlock()
			var rec struct{ Msg, Addr, Admin_addr string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "limiterd serving" {
				select {
				case serving <- [2]string{rec.Addr, rec.Admin_addr}:
				default:
				}
			}
		}
		_ = cmd.Wait()
		p.exitCode = cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s: last log lines:\n%s", name, p.log())
		}
	})
	select {
	case a := <-serving:
		p.decisions, p.admin = "http://"+a[0], "http://"+a[1]
	case <-p.exited:
		t.Fatalf("%s exited before serving (code %d):\n%s", name, p.exitCode, p.log())
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not serve within 2 minutes:\n%s", name, p.log())
	}
	return p
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.logs, "\n")
}

// rssBytes is the process's resident set size.
func (p *proc) rssBytes() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("read status of %s: %w", p.name, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmRSS of %s: %w", p.name, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS for %s", p.name)
}

// metrics returns the samples of the process's /metrics, by series ("name" or
// "name{labels}").
func (p *proc) metrics() (map[string]float64, error) {
	resp, err := p.http.Get(p.admin + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", p.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", p.name, err)
	}
	out := make(map[string]float64)
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, " ")
		if i := strings.LastIndexByte(line, ' '); i > 0 && strings.Contains(line, "{") {
			name, v, ok = line[:i], line[i+1:], true
		}
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = f
		}
	}
	return out, nil
}

// readyz returns the status of /readyz.
func (p *proc) readyz() (int, error) {
	resp, err := p.http.Get(p.admin + "/readyz")
	if err != nil {
		return 0, fmt.Errorf("readyz of %s: %w", p.name, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// allow asks for one unit; it returns the status and the decoded JSON body.
func (p *proc) allow(ctx context.Context, policy, key string) (int, map[string]any, error) {
	body, _ := json.Marshal(map[string]string{"policy": policy, "key": key})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.decisions+"/v1/allow", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	var answer map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("status %d with a body that is not JSON: %w", resp.StatusCode, err)
	}
	return resp.StatusCode, answer, nil
}

// exit waits up to d for the process to exit and returns its code.
func (p *proc) exit(d time.Duration) (int, error) {
	select {
	case <-p.exited:
		return p.exitCode, nil
	case <-time.After(d):
		return -1, errors.New(p.name + " did not exit")
	}
}
