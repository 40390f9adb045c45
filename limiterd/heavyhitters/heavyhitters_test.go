package heavyhitters_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/heavyhitters"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// checkBounds fails unless every entry of top satisfies the stated bound against the true
// counts, and every key truly counted more than top.Bound times is in it.
func checkBounds(t *testing.T, top heavyhitters.Top, truth map[string]uint64) {
	t.Helper()
	var n uint64
	for _, c := range truth {
		n += c
	}
	if top.Total != n {
		t.Fatalf("Total = %d, want %d", top.Total, n)
	}
	reported := make(map[string]bool, len(top.Entries))
	for _, e := range top.Entries {
		reported[e.Key] = true
		f := truth[e.Key]
		if e.Count < f || e.Count-e.Error > f {
			t.Errorf("key %q: count %d error %d, true count %d outside [count-error, count]", e.Key, e.Count, e.Error, f)
		}
		if e.Error > top.Bound {
			t.Errorf("key %q: error %d over the bound N/k = %d", e.Key, e.Error, top.Bound)
		}
	}
	for k, f := range truth {
		if f > top.Bound && !reported[k] {
			t.Errorf("key %q counted %d > N/k = %d times is not reported", k, f, top.Bound)
		}
	}
}

func TestExactWhileKeysFit(t *testing.T) {
	tr := heavyhitters.New(heavyhitters.Config{Counters: 8, Shards: 1})
	truth := map[string]uint64{"a": 5, "b": 3, "c": 1}
	for k, c := range truth {
		for range c {
			tr.Record(heavyhitters.Rejected, k, t0)
		}
	}
	top := tr.TopN(heavyhitters.Rejected, t0, 10)
	want := []heavyhitters.Entry{{Key: "a", Count: 5}, {Key: "b", Count: 3}, {Key: "c", Count: 1}}
	if fmt.Sprint(top.Entries) != fmt.Sprint(want) || top.Total != 9 || top.Bound != 1 {
		t.Errorf("top = %+v, want entries %v, total 9, bound 9/8", top, want)
	}
	if other := tr.TopN(heavyhitters.Admitted, t0, 10); len(other.Entries) != 0 || other.Total != 0 {
		t.Errorf("admitted top = %+v, want empty: directions are apart", other)
	}
	if two := tr.TopN(heavyhitters.Rejected, t0, 2); len(two.Entries) != 2 || two.Entries[1].Key != "b" {
		t.Errorf("top 2 = %+v", two.Entries)
	}
}

// A known heavy set hidden in a flood of distinct noise keys, spread over the period and over
// several shards, stays at the top with counts within the stated bound.
func TestHeavySetInNoise(t *testing.T) {
	const (
		heavy      = 10
		perHeavy   = 3000
		noise      = 60000
		noiseHeavy = 3 // a few noise keys repeat, lighter than the heavy set
	)
	tr := heavyhitters.New(heavyhitters.Config{Counters: 64, Shards: 4})
	rng := rand.New(rand.NewPCG(1, 2))
	var stream []string
	for h := range heavy {
		for range perHeavy {
			stream = append(stream, fmt.Sprintf("heavy-%d", h))
		}
	}
	for i := range noise {
		for range 1 + i%noiseHeavy {
			stream = append(stream, fmt.Sprintf("noise-%d", i))
		}
	}
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	truth := make(map[string]uint64)
	for i, k := range stream {
		// Over four minutes, inside the five-minute period.
		now := t0.Add(time.Duration(i) * 4 * time.Minute / time.Duration(len(stream)))
		tr.Record(heavyhitters.Rejected, k, now)
		truth[k]++
	}
	now := t0.Add(4 * time.Minute)
	top := tr.TopN(heavyhitters.Rejected, now, 1<<20)
	checkBounds(t, top, truth)
	if top.Bound >= perHeavy {
		t.Fatalf("bound %d does not separate the heavy keys (%d each): the test proves nothing", top.Bound, perHeavy)
	}
	for i, e := range top.Entries[:heavy] {
		if !strings.HasPrefix(e.Key, "heavy-") {
			t.Errorf("entry %d is %q (%d ± %d), want a heavy key", i, e.Key, e.Count, e.Error)
		}
	}
	if entries, _ := tr.Size(); entries > tr.Config().MaxEntries() {
		t.Errorf("%d entries, over the bound %d", entries, tr.Config().MaxEntries())
	}
}

// A random stream of skewed keys, many shards, small sketches: the bound holds for every entry.
func TestBoundOnSkewedStreams(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		tr := heavyhitters.New(heavyhitters.Config{Counters: 8, Shards: 3, Buckets: 2, BucketWidth: time.Second})
		truth := make(map[string]uint64)
		zipf := rand.NewZipf(rng, 1.3, 1, 500)
		for i := range 5000 {
			k := fmt.Sprint(zipf.Uint64())
			tr.Record(heavyhitters.Admitted, k, t0.Add(time.Duration(i)*time.Millisecond/4))
			truth[k]++
		}
		checkBounds(t, tr.TopN(heavyhitters.Admitted, t0.Add(1999*time.Millisecond), 1<<20), truth)
	}
}

// A caller cannot make the memory grow: a flood of distinct keys, long ones too, over many
// buckets, leaves at most MaxEntries entries of at most MaxKeyBytes each.
func TestKeyFloodMemoryBounded(t *testing.T) {
	cfg := heavyhitters.Config{Counters: 16, Shards: 2, Buckets: 3, BucketWidth: time.Second, MaxKeyBytes: 100}
	tr := heavyhitters.New(cfg)
	long := strings.Repeat("x", 5000)
	for i := range 50000 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		key := fmt.Sprint(i)
		if i%2 == 0 {
			key = long + key
		}
		tr.Record(heavyhitters.Direction(i%2), key, now)
		if i%997 == 0 {
			entries, bytes := tr.Size()
			if entries > cfg.MaxEntries() || bytes > cfg.MaxEntries()*100 {
				t.Fatalf("after %d keys: %d entries (bound %d), %d key bytes (bound %d)", i+1, entries, cfg.MaxEntries(), bytes, cfg.MaxEntries()*100)
			}
		}
	}
	entries, _ := tr.Size()
	if max := cfg.MaxEntries(); entries == 0 || max != 2*3*2*16 {
		t.Fatalf("entries %d, MaxEntries %d", entries, max)
	}
	top := tr.TopN(heavyhitters.Admitted, t0.Add(50*time.Second), 1000)
	for _, e := range top.Entries {
		if len(e.Key) > 100 {
			t.Fatalf("key of %d bytes kept, over MaxKeyBytes", len(e.Key))
		}
	}
}

// Once a sketch is full, a flood of new keys reuses the evicted keys' buffers: recording
// allocates nothing.
func TestFloodAllocatesNothing(t *testing.T) {
	tr := heavyhitters.New(heavyhitters.Config{Counters: 8, Shards: 1})
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%04d", i)
	}
	for _, k := range keys[:100] {
		tr.Record(heavyhitters.Rejected, k, t0)
	}
	i := 100
	if allocs := testing.AllocsPerRun(500, func() {
		tr.Record(heavyhitters.Rejected, keys[i%len(keys)], t0)
		i++
	}); allocs != 0 {
		t.Errorf("%v allocations per record of a new key, want 0", allocs)
	}
}

func TestSlidingPeriod(t *testing.T) {
	tr := heavyhitters.New(heavyhitters.Config{Shards: 2}) // 5 buckets of a minute
	tr.Record(heavyhitters.Rejected, "old", t0)
	tr.Record(heavyhitters.Rejected, "new", t0.Add(3*time.Minute))
	at := t0.Add(4*time.Minute + 30*time.Second)
	top := tr.TopN(heavyhitters.Rejected, at, 10)
	if len(top.Entries) != 2 || !top.From.Equal(t0) || !top.To.Equal(at) {
		t.Errorf("at 4m30s: %+v, want old and new from %v", top, t0)
	}
	at = t0.Add(5 * time.Minute)
	top = tr.TopN(heavyhitters.Rejected, at, 10)
	if len(top.Entries) != 1 || top.Entries[0].Key != "new" || top.Total != 1 || !top.From.Equal(t0.Add(time.Minute)) {
		t.Errorf("at 5m: %+v, want new only, from 1m", top)
	}
	// The slot of minute 0 is reused at minute 5: what it held is gone, and a late record of
	// minute 0 is dropped rather than counted in minute 5.
	tr.Record(heavyhitters.Rejected, "five", at)
	tr.Record(heavyhitters.Rejected, "late", t0)
	top = tr.TopN(heavyhitters.Rejected, at, 10)
	if len(top.Entries) != 2 || top.Entries[0].Key != "five" && top.Entries[1].Key != "five" {
		t.Errorf("at 5m after records: %+v, want five and new", top.Entries)
	}
	for _, e := range top.Entries {
		if e.Key == "late" || e.Key == "old" {
			t.Errorf("%q counted at 5m", e.Key)
		}
	}
	if top := tr.TopN(heavyhitters.Rejected, t0.Add(time.Hour), 10); len(top.Entries) != 0 || top.Total != 0 {
		t.Errorf("an hour later: %+v, want empty", top)
	}
}

// Concurrent records of one hot key and distinct keys are all counted (run with -race).
func TestConcurrentRecords(t *testing.T) {
	tr := heavyhitters.New(heavyhitters.Config{Shards: 4})
	const workers, each = 8, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				tr.Record(heavyhitters.Admitted, "hot", t0)
				if i%10 == 0 {
					tr.Record(heavyhitters.Admitted, fmt.Sprint(w, "-", i), t0)
				}
				if i%500 == 0 {
					_ = tr.TopN(heavyhitters.Admitted, t0, 5)
				}
			}
		})
	}
	wg.Wait()
	top := tr.TopN(heavyhitters.Admitted, t0, 1)
	if len(top.Entries) != 1 || top.Entries[0].Key != "hot" || top.Entries[0].Count < workers*each ||
		top.Entries[0].Count-top.Entries[0].Error > workers*each || top.Total != workers*each+workers*each/10 {
		t.Errorf("top = %+v, want hot with %d", top, workers*each)
	}
}

func TestUnusedTrackerHoldsNothing(t *testing.T) {
	tr := heavyhitters.New(heavyhitters.Config{})
	if e, b := tr.Size(); e != 0 || b != 0 {
		t.Errorf("size %d, %d", e, b)
	}
	if top := tr.TopN(heavyhitters.Rejected, t0, 10); len(top.Entries) != 0 || top.Bound != 0 {
		t.Errorf("top %+v", top)
	}
}

func BenchmarkRecordHotKey(b *testing.B) {
	tr := heavyhitters.New(heavyhitters.Config{})
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tr.Record(heavyhitters.Admitted, "hot", t0)
		}
	})
}

func BenchmarkRecordDistinctKeys(b *testing.B) {
	tr := heavyhitters.New(heavyhitters.Config{})
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = fmt.Sprint("client-", i)
	}
	b.ResetTimer()
	for i := range b.N {
		tr.Record(heavyhitters.Rejected, keys[i&(len(keys)-1)], t0)
	}
}
