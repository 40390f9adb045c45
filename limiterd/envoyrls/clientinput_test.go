package envoyrls

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// dialLoopback serves the service of e on a TCP loopback port with a real grpc-go server and
// returns a client of it, both closed when the test ends.
func dialLoopback(t testing.TB, e *engine.Engine) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	Register(srv, New(e, nil))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return rlsv3.NewRateLimitServiceClient(conn)
}

// Nothing a client of Envoy can put in a descriptor fails the request (which Envoy's
// failure_mode_deny: false would admit, skipping every descriptor): an over-long key is a
// client, an over-max cost rejects its descriptor alone, an empty value is a client.
func TestClientInputNeverFailsARequest(t *testing.T) {
	clock := testsupport.NewClock()
	whole := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 3, 1, time.Minute),
		testsupport.TokenBucketTier("vip", 5, 1, time.Minute))
	whole.Spec.Overrides = []v1alpha1.Override{{Tier: "vip", ClientPrefixes: []string{"k=vip:"}}}
	byKey := newPolicy("edge", "ip", testsupport.TokenBucketTier("per-ip", 2, 1, time.Minute))
	byKey.Spec.Envoy = &v1alpha1.Envoy{DescriptorKey: "remote_address"}
	e := newEngine(t, clock, whole, byKey)
	c := dialLoopback(t, e)

	long := strings.Repeat("a", v1alpha1.MaxClientKeyBytes+1)
	huge := strings.Repeat("b", 60<<10)
	shared := strings.Repeat("s", v1alpha1.MaxClientKeyBytes+10)
	vip := "vip:" + strings.Repeat("v", 2*v1alpha1.MaxClientKeyBytes)
	descriptors := func() []*ratelimitv3.RateLimitDescriptor {
		return []*ratelimitv3.RateLimitDescriptor{
			entries("k", "a"), entries("k", long), entries("k", huge), entries("k", shared+"1"), entries("k", shared+"2"), entries("k", vip),
		}
	}
	for round, want := range []struct {
		code          rlsv3.RateLimitResponse_Code
		left, vipLeft uint32
	}{{ok, 2, 4}, {ok, 1, 3}, {ok, 0, 2}, {overLimit, 0, 1}} {
		resp, err := c.ShouldRateLimit(t.Context(), request("api", descriptors()...))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, st := range resp.GetStatuses() {
			wantLeft, tier := want.left, "standard"
			if i == 5 {
				wantLeft, tier = want.vipLeft, "vip"
			}
			wantCode := want.code
			if i == 5 {
				wantCode = ok
			}
			if st.GetCode() != wantCode || st.GetLimitRemaining() != wantLeft || st.GetCurrentLimit().GetName() != tier {
				t.Errorf("round %d, descriptor %d: %v, want %v with %d left by %s", round, i, st, wantCode, wantLeft, tier)
			}
		}
	}
	// The over-long key's state is its digest's, reached by the same key over HTTP's engine.
	if got := remaining(t, e, "default/api", "k="+long); got != 0 {
		t.Errorf("k=<1,025 bytes> has %d left through the engine, want 0", got)
	}
	sum := sha256.Sum256([]byte("k=" + long))
	if got := remaining(t, e, "default/api", "sha256:"+hex.EncodeToString(sum[:])); got != 3 {
		t.Errorf("the digest form of k=<1,025 bytes> has %d left, want a fresh 3: it reached another client", got)
	}

	// An over-max hits_addend rejects its descriptor, beside a normal one that is decided.
	tooMuch := entries("k", "b")
	tooMuch.HitsAddend = wrapperspb.UInt64(MaxCost + 1)
	resp, err := c.ShouldRateLimit(t.Context(), request("api", entries("k", "b"), tooMuch, entries("k", "c")))
	if err != nil {
		t.Fatalf("over-max hits_addend: %v, want an answer", err)
	}
	st := resp.GetStatuses()
	if resp.GetOverallCode() != overLimit || st[0].GetCode() != ok || st[1].GetCode() != overLimit || st[2].GetCode() != ok {
		t.Fatalf("over-max hits_addend: %v, want OK, OVER_LIMIT, OK", resp)
	}
	if got := remaining(t, e, "default/api", "k=b"); got != 2 {
		t.Errorf("k=b has %d left, want 2: charged once, not by the over-max descriptor", got)
	}
	// The request's hits_addend over the max rejects the descriptors it applies to only.
	own := entries("k", "d")
	own.HitsAddend = wrapperspb.UInt64(1)
	resp, err = c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: MaxCost + 1,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{entries("k", "e"), own}})
	if err != nil || resp.GetStatuses()[0].GetCode() != overLimit || resp.GetStatuses()[1].GetCode() != ok {
		t.Fatalf("over-max request hits_addend: %v %v, want OVER_LIMIT, OK", resp, err)
	}
	if a, b := remaining(t, e, "default/api", "k=e"), remaining(t, e, "default/api", "k=d"); a != 3 || b != 2 {
		t.Errorf("k=e has %d left (want 3), k=d %d (want 2)", a, b)
	}

	// An empty value of the descriptorKey entry is the client "", limited like any other.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, overLimit} {
		resp, err := c.ShouldRateLimit(t.Context(), request("edge/ip", entries("remote_address", ""), entries("remote_address", "10.0.0.1")))
		if err != nil || resp.GetStatuses()[0].GetCode() != want || resp.GetStatuses()[1].GetCode() != want {
			t.Fatalf("empty value, request %d: %v %v, want %v for both", i, resp, err, want)
		}
	}
	// And so is an over-long value of it.
	for i, want := range []rlsv3.RateLimitResponse_Code{ok, ok, overLimit} {
		resp, err := c.ShouldRateLimit(t.Context(), request("edge/ip", entries("remote_address", long)))
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("long value, request %d: %v %v, want %v", i, resp, err, want)
		}
	}
}

// tierNames Hidden names the tier "limit" in current_limit and the header fields Envoy adds.
func TestHiddenTierNames(t *testing.T) {
	p := newPolicy("default", "api", testsupport.TokenBucketTier("standard", 3, 1, time.Minute))
	p.Spec.TierNames = v1alpha1.TierNamesHidden
	c := dialLoopback(t, newEngine(t, testsupport.NewClock(), p))
	resp, err := c.ShouldRateLimit(t.Context(), request("api", entries("k", "a")))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetStatuses()[0].GetCurrentLimit().GetName(); got != "limit" {
		t.Errorf("current_limit named %q, want limit", got)
	}
	if h := headerMap(t, resp); h["Ratelimit-Policy"] != `"limit";q=3;w=180` || h["Ratelimit"] != `"limit";r=2;t=60` {
		t.Errorf("headers %q, want the tier named limit", h)
	}
}
