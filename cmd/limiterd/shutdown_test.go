package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/limiterd/limiterd/internal/testsupport"
)

// runMainEnv makes the test binary run limiterd's main instead of the tests (see TestMain), so
// that a test runs the real process, with its signal handling and exit status, and builds
// nothing.
const runMainEnv = "LIMITERD_TEST_RUN_MAIN"

// process is limiterd running as a process of its own on loopback ports.
type process struct {
	cmd                    *exec.Cmd
	decisions, admin, grpc string // base URLs; grpc is host:port ("" without --grpc-addr)
	logs                   *testsupport.SyncBuffer
	exited                 chan struct{}
	err                    error // once exited
}

// startProcess runs limiterd with args (plus loopback ports) and waits until it serves. It is
// killed when the test ends, if it has not exited.
func startProcess(t *testing.T, args ...string) *process {
	t.Helper()
	args = append([]string{"--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, args...)
	p := &process{cmd: exec.Command(os.Args[0], args...), logs: &testsupport.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	ready := serving
	wantGRPC := slices.Contains(args, "--grpc-addr") // then serving waits for both logs
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			_, _ = p.logs.Write([]byte(line + "\n"))
			var entry struct {
				Msg       string `json:"msg"`
				Addr      string `json:"addr"`
				AdminAddr string `json:"admin_addr"`
				GRPCAddr  string `json:"grpc_addr"`
			}
			if json.Unmarshal([]byte(line), &entry) != nil {
				continue
			}
			switch entry.Msg {
			case "grpc serving":
				p.grpc = entry.GRPCAddr
			case "limiterd serving":
				p.decisions, p.admin = "http://"+entry.Addr, "http://"+entry.AdminAddr
			default:
				continue
			}
			if p.decisions != "" && (p.grpc != "" || !wantGRPC) && serving != nil {
				close(serving)
				serving = nil
			}
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("limiterd logs:\n%s", p.logs)
		}
	})
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("limiterd exited before serving: %v\n%s", p.err, p.logs)
	case <-time.After(time.Minute):
		t.Fatalf("limiterd not serving after a minute\n%s", p.logs)
	}
	return p
}

// TestSIGTERMDrainsUnderLoad sends SIGTERM to limiterd under keep-alive load: /readyz and gRPC
// health fail at once, no request fails during --shutdown-delay, and limiterd exits 0 after it.
func TestSIGTERMDrainsUnderLoad(t *testing.T) {
	const (
		delay   = 3 * time.Second
		workers = 4
		margin  = 300 * time.Millisecond // load stops this long before the delay ends
	)
	path := policyFile(t, t.TempDir(), tokenBucketPolicy)
	p := startProcess(t, "--policy-file", path, "--grpc-addr", "127.0.0.1:0",
		"--shutdown-delay", delay.String(), "--shutdown-timeout", "10s")
	if p.grpc == "" {
		t.Fatal("no gRPC address logged")
	}
	conn, err := grpc.NewClient("passthrough:///"+p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	if h, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health before SIGTERM: %v %v", h, err)
	}

	var (
		stopLoad              atomic.Bool
		sent, afterTerm, fail atomic.Int64
		terminated            atomic.Bool
		firstErr              sync.Once
		loadErr               error
		load                  sync.WaitGroup
	)
	for w := range workers {
		load.Go(func() {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			for i := 0; !stopLoad.Load(); i++ {
				body := `{"policy":"default/api","key":"svc-` + string(rune('a'+w)) + `"}`
				resp, err := client.Post(p.decisions+"/v1/allow", "application/json", strings.NewReader(body))
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = errors.New(resp.Status)
					}
				}
				sent.Add(1)
				if terminated.Load() {
					afterTerm.Add(1)
				}
				if err != nil {
					fail.Add(1)
					firstErr.Do(func() { loadErr = err })
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // keep-alive connections established
	term := time.Now()
	terminated.Store(true)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	// Readiness fails at once, gRPC health turns NOT_SERVING, and decisions are still served.
	probe := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var unready time.Duration
	for {
		resp, err := probe.Get(p.admin + "/readyz")
		if err != nil {
			t.Fatalf("/readyz during the delay: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			unready = time.Since(term)
			break
		}
		if time.Since(term) > delay-margin {
			t.Fatalf("/readyz still %d %v after SIGTERM", resp.StatusCode, time.Since(term))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if h, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health during the delay: %v %v, want NOT_SERVING", h, err)
	}
	rls := rlsv3.NewRateLimitServiceClient(conn)
	if resp, err := rls.ShouldRateLimit(t.Context(), allowRequest()); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("gRPC decision during the delay: %v %v, want OK", resp, err)
	}

	time.Sleep(time.Until(term.Add(delay - margin)))
	stopLoad.Store(true)
	load.Wait()
	t.Logf("%d requests, %d after SIGTERM, %d failed; /readyz 503 %v after SIGTERM", sent.Load(), afterTerm.Load(), fail.Load(), unready.Round(time.Millisecond))
	if fail.Load() > 0 {
		t.Errorf("%d requests failed during the shutdown delay, first: %v", fail.Load(), loadErr)
	}
	if afterTerm.Load() == 0 {
		t.Error("no request was served after SIGTERM")
	}

	select {
	case <-p.exited:
	case <-time.After(delay + 20*time.Second):
		t.Fatal("limiterd did not exit after SIGTERM")
	}
	took := time.Since(term)
	if p.err != nil {
		t.Fatalf("exit: %v, want 0", p.err)
	}
	if took < delay {
		t.Errorf("exited %v after SIGTERM, before the %v delay", took, delay)
	}
	if !strings.Contains(p.logs.String(), `"msg":"limiterd stopped"`) {
		t.Error("no clean stop logged")
	}
}
