package heavyhitters

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// After any stream, each sketch is a valid heap whose nodes and positions agree with its
// entries and index, and whose counts sum to its total.
func TestSketchInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tr := New(Config{Counters: 7, Shards: 2, Buckets: 2, BucketWidth: time.Second})
	at := time.Unix(100, 0)
	for i := range 20000 {
		tr.Record(Direction(i%2), fmt.Sprint(rng.IntN(40)), at.Add(time.Duration(i)*time.Millisecond/10))
	}
	for si := range *tr.sketches.Load() {
		s := &(*tr.sketches.Load())[si]
		var sum uint64
		for j := range s.heap {
			if j > 0 && s.heap[j].count < s.heap[(j-1)/2].count {
				t.Fatalf("sketch %d: heap order broken at %d", si, j)
			}
			e := s.entries[s.heap[j].entry]
			if int(s.pos[s.heap[j].entry]) != j || e.count != s.heap[j].count || e.err >= e.count {
				t.Fatalf("sketch %d: node %d disagrees with its entry %+v", si, j, e)
			}
			if s.index[e.hash] != s.heap[j].entry {
				t.Fatalf("sketch %d: index does not name entry %d", si, s.heap[j].entry)
			}
			sum += e.count
		}
		if len(s.index) != len(s.entries) || sum != s.total {
			t.Fatalf("sketch %d: %d indexed, %d entries, counts sum to %d of %d", si, len(s.index), len(s.entries), sum, s.total)
		}
	}
}
