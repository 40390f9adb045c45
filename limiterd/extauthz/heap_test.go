package extauthz_test

import (
	"runtime"
	"strconv"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/limiterd/limiterd/limiterd/envoyrls"
)

// TestLargestCheckHoldsBoundedHeap: the check message that costs most to decode within
// envoyrls.MaxRequestBytes (as many distinct one-byte-valued headers as fit, each a map entry)
// holds at most 1 MiB of heap once decoded, so MaxCallsInFlight of them hold at most 256 MiB;
// the figure is logged.
func TestLargestCheckHoldsBoundedHeap(t *testing.T) {
	headers := map[string]string{}
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Headers: headers}}}}
	// Each entry costs its key (up to 3 bytes) and 6 bytes of framing: add them in steps,
	// measuring the message only between steps.
	for i := 0; ; {
		left := envoyrls.MaxRequestBytes - 16 - proto.Size(req)
		if left < 10 {
			break
		}
		for end := i + left/10 + 1; i < end; i++ {
			headers[strconv.FormatInt(int64(i), 36)] = ""
		}
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	held := make([]*authv3.CheckRequest, n)
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
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	runtime.KeepAlive(held)
	t.Logf("a %d-byte check of %d headers holds %d KiB decoded", len(b), len(headers), per>>10)
	if per > 1<<20 {
		t.Errorf("a decoded check holds %d KiB, want at most 1 MiB", per>>10)
	}
}
