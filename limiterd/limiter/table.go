package limiter

import (
	"hash/maphash"
	"math/bits"
)

// bucketTable is an open-addressing hash table (linear probing, backward-shift deletion) from
// client key to token-bucket state, used by one Memory shard.
//
// It exists for memory and speed, the two things a registry of a million clients is judged on:
// a slot is the key's string header and the 16-byte state (32 bytes, plus a one-byte tag), the
// table grows by half (so its load stays between 0.6 and 0.9 rather than a power of two's 0.44
// to 0.875), and a decision finds and updates the state in place with one probe sequence.
// It is not safe for concurrent use; the shard's lock guards it.
type bucketTable struct {
	seed  maphash.Seed
	tags  []uint8 // 0: empty slot; else 0x80 | 7 bits of the key's hash
	slots []bucketSlot
	n     int // occupied slots
}

type bucketSlot struct {
	key   string
	state bucketState
}

const (
	tableMinSize = 8
	tableMaxLoad = 9 // tenths
)

func (t *bucketTable) hash(key string) uint64 { return tableHash(maphash.String(t.seed, key)) }

// tableHash turns a key's maphash into the hash a table probes with: its top byte chose the
// Memory shard, so it moves to the bottom, out of the way of the slot selection.
func tableHash(h uint64) uint64 { return bits.RotateLeft64(h, 8) }

// home returns the slot a hash probes first (fast range reduction: no power-of-two size needed).
func (t *bucketTable) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(t.slots)))
	return int(hi)
}

// tag returns the byte a slot keeps to skip most string compares: 7 bits of the hash that
// neither chose the key's shard (the low byte, after tableHash) nor weigh much in its home slot
// (the high bits).
func tag(h uint64) uint8 { return 0x80 | uint8(h>>8) }

// find returns the slot holding key, or the empty slot where it would be inserted and false.
func (t *bucketTable) find(key string, h uint64) (int, bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	want := tag(h)
	for i := t.home(h); ; {
		switch t.tags[i] {
		case 0:
			return i, false
		case want:
			if t.slots[i].key == key {
				return i, true
			}
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// insert adds key, which is not in the table, and returns its slot.
func (t *bucketTable) insert(key string, h uint64, s bucketState) int {
	if (t.n+1)*10 > len(t.slots)*tableMaxLoad {
		t.grow()
	}
	i, _ := t.find(key, h)
	t.tags[i], t.slots[i] = tag(h), bucketSlot{key: key, state: s}
	t.n++
	return i
}

func (t *bucketTable) grow() {
	old, oldTags := t.slots, t.tags
	size := max(tableMinSize, len(old)+len(old)/2)
	t.slots, t.tags = make([]bucketSlot, size), make([]uint8, size)
	for i := range old {
		if oldTags[i] != 0 {
			h := t.hash(old[i].key)
			j, _ := t.find(old[i].key, h)
			t.tags[j], t.slots[j] = oldTags[i], old[i]
		}
	}
}

// remove empties slot i, shifting back the entries of its probe run that may move into the gap.
func (t *bucketTable) remove(i int) {
	for j := i; ; {
		if j++; j == len(t.slots) {
			j = 0
		}
		if t.tags[j] == 0 {
			break
		}
		home := t.home(t.hash(t.slots[j].key))
		// Entry j may fill gap i if i lies cyclically within [home, j).
		if (j-home+len(t.slots))%len(t.slots) >= (j-i+len(t.slots))%len(t.slots) {
			t.tags[i], t.slots[i] = t.tags[j], t.slots[j]
			i = j
		}
	}
	t.tags[i], t.slots[i] = 0, bucketSlot{}
	t.n--
}
