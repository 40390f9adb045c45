package envoyrls_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/limiterd/limiterd/limiterd/envoyrls"
)

func checkWith(headers map[string]string, raw ...string) *authv3.CheckRequest {
	h := &authv3.AttributeContext_HttpRequest{Headers: headers, Host: "h", Path: "/"}
	if raw != nil {
		h.HeaderMap = &corev3.HeaderMap{}
		for _, k := range raw {
			h.HeaderMap.Headers = append(h.HeaderMap.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte("v")})
		}
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request:           &authv3.AttributeContext_Request{Http: h},
		ContextExtensions: map[string]string{"namespace": "default", "policy": "api"},
	}}
}

func TestCheckHeadersCountsEveryOccurrence(t *testing.T) {
	one, err := proto.Marshal(checkWith(map[string]string{"a": "1", "b": "2"}, "c", "d", "e"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := envoyrls.CheckHeaders(one); n != 5 || err != nil {
		t.Errorf("2 headers and 3 raw ones: %d %v", n, err)
	}
	// proto.Unmarshal merges a message given twice: so does the count, repeated entries of one
	// name included.
	twice := append(append([]byte(nil), one...), one...)
	if n, err := envoyrls.CheckHeaders(twice); n != 10 || err != nil {
		t.Errorf("the check twice over: %d %v, want 10", n, err)
	}
	if n, err := envoyrls.CheckHeaders(nil); n != 0 || err != nil {
		t.Errorf("empty check: %d %v", n, err)
	}
	if _, err := envoyrls.CheckHeaders(one[:len(one)-1]); err == nil {
		t.Errorf("a truncated check was counted")
	}
	if n := testing.AllocsPerRun(10, func() { _, _ = envoyrls.CheckHeaders(twice) }); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}

// FuzzCheckHeaders holds the count to proto.Unmarshal: it refuses no message that
// proto.Unmarshal accepts, and counts at least the headers that decoding yields.
func FuzzCheckHeaders(f *testing.F) {
	for _, c := range []*authv3.CheckRequest{checkWith(map[string]string{"a": "1"}, "b"), checkWith(nil), {}} {
		b, err := proto.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(protowire.AppendTag(nil, 1, protowire.StartGroupType))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := envoyrls.CheckHeaders(b)
		var c authv3.CheckRequest
		uerr := proto.Unmarshal(b, &c)
		if uerr != nil {
			return
		}
		if err != nil {
			t.Fatalf("CheckHeaders refused a check that proto.Unmarshal decodes: %v", err)
		}
		h := c.GetAttributes().GetRequest().GetHttp()
		if got := len(h.GetHeaders()) + len(h.GetHeaderMap().GetHeaders()); n < got {
			t.Fatalf("counted %d header fields, decoded %d", n, got)
		}
	})
}
