package redis_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/limiterd/limiterd/limiterd/store/redis/redistest"
)

// grpcLimit is the allowance of every client of grpcFaultPolicies: a bucket refilling one an
// hour, so that nothing refills during a test.
const grpcLimit = 5

// failureModes are the policies of grpcFaultPolicies, each named after its failure mode.
var failureModes = []string{"open", "closed", "local"}

// grpcFaultPolicies has one policy per failure mode, decided over gRPC: the descriptor entry
// "client" is the client of ShouldRateLimit, the header X-Api-Key the client of an ext_authz
// Check, one key space for both.
func grpcFaultPolicies() string {
	var docs []string
	for _, mode := range []string{"Open", "Closed", "Local"} {
		docs = append(docs, fmt.Sprintf(`apiVersion: limiterd.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: %s}
spec:
  defaultTier: standard
  failureMode: %s
  envoy: {descriptorKey: client}
  gateway: {keySources: [{type: Header, header: X-Api-Key}]}
  tiers: [{name: standard, algorithm: TokenBucket, tokenBucket: {capacity: %d, refillRate: 1, refillPeriod: 1h}}]
`, strings.ToLower(mode), mode, grpcLimit))
	}
	return strings.Join(docs, "---\n")
}

// grpcCall is one call of a worker of TestGRPCUnderRedisFaults.
type grpcCall struct {
	policy   string
	kind     string // "one", "multi" (multiDescriptors descriptors) or "check"
	start    time.Time
	took     time.Duration
	keys     []string // the clients, one per descriptor
	admitted []bool   // by descriptor
	err      error    // the call failed
	// What the call answered, for the failure modes' checks: for ShouldRateLimit the overall
	// code and the Retry-After it added; for Check the gRPC code and HTTP status of its status.
	code       string
	retryAfter string
	httpStatus int
}

// multiDescriptors is how many descriptors a "multi" worker sends in one request.
const multiDescriptors = 8

// grpcClients are the gRPC clients of one replica.
type grpcClients struct {
	rls   rlsv3.RateLimitServiceClient
	authz authv3.AuthorizationClient
}

func dialGRPC(t *testing.T, r *replica) grpcClients {
	t.Helper()
	var addr string
	select {
	case addr = <-r.grpcServing:
	case <-time.After(60 * time.Second):
		t.Fatalf("limiterd did not serve gRPC within a minute:\n%s", r.log())
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return grpcClients{rls: rlsv3.NewRateLimitServiceClient(conn), authz: authv3.NewAuthorizationClient(conn)}
}

// rateLimit asks ShouldRateLimit about one descriptor per key, each of cost hits (0: the
// request's default, 1), under policy.
func (c grpcClients) rateLimit(ctx context.Context, policy string, keys []string, hits uint32) (*rlsv3.RateLimitResponse, error) {
	req := &rlsv3.RateLimitRequest{Domain: "default/" + policy, HitsAddend: hits}
	for _, k := range keys {
		req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: k}},
		})
	}
	return c.rls.ShouldRateLimit(ctx, req)
}

// check asks ext_authz Check about a request of the client key under policy.
func (c grpcClients) check(ctx context.Context, policy, key string) (*authv3.CheckResponse, error) {
	return c.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		ContextExtensions: map[string]string{"namespace": "default", "policy": policy},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "GET", Host: "shop.example", Path: "/", Headers: map[string]string{"x-api-key": key},
		}},
	}})
}

// checkClient returns the client key of an ext_authz check whose X-Api-Key is key, under
// grpcFaultPolicies' key source.
func checkClient(key string) string { return "header:x-api-key:" + key }

// call makes one call of kind on keys and records it.
func (c grpcClients) call(policy, kind string, keys []string) grpcCall {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec := grpcCall{policy: policy, kind: kind, keys: keys, start: time.Now(), admitted: make([]bool, len(keys))}
	if kind == "check" {
		resp, err := c.check(ctx, policy, keys[0])
		rec.took, rec.err = time.Since(rec.start), err
		if err == nil {
			rec.code = codes.Code(resp.GetStatus().GetCode()).String()
			rec.admitted[0] = resp.GetStatus().GetCode() == int32(codes.OK)
			if d := resp.GetDeniedResponse(); d != nil {
				rec.httpStatus = int(d.GetStatus().GetCode())
				for _, h := range d.GetHeaders() {
					if strings.EqualFold(h.GetHeader().GetKey(), "retry-after") {
						rec.retryAfter = h.GetHeader().GetValue()
					}
				}
			}
		}
		return rec
	}
	resp, err := c.rateLimit(ctx, policy, keys, 0)
	rec.took, rec.err = time.Since(rec.start), err
	if err == nil {
		rec.code = resp.GetOverallCode().String()
		for i, s := range resp.GetStatuses() {
			rec.admitted[i] = s.GetCode() == rlsv3.RateLimitResponse_OK
		}
		for _, h := range resp.GetResponseHeadersToAdd() {
			if strings.EqualFold(h.GetKey(), "retry-after") {
				rec.retryAfter = h.GetValue()
			}
		}
	}
	return rec
}

// TestGRPCUnderRedisFaults drives Envoy's two gRPC services (ShouldRateLimit with one and with
// several descriptors, ext_authz Check) of bin/limiterd on a real redis-server through a Redis
// fault, with one policy per failure mode, on clients whose allowance is spent before the fault:
//
//   - a pause (SIGSTOP) longer than the store timeout: Redis keeps its state;
//   - a restart (SIGKILL, then a new process on the same port): Redis loses its state and its
//     scripts, so the first decisions after it get NOSCRIPT;
//   - SCRIPT FLUSH: no fault at all, only scripts to load again, which must decide nothing.
//
// What a user of the gRPC path relies on, checked for each: no call fails (Envoy would let its
// failure_mode_deny or failure_mode_allow decide) and none waits past the store timeout and a
// margin (a request of several descriptors, one more timeout: its health check); Open admits only while the fault lasts,
// Closed answers OVER_LIMIT (ShouldRateLimit, with Retry-After 1) or RESOURCE_EXHAUSTED with
// HTTP 429 (Check), and Local admits at most the limit from memory; decisions are exact again
// within a bounded time after the fault (concurrent requests of several descriptors on a fresh
// client are admitted exactly the limit); a fault that is none (SCRIPT FLUSH) counts no store
// error and admits nothing past the limit.
func TestGRPCUnderRedisFaults(t *testing.T) {
	const (
		// timeout is the store timeout: long enough that a loaded test machine (2 cores, load
		// 20) does not time decisions out without a fault, which would make SCRIPT FLUSH look
		// like one.
		timeout = time.Second
		slack   = 2 * time.Second // gRPC, a loaded machine
		// faultLength outlasts the breaker's opening (the first timeout, then 5 failed health
		// checks of a timeout each), which a request decided one descriptor at a time waited.
		faultLength   = 6 * time.Second
		recoveryBound = 15 * time.Second // from the fault's end until Closed admits a fresh client
	)
	for _, tc := range []struct {
		name string
		// real: the store fails while the fault lasts (the failure modes decide then);
		// otherwise it must not fail at all.
		real bool
		// keepsState: Redis keeps the clients' state through the fault; otherwise every client
		// starts afresh after it (no persistence), once.
		keepsState bool
		inject     func(t *testing.T, srv *redistest.Server)
	}{
		{"pause", true, true, func(t *testing.T, srv *redistest.Server) {
			srv.Pause(t)
			time.Sleep(faultLength)
			srv.Resume(t)
		}},
		{"restart", true, false, func(t *testing.T, srv *redistest.Server) {
			srv.Stop()
			time.Sleep(faultLength)
			srv.Restart(t)
		}},
		{"script flush", false, true, func(t *testing.T, srv *redistest.Server) {
			if got := srv.Do(t, "SCRIPT", "FLUSH"); got != "OK" {
				t.Fatalf("SCRIPT FLUSH: %q", got)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each fault on a server and a limiterd of its own: the faults' waits overlap.
			t.Parallel()
			srv := redistest.Start(t)
			file := filepath.Join(t.TempDir(), "policies.yaml")
			writePolicies(t, file, grpcFaultPolicies())
			r := startReplica(t, "--policy-file", file, "--store", "redis", "--redis-addr", srv.Addr(),
				"--store-timeout", timeout.String(), "--grpc-addr", "127.0.0.1:0")
			c := dialGRPC(t, r)

			// The workers' clients, each spent before the fault.
			workers := map[string][][]string{} // by kind: the keys of each worker's calls
			var spent []string
			for w := range 2 {
				workers["one"] = append(workers["one"], []string{fmt.Sprint("one-", w)})
			}
			var multi []string
			for j := range multiDescriptors {
				multi = append(multi, fmt.Sprint("multi-", j))
			}
			workers["multi"] = [][]string{multi}
			workers["check"] = [][]string{{"check-0"}}
			for _, kind := range []string{"one", "multi", "check"} {
				for _, keys := range workers[kind] {
					for _, k := range keys {
						if kind == "check" {
							k = checkClient(k)
						}
						spent = append(spent, k)
					}
				}
			}
			for _, p := range failureModes {
				resp, err := c.rateLimit(t.Context(), p, spent, grpcLimit)
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("%s: spending the clients' allowance: %v %v", p, resp, err)
				}
				if resp, err := c.rateLimit(t.Context(), p, spent, 0); err != nil || slices.ContainsFunc(resp.GetStatuses(), func(s *rlsv3.RateLimitResponse_DescriptorStatus) bool {
					return s.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT
				}) {
					t.Fatalf("%s: the spent clients are not over the limit: %v %v", p, resp, err)
				}
			}
			errorsBefore := map[string]float64{}
			for _, p := range failureModes {
				errorsBefore[p] = metric(t, r, `limiterd_store_errors_total{policy="default/`+p+`"}`)
			}

			var (
				mu    sync.Mutex
				calls []grpcCall
				stop  = make(chan struct{})
				wg    sync.WaitGroup
			)
			for _, p := range failureModes {
				for kind, keysOf := range workers {
					for _, keys := range keysOf {
						wg.Go(func() {
							for {
								select {
								case <-stop:
									return
								case <-time.After(5 * time.Millisecond):
								}
								rec := c.call(p, kind, keys)
								mu.Lock()
								calls = append(calls, rec)
								mu.Unlock()
							}
						})
					}
				}
			}
			halted := false
			halt := func() {
				if !halted {
					halted = true
					close(stop)
					wg.Wait()
				}
			}
			defer halt()

			time.Sleep(time.Second)
			faultStart := time.Now()
			tc.inject(t, srv)
			faultEnd := time.Now()
			// Recovered: the first fresh client that Closed admits, which only Redis does.
			var recovered time.Time
			for i := 0; recovered.IsZero(); i++ {
				if time.Since(faultEnd) > recoveryBound {
					t.Fatalf("failure mode Closed still refuses fresh clients %v after the fault ended", recoveryBound)
				}
				resp, err := c.rateLimit(t.Context(), "closed", []string{fmt.Sprint("probe-", i)}, 0)
				if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					recovered = time.Now()
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(time.Second)
			halt()

			// What the calls answered, by policy and by phase: before the fault (ended before
			// it started), during it (started before the recovery), after it.
			type phaseCounts struct{ calls, admitted, errs int }
			var longest = map[string]time.Duration{}
			counts := map[string]*[3]phaseCounts{}
			during := map[string]map[string]int{} // by policy, by client: admitted during the fault
			after := map[string]map[string]int{}  // and after the recovery
			closedShapes := map[string]int{}      // Closed's rejections of calls that started in the fault
			for _, p := range failureModes {
				counts[p], during[p], after[p] = &[3]phaseCounts{}, map[string]int{}, map[string]int{}
			}
			for _, rec := range calls {
				longest[rec.kind] = max(longest[rec.kind], rec.took)
				phase := 1
				switch {
				case rec.start.Add(rec.took).Before(faultStart):
					phase = 0
				case !rec.start.Before(recovered):
					phase = 2
				}
				pc := &counts[rec.policy][phase]
				pc.calls++
				if rec.err != nil {
					pc.errs++
					t.Errorf("%s %s call at %v of the fault failed: %v", rec.policy, rec.kind, rec.start.Sub(faultStart).Round(time.Millisecond), rec.err)
					continue
				}
				for i, ok := range rec.admitted {
					if !ok {
						continue
					}
					pc.admitted++
					switch phase {
					case 1:
						during[rec.policy][rec.keys[i]]++
					case 2:
						after[rec.policy][rec.keys[i]]++
					}
				}
				if rec.policy == "closed" && phase == 1 && tc.real && !slices.Contains(rec.admitted, true) {
					closedShapes[fmt.Sprintf("%s %s retry-after=%q http=%d", rec.kind, rec.code, rec.retryAfter, rec.httpStatus)]++
				}
			}
			t.Logf("%s: fault of %v; Closed admitted a fresh client %v after it ended; longest call: one descriptor %v, %d descriptors %v, check %v",
				tc.name, faultEnd.Sub(faultStart).Round(time.Millisecond), recovered.Sub(faultEnd).Round(time.Millisecond),
				longest["one"].Round(time.Millisecond), multiDescriptors, longest["multi"].Round(time.Millisecond), longest["check"].Round(time.Millisecond))
			for _, p := range failureModes {
				storeErrors := metric(t, r, `limiterd_store_errors_total{policy="default/`+p+`"}`) - errorsBefore[p]
				pc := counts[p]
				t.Logf("%-6s before: %d calls, %d admitted; during: %d calls, %d admitted; after: %d calls, %d admitted; store errors %v",
					p, pc[0].calls, pc[0].admitted, pc[1].calls, pc[1].admitted, pc[2].calls, pc[2].admitted, storeErrors)
				switch {
				case tc.real && storeErrors == 0:
					t.Errorf("%s: no store error counted during the %s", p, tc.name)
				case !tc.real && storeErrors != 0:
					t.Errorf("%s: %v store errors after %s, want none: reloading scripts is no fault", p, storeErrors, tc.name)
				}
				if pc[0].admitted != 0 {
					t.Errorf("%s: %d admitted before the fault on clients with nothing left", p, pc[0].admitted)
				}
				// During the fault: Open admits; Closed admits only what Redis decides (for a
				// restart, afresh: at most the limit a client); Local as Closed, and at most the
				// limit a client from memory. Without a fault nothing is admitted.
				switch {
				case !tc.real && pc[1].admitted != 0:
					t.Errorf("%s: %d admitted during %s on clients with nothing left, want none", p, pc[1].admitted, tc.name)
				case p == "open" && tc.real && pc[1].admitted == 0:
					t.Errorf("open: nothing admitted during the %s", tc.name)
				case p != "open":
					most := map[bool]int{true: 0, false: grpcLimit}[tc.keepsState]
					if p == "local" {
						most += grpcLimit
					}
					for key, n := range during[p] {
						if n > most {
							t.Errorf("%s: client %s admitted %d times during the %s, want at most %d", p, key, n, tc.name, most)
						}
					}
				}
				// After it, Redis decides again: nothing on a client whose state it kept, at
				// most the limit on one it lost.
				for key, n := range after[p] {
					if want := map[bool]int{true: 0, false: grpcLimit}[tc.keepsState]; n > want {
						t.Errorf("%s: client %s admitted %d times after the %s, want at most %d", p, key, n, tc.name, want)
					}
				}
			}
			if tc.real {
				// Closed's own answer is a rejection with Retry-After 1; Redis's, on a spent
				// client, one with the bucket's wait.
				t.Logf("closed's rejections during the %s: %v", tc.name, closedShapes)
				failureMode := 0
				for shape, n := range closedShapes {
					kind, answer, _ := strings.Cut(shape, " ")
					if answer == `OVER_LIMIT retry-after="1" http=0` || answer == `ResourceExhausted retry-after="1" http=429` {
						failureMode += n
					}
					if want := "OVER_LIMIT"; kind == "check" {
						want = "ResourceExhausted"
						if !strings.HasPrefix(answer, want+" ") || !strings.HasSuffix(answer, " http=429") {
							t.Errorf("closed rejected a check with %q during the %s, want %s and HTTP 429", answer, tc.name, want)
						}
					} else if !strings.HasPrefix(answer, want+" ") {
						t.Errorf("closed rejected a request with %q during the %s, want %s", answer, tc.name, want)
					}
				}
				if failureMode == 0 {
					t.Errorf("closed: no rejection with Retry-After 1 (the failure mode's) during the %s", tc.name)
				}
			}
			// A call waits at most the store timeout; a request of several descriptors, at
			// most one more for the health check that a timed-out piece waits for (as an HTTP
			// batch does).
			for kind, d := range longest {
				bound := timeout + timeout/16 + slack
				if kind == "multi" {
					bound += timeout
				}
				if d > bound {
					t.Errorf("a %s call took %v, want at most %v", kind, d, bound)
				}
			}

			// Exact again: concurrent requests of several descriptors on one fresh client, and
			// checks of another, are admitted exactly the limit. After SCRIPT FLUSH, the
			// scripts are flushed once more first, so that these requests are the ones that
			// load them again.
			if !tc.real {
				tc.inject(t, srv)
			}
			for _, p := range failureModes {
				key := "fresh-" + tc.name
				var admitted, checks int
				var cwg sync.WaitGroup
				var cmu sync.Mutex
				for range 4 {
					cwg.Go(func() {
						rec := c.call(p, "multi", slices.Repeat([]string{key}, multiDescriptors))
						cmu.Lock()
						defer cmu.Unlock()
						if rec.err != nil {
							t.Errorf("%s: %v", p, rec.err)
						}
						for _, ok := range rec.admitted {
							if ok {
								admitted++
							}
						}
					})
					cwg.Go(func() {
						for range grpcLimit {
							rec := c.call(p, "check", []string{key + "-check"})
							cmu.Lock()
							if rec.err != nil {
								t.Errorf("%s: %v", p, rec.err)
							}
							if rec.admitted[0] {
								checks++
							}
							cmu.Unlock()
						}
					})
				}
				cwg.Wait()
				if admitted != grpcLimit || checks != grpcLimit {
					t.Errorf("%s after the %s: a fresh client was admitted %d of %d descriptors, another %d of %d checks; want exactly the limit %d each",
						p, tc.name, admitted, 4*multiDescriptors, checks, 4*grpcLimit, grpcLimit)
				}
			}
			if !tc.real {
				for _, p := range failureModes {
					if n := metric(t, r, `limiterd_store_errors_total{policy="default/`+p+`"}`) - errorsBefore[p]; n != 0 {
						t.Errorf("%s: %v store errors after a second SCRIPT FLUSH, want none", p, n)
					}
				}
			}
		})
	}
}
