package heavyhitters

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"
)

// checkSketch fails unless s's order is sorted by count, descending, in maximal runs of equal
// counts that agree with its entries, its index reaches every entry from its hash's place and
// holds nothing else, and its counts sum to its total.
func checkSketch(t *testing.T, name string, s *sketch, k int) {
	t.Helper()
	if s.index == nil {
		return // never recorded in
	}
	if len(s.order) != len(s.entries) {
		t.Fatalf("%s: %d ordered, %d entries", name, len(s.order), len(s.entries))
	}
	var sum uint64
	used := make(map[int32]bool)
	for p, i := range s.order {
		e := s.entries[i]
		if int(e.pos) != p || e.err >= e.count {
			t.Fatalf("%s: place %d holds entry %d %+v", name, p, i, e)
		}
		if p > 0 && s.entries[s.order[p-1]].count < e.count {
			t.Fatalf("%s: order not descending at %d", name, p)
		}
		r := s.runs[e.run]
		if r.count != e.count || int(r.first) > p || p > int(r.last) {
			t.Fatalf("%s: entry %d (count %d, place %d) in run %+v", name, i, e.count, p, r)
		}
		if p > 0 && (s.entries[s.order[p-1]].run == e.run) != (s.entries[s.order[p-1]].count == e.count) {
			t.Fatalf("%s: runs not maximal at %d", name, p)
		}
		used[e.run] = true
		sum += e.count
		// Found from its hash's place, before any empty place.
		mask := uint64(len(s.index) - 1)
		for j := e.hash & mask; s.index[j].entry != i+1; j = (j + 1) & mask {
			if s.index[j].entry == 0 {
				t.Fatalf("%s: entry %d not reachable in the index", name, i)
			}
		}
	}
	for _, id := range s.free {
		if used[id] {
			t.Fatalf("%s: run %d both used and free", name, id)
		}
	}
	if len(used)+len(s.free) != k {
		t.Fatalf("%s: %d runs used, %d free, of %d", name, len(used), len(s.free), k)
	}
	indexed := 0
	for _, sl := range s.index {
		if sl.entry != 0 {
			indexed++
			if uint32(s.entries[sl.entry-1].hash) != sl.hash {
				t.Fatalf("%s: index names entry %d with another hash", name, sl.entry-1)
			}
		}
	}
	if indexed != len(s.entries) || sum != s.total {
		t.Fatalf("%s: %d indexed, %d entries, counts sum to %d of %d", name, indexed, len(s.entries), sum, s.total)
	}
}

// After any stream, each sketch's order, runs and index agree with its entries.
func TestSketchInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tr := New(Config{Counters: 7, Shards: 2, Buckets: 2, BucketWidth: time.Second})
	at := time.Unix(100, 0)
	for i := range 20000 {
		tr.Record(Direction(i%2), fmt.Sprint(rng.IntN(40)), at.Add(time.Duration(i)*time.Millisecond/10))
		if i%97 == 0 {
			for si := range *tr.sketches.Load() {
				checkSketch(t, fmt.Sprintf("after %d, sketch %d", i, si), &(*tr.sketches.Load())[si], 7)
			}
		}
	}
}

// Keys whose hashes collide, and hashes that share their places in the index, are told apart
// and counted exactly: Space-Saving's result against a reference of the same stream.
func TestSketchCollisions(t *testing.T) {
	const k = 8
	rng := rand.New(rand.NewPCG(5, 6))
	var s sketch
	truth := make(map[string]uint64)
	for i := range 50000 {
		n := rng.IntN(12)
		if i%3 == 0 {
			n = rng.IntN(1000)
		}
		key := fmt.Sprint("k", n)
		// 4 hashes for all keys, of which 2 share their place: collisions everywhere.
		h := uint64(n%4) * 1 << 40
		if n%4 == 3 {
			h = 1<<40 + 1<<41
		}
		h |= uint64(n % 2)
		s.add(1, h, key, k)
		truth[key]++
		if i%101 == 0 {
			checkSketch(t, fmt.Sprint("after ", i), &s, k)
		}
	}
	m := s.min(k)
	for _, e := range s.entries {
		if f := truth[string(e.key)]; e.count < f || e.count-e.err > f || e.err > m {
			t.Errorf("key %s: count %d error %d, true count %d, min %d", e.key, e.count, e.err, f, m)
		}
	}
	for key, f := range truth {
		if f > m && !func() bool {
			for _, e := range s.entries {
				if string(e.key) == key {
					return true
				}
			}
			return false
		}() {
			t.Errorf("key %s counted %d times, over the smallest count %d, not held", key, f, m)
		}
	}
}

func TestSketchFillsWholeCacheLines(t *testing.T) {
	if n := unsafe.Sizeof(sketch{}); n%64 != 0 {
		t.Errorf("a sketch is %d bytes: shards would share cache lines", n)
	}
}
