package limiter_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/limiterd/limiterd/limiterd/limiter"
	"github.com/limiterd/limiterd/limiterd/limiter/limitertest"
)

// The benchmarks compare limiterd's core with golang.org/x/time/rate in the same run.
// Both sides are given the time (AllowN(t, n) versus Decide(s, t, n)), so neither pays for the
// clock, and both see a clock that advances by 1µs per decision at a rate that admits every
// other request, so both the admit and the reject paths are taken.

func BenchmarkHotKey(b *testing.B) {
	b.Run("x-time-rate/AllowN", func(b *testing.B) {
		l := rate.NewLimiter(rate.Every(2*time.Microsecond), 100)
		now := limitertest.T0
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			l.AllowN(now, 1)
		}
	})
	// Limiter.Allow reads the clock itself: compare it with a registry decision that does too.
	b.Run("x-time-rate/Allow", func(b *testing.B) {
		l := rate.NewLimiter(rate.Every(2*time.Microsecond), 100)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			l.Allow()
		}
	})
	b.Run("limiterd/Memory.Decide(time.Now)", func(b *testing.B) {
		tb := limitertest.One(mustTB(b, 100, 500, time.Millisecond))
		m := limiter.NewMemory(nil)
		ctx := b.Context()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			_, _ = m.Decide(ctx, "hot-client", tb, time.Now(), 1, nil)
		}
	})
	b.Run("limiterd/TokenBucket.Decide", func(b *testing.B) {
		tb := mustTB(b, 100, 500, time.Millisecond)
		var s limiter.State
		now := limitertest.T0
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			tb.Decide(&s, now, 1)
		}
	})
	b.Run("limiterd/Memory.Decide", func(b *testing.B) {
		tb := limitertest.One(mustTB(b, 100, 500, time.Millisecond))
		m := limiter.NewMemory(nil)
		ctx := b.Context()
		now := limitertest.T0
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			m.Decide(ctx, "hot-client", tb, now, 1, nil)
		}
	})
	// A calendar quota (a day in New York, its limit never reached): within a period a decision
	// is a comparison and an addition, to be within 1.2x of Memory.Decide's token bucket. The
	// clock stays in one day; a new period's cost is BenchmarkQuotaDecide/Rollover's.
	b.Run("limiterd/Quota.Decide", func(b *testing.B) {
		q := mustQuota(b, limiter.MaxQuotaLimit, limiter.PeriodDay, mustZone(b, "America/New_York"))
		var s limiter.State
		now := limitertest.T0
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			q.Decide(&s, now, 1)
		}
	})
	b.Run("limiterd/Memory.DecideQuota", func(b *testing.B) {
		st := limitertest.One(mustQuota(b, limiter.MaxQuotaLimit, limiter.PeriodDay, mustZone(b, "America/New_York")))
		m := limiter.NewMemory(nil)
		ctx := b.Context()
		now := limitertest.T0
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			m.Decide(ctx, "hot-client", st, now, 1, nil)
		}
	})
	// A stacked tier: a burst bucket and a window, decided all or nothing under one lock.
	b.Run("limiterd/Memory.DecideStack", func(b *testing.B) {
		st := limitertest.Stack("burst", mustTB(b, 100, 500, time.Millisecond), "daily", mustSW(b, 500, time.Millisecond))
		m := limiter.NewMemory(nil)
		ctx := b.Context()
		now := limitertest.T0
		out := make([]limiter.Decision, st.Len())
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			m.Decide(ctx, "hot-client", st, now, 1, out)
		}
	})
	b.Run("limiterd/SlidingWindow.Decide", func(b *testing.B) {
		sw := mustSW(b, 500, time.Millisecond)
		var s limiter.State
		now := limitertest.T0
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			sw.Decide(&s, now, 1)
		}
	})
}

const manyClients = 1_000_000

func clientKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%07d", i)
	}
	return keys
}

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkManyClients decides for existing clients among 1M tracked ones, and reports the heap
// bytes each tracked client costs (keys included) for limiterd's Memory and for a
// map[string]*rate.Limiter holding the same keys.
func BenchmarkManyClients(b *testing.B) {
	keys := clientKeys(manyClients)
	now := limitertest.T0
	b.Run("x-time-rate/map", func(b *testing.B) {
		before := heapInUse()
		limiters := make(map[string]*rate.Limiter)
		for _, k := range keys {
			l := rate.NewLimiter(10, 100)
			l.AllowN(now, 1)
			limiters[k] = l
		}
		after := heapInUse()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			limiters[keys[i%manyClients]].AllowN(now.Add(time.Duration(i)), 1)
		}
		b.StopTimer()
		b.ReportMetric(float64(after-before)/manyClients, "heapB/client")
		runtime.KeepAlive(limiters)
	})
	b.Run("limiterd/Memory", func(b *testing.B) {
		tb := limitertest.One(mustTB(b, 100, 10, time.Second))
		before := heapInUse()
		m := limiter.NewMemory(nil)
		ctx := b.Context()
		for _, k := range keys {
			m.Decide(ctx, k, tb, now, 1, nil)
		}
		after := heapInUse()
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			m.Decide(ctx, keys[i%manyClients], tb, now.Add(time.Duration(i)), 1, nil)
		}
		b.StopTimer()
		b.ReportMetric(float64(after-before)/manyClients, "heapB/client")
		runtime.KeepAlive(m)
	})
}

// BenchmarkParallel decides from every available core over 100k keys: run it with -cpu 1,2 to
// see how decisions scale with GOMAXPROCS.
func BenchmarkParallel(b *testing.B) {
	keys := clientKeys(100_000)
	tb := limitertest.One(mustTB(b, 100, 10, time.Second))
	m := limiter.NewMemory(nil)
	ctx := b.Context()
	var worker atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(worker.Add(1)) * 7919
		now := limitertest.T0
		for pb.Next() {
			i++
			now = now.Add(time.Microsecond)
			m.Decide(ctx, keys[i%len(keys)], tb, now, 1, nil)
		}
	})
}

// BenchmarkMemoryRefund measures a refund that is recorded: a charge of one unit of a hot
// client refunded, one record each, records expiring as the clock runs (100 µs a refund, so
// about 100,000 live records once the grace has passed).
func BenchmarkMemoryRefund(b *testing.B) {
	tb := limitertest.One(mustTB(b, 100, 1, time.Second))
	m := limiter.NewMemory(nil)
	ctx := b.Context()
	now := limitertest.T0
	req := limiter.Request{Key: "hot-client", Stack: tb, Cost: 1}
	var id [16]byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		now = now.Add(100 * time.Microsecond)
		m.Decide(ctx, "hot-client", tb, now, 1, nil)
		binary.BigEndian.PutUint64(id[8:], uint64(i))
		if _, err := m.Refund(ctx, req, now, limiter.Once{ID: id, Until: now.Add(time.Millisecond), Issued: now, Cost: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConcurrency compares, in one run, a token bucket's decision in the memory store with a
// concurrency limit's acquisition alone, and followed by the release of its lease (the issue's
// bound: within 2x). The clock moves 100µs a pair, so that the refund records that make each release apply once
// (kept RefundRecordGrace past the lease's expiry) stay within a client's share of them.
func BenchmarkConcurrency(b *testing.B) {
	ctx := b.Context()
	b.Run("TokenBucket/Decide", func(b *testing.B) {
		st := limitertest.One(mustTB(b, 100, 500, time.Millisecond))
		m := limiter.NewMemory(nil)
		now := limitertest.T0
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(100 * time.Microsecond)
			m.Decide(ctx, "hot-client", st, now, 1, nil)
		}
	})
	// The acquisition alone: each lease expires 1ms after it is taken, so about 10 are held.
	b.Run("Concurrency/Acquire", func(b *testing.B) {
		cc, err := limiter.NewConcurrency(100, time.Millisecond)
		if err != nil {
			b.Fatal(err)
		}
		st := limitertest.One(cc)
		m := limiter.NewMemory(nil)
		now := limitertest.T0
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(100 * time.Microsecond)
			if d, _ := m.Decide(ctx, "hot-client", st, now, 1, nil); !d.Allowed {
				b.Fatal("refused")
			}
		}
	})
	b.Run("Concurrency/Acquire+Release", func(b *testing.B) {
		cc, err := limiter.NewConcurrency(100, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		st := limitertest.One(cc)
		m := limiter.NewMemory(nil)
		now := limitertest.T0
		var id [16]byte
		n := uint64(0)
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(100 * time.Microsecond)
			d, _ := m.Decide(ctx, "hot-client", st, now, 1, nil)
			if !d.Allowed {
				b.Fatal("refused")
			}
			n++
			binary.BigEndian.PutUint64(id[8:], n)
			once := limiter.Once{Op: limiter.OpRelease, ID: id, Issued: now, Until: now.Add(time.Second), Cost: 1, Lease: d.Lease}
			if _, err := m.Refund(ctx, limiter.Request{Key: "hot-client", Stack: st, Cost: 1}, now, once); err != nil {
				b.Fatal(err)
			}
		}
	})
}
