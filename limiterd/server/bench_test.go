package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/limiterd/limiterd/internal/testsupport"
)

// discardWriter is a reusable ResponseWriter, so that a benchmark measures the handler only.
type discardWriter struct {
	header http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }

// rewindBody is a request body that can be read again.
type rewindBody struct{ bytes.Reader }

func (*rewindBody) Close() error { return nil }

// benchHandler measures h answering POST /v1/allow for 10,000 keys round robin.
func benchHandler(b *testing.B, h http.Handler) {
	bodies := make([][]byte, 10_000)
	for i := range bodies {
		bodies[i] = []byte(`{"policy":"default/api","key":"client-` + strconv.Itoa(i) + `","cost":1}`)
	}
	req, err := http.NewRequest(http.MethodPost, "http://limiterd/v1/allow", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	body := &rewindBody{}
	req.Body = body
	w := &discardWriter{header: make(http.Header)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		data := bodies[i%len(bodies)]
		body.Reset(data)
		req.ContentLength = int64(len(data))
		clear(w.header)
		h.ServeHTTP(w, req)
		if w.status != http.StatusOK && w.status != http.StatusTooManyRequests {
			b.Fatalf("status %d", w.status)
		}
	}
}

// BenchmarkHandlerTrivial is the baseline: read the body, answer a fixed decision.
func BenchmarkHandlerTrivial(b *testing.B) {
	answer := []byte(`{"allowed":true,"limit":1000,"remaining":999,"resetAfterSeconds":1,"retryAfterSeconds":0,"resetAfterMs":1000,"retryAfterMs":0}` + "\n")
	benchHandler(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(answer)
	}))
}

// BenchmarkHandlerDecisions is limiterd's decision handler on the in-memory store.
func BenchmarkHandlerDecisions(b *testing.B) {
	clock := testsupport.NewClock()
	e := newEngine(b, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 1000, 1000, time.Second)))
	benchHandler(b, NewDecisions(e, nil))
}

// BenchmarkHandlerDecisionsAllowedHosts is BenchmarkHandlerDecisions with the Host check of
// WithAllowedHosts on, the request naming a listed host as the chart's Service names it.
func BenchmarkHandlerDecisionsAllowedHosts(b *testing.B) {
	clock := testsupport.NewClock()
	e := newEngine(b, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 1000, 1000, time.Second)))
	benchHandler(b, NewDecisions(e, nil, WithAllowedHosts([]string{"limiterd", "limiterd.limiterd", "limiterd.limiterd.svc", "limiterd.limiterd.svc.cluster.local"})))
}

// BenchmarkHandlerBatch is limiterd's batch handler on the in-memory store, with batches of 100
// decisions over the keys BenchmarkHandlerDecisions uses; ns/decision compares with its ns/op.
func BenchmarkHandlerBatch(b *testing.B) {
	const n = 100
	clock := testsupport.NewClock()
	h := NewDecisions(newEngine(b, clock, newPolicy("api", testsupport.TokenBucketTier("standard", 1000, 1000, time.Second))), nil)
	bodies := make([][]byte, 10_000/n)
	for i := range bodies {
		var body bytes.Buffer
		body.WriteString(`{"items":[`)
		for j := range n {
			if j > 0 {
				body.WriteByte(',')
			}
			body.WriteString(`{"policy":"default/api","key":"client-` + strconv.Itoa(i*n+j) + `","cost":1}`)
		}
		body.WriteString(`]}`)
		bodies[i] = body.Bytes()
	}
	req, err := http.NewRequest(http.MethodPost, "http://limiterd/v1/allow:batch", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	body := &rewindBody{}
	req.Body = body
	w := &discardWriter{header: make(http.Header)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		data := bodies[i%len(bodies)]
		body.Reset(data)
		req.ContentLength = int64(len(data))
		clear(w.header)
		h.ServeHTTP(w, req)
		if w.status != http.StatusOK {
			b.Fatalf("status %d", w.status)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/decision")
}

// BenchmarkDecodeAllowRequest compares the request decoder with encoding/json.
func BenchmarkDecodeAllowRequest(b *testing.B) {
	body := []byte(`{"policy":"default/api","key":"client-12345","cost":1}`)
	b.Run("limiterd", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeAllowRequest(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req struct {
				Policy string `json:"policy"`
				Key    string `json:"key"`
				Cost   int64  `json:"cost"`
			}
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkHandlerForwardAuth measures a forward-auth request keyed by client address (one
// trusted hop) for 10,000 clients round robin, as a gateway sends it, beside
// BenchmarkHandlerDecisions: the issue asks for at least 0.9x its decisions per second.
func BenchmarkHandlerForwardAuth(b *testing.B) {
	clock := testsupport.NewClock()
	p := newPolicy("api", testsupport.TokenBucketTier("standard", 1000, 1000, time.Second))
	p.Spec.Gateway = byAddress(1)
	e := newEngine(b, clock, p)
	h := NewDecisions(e, nil)
	xffs := make([][]string, 10_000)
	for i := range xffs {
		xffs[i] = []string{"203.0.113.9, 10." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256) + ".1"}
	}
	req, err := http.NewRequest(http.MethodGet, "http://limiterd/v1/forward-auth/default/api", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.RemoteAddr = "10.0.0.1:40000"
	req.Header.Set("X-Forwarded-Method", "GET")
	req.Header.Set("X-Forwarded-Uri", "/api/orders?page=1")
	req.Header.Set("X-Forwarded-Host", "shop.example.com")
	w := &discardWriter{header: make(http.Header)}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req.Header["X-Forwarded-For"] = xffs[i%len(xffs)]
		clear(w.header)
		h.ServeHTTP(w, req)
		if w.status != http.StatusOK && w.status != http.StatusTooManyRequests {
			b.Fatalf("status %d", w.status)
		}
	}
}
