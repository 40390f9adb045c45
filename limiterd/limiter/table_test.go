package limiter

import (
	"fmt"
	"hash/maphash"
	"testing"

	"github.com/limiterd/limiterd/internal/testsupport/testseed"
)

// TestBucketTableMatchesMap drives the table and a map with the same random inserts, updates
// and removals and checks they agree after every step.
func TestBucketTableMatchesMap(t *testing.T) {
	rng := testseed.Rand(t, 6)
	tbl := bucketTable{seed: maphash.MakeSeed()}
	ref := map[string]int64{}
	for step := 0; step < 50_000; step++ {
		key := fmt.Sprintf("k%d", rng.IntN(2000))
		h := tbl.hash(key)
		i, ok := tbl.find(key, h)
		if _, want := ref[key]; ok != want {
			t.Fatalf("step %d: find(%q) = %v, map has it: %v", step, key, ok, want)
		}
		switch {
		case ok && rng.IntN(2) == 0:
			tbl.remove(i)
			delete(ref, key)
		case ok:
			tbl.slots[i].state.tat = int64(step)
			ref[key] = int64(step)
		default:
			tbl.insert(key, h, bucketState{tat: int64(step)})
			ref[key] = int64(step)
		}
		if tbl.n != len(ref) {
			t.Fatalf("step %d: table holds %d, map %d", step, tbl.n, len(ref))
		}
	}
	for key, tat := range ref {
		i, ok := tbl.find(key, tbl.hash(key))
		if !ok || tbl.slots[i].state.tat != tat {
			t.Fatalf("%q: found %v, tat %d, want %d", key, ok, tbl.slots[i].state.tat, tat)
		}
	}
}

// TestTagsTellKeysOfAShardApart: the keys of one Memory shard must get different tags, or every
// probe of a run compares strings. Before, the tag was the byte that chose the shard: one tag
// for every key of a shard.
func TestTagsTellKeysOfAShardApart(t *testing.T) {
	m := NewMemory(nil)
	first, _ := m.shard("k0", true)
	tags := map[uint8]bool{}
	keys := 0
	for i := 0; keys < 1000; i++ {
		key := fmt.Sprint("k", i)
		if sh, h := m.shard(key, true); sh == first {
			tags[tag(h)] = true
			keys++
		}
	}
	if len(tags) < 100 { // of 128
		t.Fatalf("%d keys of one shard share %d tags", keys, len(tags))
	}
}
