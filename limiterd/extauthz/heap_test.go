package extauthz_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/limiterd/limiterd/internal/testsupport"
	"github.com/limiterd/limiterd/limiterd/envoyrls"
)

// manyHeaders returns the headers of a check: n distinct names (plus x-api-key: k), padded
// so that the check's message is about bytes long.
func manyHeaders(n, bytes int) map[string]string {
	h := map[string]string{"x-api-key": "k"}
	pad := max(0, bytes/n-16)
	for i := range n - 1 {
		h[strconv.FormatInt(int64(i), 36)] = strings.Repeat("v", pad)
	}
	return h
}

// TestChecksOfTooManyHeadersAreRefused: a check of more than envoyrls.MaxCheckHeaders header
// fields fails as a call before it is decoded, and charges nothing; one of MaxCheckHeaders is
// decided.
func TestChecksOfTooManyHeadersAreRefused(t *testing.T) {
	e := testsupport.NewEngine(t, testsupport.NewClock().Now, gatewayPolicy("api", byHeader("X-Api-Key", "")))
	c := dial(t, e)
	over := check("api", "10.0.0.1", manyHeaders(envoyrls.MaxCheckHeaders+1, 0))
	if _, err := c.Check(t.Context(), over); status.Code(err) == codes.OK || !strings.Contains(err.Error(), "header fields") {
		t.Fatalf("a check of %d headers: %v, want refused", envoyrls.MaxCheckHeaders+1, err)
	}
	if res, _ := e.Peek(t.Context(), "default/api", "header:x-api-key:k"); res.Remaining != 2 {
		t.Errorf("the refused check charged its key: %d left", res.Remaining)
	}
	if r := do(t, c, check("api", "10.0.0.1", manyHeaders(envoyrls.MaxCheckHeaders, 0))); r.code != codes.OK {
		t.Errorf("a check of %d headers: %v %d %s", envoyrls.MaxCheckHeaders, r.code, r.status, r.body)
	}
}

// TestLargestCheckHoldsBoundedHeap: the checks that cost most to hold once decoded, within
// envoyrls.MaxRequestBytes and MaxCheckHeaders (as many headers as allowed, and few headers of
// large values), hold at most 320 KiB of heap each, so the MaxCallsInFlight calls in flight
// hold at most 80 MiB, as the rate-limit service's; the figures are logged.
func TestLargestCheckHoldsBoundedHeap(t *testing.T) {
	for _, n := range []int{envoyrls.MaxCheckHeaders, 64, 8} {
		req := check("api", "10.0.0.1", manyHeaders(n, envoyrls.MaxRequestBytes-2048))
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > envoyrls.MaxRequestBytes {
			t.Fatalf("%d headers: %d bytes, over the bound", n, len(b))
		}
		const calls = 20
		held := make([]*authv3.CheckRequest, calls)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range held {
			held[i] = &authv3.CheckRequest{}
			if err := proto.Unmarshal(b, held[i]); err != nil {
				t.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / calls
		runtime.KeepAlive(held)
		t.Logf("a %d-byte check of %d headers holds %d KiB decoded", len(b), n, per>>10)
		if per > 320<<10 {
			t.Errorf("a %d-byte check of %d headers holds %d KiB, want at most 320 KiB", len(b), n, per>>10)
		}
	}
}
