package envoyrls

import (
	"context"
	"net"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// newPolicy returns a policy <namespace>/<name> whose default tier is the first tier.
func newPolicy(namespace, name string, tiers ...v1alpha1.Tier) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       v1alpha1.RateLimitPolicySpec{Tiers: tiers, DefaultTier: tiers[0].Name},
	}
}

// newEngine returns an engine on clock with the policies loaded (none: not ready).
func newEngine(t testing.TB, clock *testsupport.Clock, policies ...*v1alpha1.RateLimitPolicy) *engine.Engine {
	t.Helper()
	return newEngineOn(t, clock.Now, policies...)
}

// newEngineOn returns an engine on the clock now with the policies loaded (none: not ready).
func newEngineOn(t testing.TB, now func() time.Time, policies ...*v1alpha1.RateLimitPolicy) *engine.Engine {
	t.Helper()
	return testsupport.NewEngine(t, now, policies...)
}

// dial serves the service of e (with ServerOptions) over an in-memory listener and returns a
// client of it, both closed when the test ends.
func dial(t testing.TB, e *engine.Engine) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(ServerOptions()...)
	Register(srv, New(e, nil))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
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

// entries builds a descriptor from key, value pairs.
func entries(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// request builds a request for domain with descriptors.
func request(domain string, descriptors ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descriptors}
}

// headerMap returns a response's headers to add by key; a repeated key fails the test.
func headerMap(t testing.TB, resp *rlsv3.RateLimitResponse) map[string]string {
	t.Helper()
	m := make(map[string]string)
	for _, h := range resp.GetResponseHeadersToAdd() {
		if _, dup := m[h.GetKey()]; dup {
			t.Errorf("header %s added twice", h.GetKey())
		}
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

// remaining returns what the engine reports as the client's remaining quota, consuming nothing.
func remaining(t testing.TB, e *engine.Engine, policyID v1alpha1.PolicyID, key string) int64 {
	t.Helper()
	r, err := e.Peek(t.Context(), policyID, key)
	if err != nil {
		t.Fatalf("peek %s %q: %v", policyID, key, err)
	}
	return r.Remaining
}
