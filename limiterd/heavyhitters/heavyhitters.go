// Package heavyhitters keeps the heaviest keys of a sliding recent period in bounded memory,
// whatever the number of distinct keys: limiterd's answer to "who is being limited right now".
//
// # The sketch
//
// Each sketch is a Space-Saving summary (Metwally, Agrawal and El Abbadi, "Efficient computation
// of frequent and top-k elements in data streams", ICDT 2005) of k counters. A key already
// counted is incremented; a new key takes the counter of the smallest count m, starting at m+1
// with an error of m. Over a stream of N records, every counter's count overestimates its key's
// true count by at most its error, which is at most the sketch's smallest count, at most N/k
// (the k counts sum to N); and every key whose true count exceeds N/k holds a counter.
//
// The sketch is exact Space-Saving, kept as the paper's "stream summary": the counters sorted
// by count in runs of equal counts, found by an open-addressing index of their keys' hashes.
// Counting a key, and replacing the smallest counter with a new key, are O(1) (no heap to sift,
// no map entry to delete and insert): under a flood of new keys, where every record evicts,
// a record costs about what one of a counted key does, plus the key's copy.
//
// # Sliding period and shards
//
// A Tracker keeps, per Direction, a ring of Buckets sketches sets, each for one BucketWidth of
// time (by default 5 of one minute: the period covered is the current minute and the four
// before it). Recording at an instant of a later bucket clears the ring slot it reuses, so
// nothing older than the ring is ever counted and there is nothing to sweep. A ring rather than
// decayed counts because the answer then has a plain meaning ("decisions since 12:04") and an
// exact error bound; exponential decay would blur both.
//
// Each bucket holds Shards sketches. A record takes its key's shard (by the key's hash) with
// TryLock, and when that one is busy another one at random: concurrent decisions, of one hot
// key too, never wait for one another unless every shard is busy, and there is no global lock
// on the hot path. So keys are not strictly partitioned by shard, and a key (a hot one under
// contention) may be counted in several sketches; Top merges them
// (Agarwal et al., "Mergeable summaries", 2012): a key's count is the sum of its counts where
// it is held plus, where it is not, that sketch's smallest count when the sketch is full (the
// most the key can have had there; 0 when not full: an absent key was never recorded there).
// Its error is the sum in the same way of its errors and those smallest counts. So, with N the
// records in the period and k the counters per sketch:
//
//   - each reported count c with error e satisfies c-e <= true count <= c, and e <= N/k
//     (the sum over sketches of N_s/k);
//   - every key whose true count over the period exceeds N/k is reported by TopN with n large
//     enough (it exceeds N_s/k in some sketch, so that sketch holds it).
//
// # Memory
//
// A Tracker holds at most 2 × Buckets × Shards × Counters entries, each with a key of at most
// MaxKeyBytes bytes: keys are copied into buffers the entries own and reuse (a record never
// keeps the caller's string, which may be a slice of a request body, and recording allocates
// nothing once a sketch is full); a longer key is recorded by its first MaxKeyBytes bytes, so
// callers bound keys themselves, as engine.ClientKey does at 1,024 bytes. Besides key bytes, a
// sketch's arrays, allocated once, take 80 bytes per counter (its entry, place and run) and an
// index of 8 bytes a slot, 4k slots when k is a power of two (as by default), fewer than 8k
// otherwise: 112 bytes per counter by default. Its sketches are allocated on the first record,
// so a policy that decides nothing costs a few words.
//
// The package is pure: time is always a parameter.
package heavyhitters

import (
	"cmp"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Direction is what a record counts.
type Direction uint8

// The directions.
const (
	// Admitted counts decisions that let a request through.
	Admitted Direction = iota
	// Rejected counts decisions that refused one.
	Rejected
	directions
)

// String returns the direction's name in the admin API.
func (d Direction) String() string {
	if d == Rejected {
		return "rejected"
	}
	return "admitted"
}

// Defaults of Config.
const (
	DefaultCounters    = 64
	DefaultBuckets     = 5
	DefaultBucketWidth = time.Minute
	DefaultMaxKeyBytes = 1024
	maxDefaultShards   = 16
)

// Config sizes a Tracker. Zero fields take the defaults.
type Config struct {
	// Counters is k, the counters of each sketch (default 64).
	Counters int
	// Buckets is the number of sketches sets in the ring (default 5).
	Buckets int
	// BucketWidth is the time each bucket counts (default one minute).
	BucketWidth time.Duration
	// Shards is the number of sketches of each bucket (default GOMAXPROCS, at most 16).
	Shards int
	// MaxKeyBytes bounds a recorded key (default 1,024).
	MaxKeyBytes int
}

func (c Config) withDefaults() Config {
	if c.Counters <= 0 {
		c.Counters = DefaultCounters
	}
	if c.Buckets <= 0 {
		c.Buckets = DefaultBuckets
	}
	if c.BucketWidth <= 0 {
		c.BucketWidth = DefaultBucketWidth
	}
	if c.Shards <= 0 {
		c.Shards = min(runtime.GOMAXPROCS(0), maxDefaultShards)
	}
	if c.MaxKeyBytes <= 0 {
		c.MaxKeyBytes = DefaultMaxKeyBytes
	}
	return c
}

// MaxEntries is the most entries a Tracker of this configuration holds.
func (c Config) MaxEntries() int {
	c = c.withDefaults()
	return int(directions) * c.Buckets * c.Shards * c.Counters
}

// Tracker keeps the heaviest keys of the recent period, by Direction. It is safe for concurrent
// use.
type Tracker struct {
	cfg      Config
	seed     maphash.Seed
	sketches atomic.Pointer[[]sketch] // [(direction*Buckets + slot)*Shards + shard], allocated on the first Record
	alloc    sync.Mutex
	cur      atomic.Pointer[span]
}

// New returns an empty Tracker.
func New(cfg Config) *Tracker { return &Tracker{cfg: cfg.withDefaults(), seed: maphash.MakeSeed()} }

// Config returns the tracker's configuration, defaults filled in.
func (t *Tracker) Config() Config { return t.cfg }

// bucket returns the number of the bucket of instant now.
func (t *Tracker) bucket(now time.Time) int64 {
	ns := now.UnixNano()
	w := int64(t.cfg.BucketWidth)
	b := ns / w
	if ns%w < 0 {
		b--
	}
	return b
}

// span is the current bucket, so that a record does not divide the time.
type span struct {
	start, end, bucket int64 // [start, end) in Unix nanoseconds
	slot               int
}

// at returns the bucket of instant now and its slot in the ring.
func (t *Tracker) at(now time.Time) (bucket int64, slot int) {
	ns := now.UnixNano()
	if c := t.cur.Load(); c != nil && c.start <= ns && ns < c.end {
		return c.bucket, c.slot
	}
	bucket = t.bucket(now)
	slot = t.slot(bucket)
	start := bucket * int64(t.cfg.BucketWidth)
	t.cur.Store(&span{start: start, end: start + int64(t.cfg.BucketWidth), bucket: bucket, slot: slot})
	return bucket, slot
}

func (t *Tracker) slot(b int64) int {
	s := int(b % int64(t.cfg.Buckets))
	if s < 0 {
		s += t.cfg.Buckets
	}
	return s
}

func (t *Tracker) all() []sketch {
	if p := t.sketches.Load(); p != nil {
		return *p
	}
	t.alloc.Lock()
	defer t.alloc.Unlock()
	if p := t.sketches.Load(); p != nil {
		return *p
	}
	s := make([]sketch, int(directions)*t.cfg.Buckets*t.cfg.Shards)
	t.sketches.Store(&s)
	return s
}

// Record counts one record of key in direction d at instant now. A record older than the
// ring (now before a bucket the ring slot has moved on from) is dropped.
func (t *Tracker) Record(d Direction, key string, now time.Time) {
	if d >= directions {
		return
	}
	if len(key) > t.cfg.MaxKeyBytes {
		key = key[:t.cfg.MaxKeyBytes]
	}
	h := maphash.String(t.seed, key)
	b, slot := t.at(now)
	shards := t.cfg.Shards
	base := (int(d)*t.cfg.Buckets + slot) * shards
	set := t.all()[base : base+shards]
	first := int((h >> 32) * uint64(shards) >> 32) // the key's own shard
	s := &set[first]
	if s.mu.TryLock() {
		s.add(b, h, key, t.cfg.Counters)
		s.mu.Unlock()
		return
	}
	next := first + int(rand.Uint32N(uint32(shards))) // busy: another one, at random
	for i := range shards {
		s := &set[(next+i)%shards]
		if s.mu.TryLock() {
			s.add(b, h, key, t.cfg.Counters)
			s.mu.Unlock()
			return
		}
	}
	s.mu.Lock()
	s.add(b, h, key, t.cfg.Counters)
	s.mu.Unlock()
}

// Entry is one key of a Top.
type Entry struct {
	Key string
	// Count is at least the key's true count over the period, and Count-Error at most it.
	Count uint64
	Error uint64
}

// Top is the heaviest keys of one direction over a period.
type Top struct {
	Direction Direction
	// From and To delimit the period counted: From is the start of the oldest bucket of the
	// ring, To the instant asked at.
	From, To time.Time
	// Total is N, the records counted over the period.
	Total uint64
	// Bound is N/k: no Entry's Error exceeds it, and every key recorded more than Bound times
	// over the period is in the top (for an n large enough).
	Bound uint64
	// Entries are the heaviest keys by Count, descending (ties by key), at most n of them.
	Entries []Entry
}

// TopN returns at most n of the heaviest keys of direction d over the period that ends at now.
func (t *Tracker) TopN(d Direction, now time.Time, n int) Top {
	b := t.bucket(now)
	top := Top{Direction: d, To: now,
		From: time.Unix(0, (b-int64(t.cfg.Buckets)+1)*int64(t.cfg.BucketWidth))}
	p := t.sketches.Load()
	if p == nil || d >= directions || n <= 0 {
		return top
	}
	type acc struct{ count, err int64 }
	merged := make(map[string]*acc)
	var mins int64 // the sum of the smallest counts of the full sketches
	for slot := range t.cfg.Buckets {
		base := (int(d)*t.cfg.Buckets + slot) * t.cfg.Shards
		for i := range t.cfg.Shards {
			s := &(*p)[base+i]
			s.mu.Lock()
			if s.bucket <= b-int64(t.cfg.Buckets) || s.bucket > b || len(s.entries) == 0 {
				s.mu.Unlock()
				continue
			}
			m := int64(s.min(t.cfg.Counters))
			mins += m
			top.Total += s.total
			for _, e := range s.entries {
				a := merged[string(e.key)]
				if a == nil {
					a = &acc{}
					merged[string(e.key)] = a // a copy: the sketch reuses e.key
				}
				a.count += int64(e.count) - m
				a.err += int64(e.err) - m
			}
			s.mu.Unlock()
		}
	}
	top.Bound = top.Total / uint64(t.cfg.Counters)
	entries := make([]Entry, 0, len(merged))
	for k, a := range merged {
		entries = append(entries, Entry{Key: k, Count: uint64(a.count + mins), Error: uint64(a.err + mins)})
	}
	slices.SortFunc(entries, func(x, y Entry) int {
		if c := cmp.Compare(y.Count, x.Count); c != 0 {
			return c
		}
		return strings.Compare(x.Key, y.Key)
	})
	if len(entries) > n {
		entries = slices.Clip(entries[:n])
	}
	top.Entries = entries
	return top
}

// Size returns the entries the tracker holds and the bytes it keeps for keys (its key
// buffers' capacities, counting those of entries a bucket's reset left unused): at most
// Config.MaxEntries entries and MaxEntries × MaxKeyBytes bytes.
func (t *Tracker) Size() (entries, keyBytes int) {
	p := t.sketches.Load()
	if p == nil {
		return 0, 0
	}
	for i := range *p {
		s := &(*p)[i]
		s.mu.Lock()
		entries += len(s.entries)
		for _, e := range s.entries[:cap(s.entries)] {
			keyBytes += cap(e.key)
		}
		s.mu.Unlock()
	}
	return entries, keyBytes
}

// sketch is one Space-Saving summary of one bucket, kept as the original paper's "stream
// summary": its counters sorted by count, in runs of equal counts, so that counting a key and
// replacing the smallest counter are both O(1) (a run's first counter swaps places with the one
// counted, which joins the run before or starts one), where a heap would sift. Its index is
// open addressing over the keys' hashes (maphash, of a seed of the Tracker's: callers cannot
// choose colliding keys); a hash is compared first and a key's bytes only on a match, so keys
// whose hashes collide are still told apart. An evicted key's bytes are reused by the key that
// replaces it: recording allocates nothing once the sketch is full.
type sketch struct {
	mu      sync.Mutex
	bucket  int64    // the bucket counted
	total   uint64   // the records counted, N
	entries []entry  // the counters, in no order; those past len keep their key buffers
	order   []int32  // the entries by count, descending: order[entries[i].pos] == i
	runs    []run    // the runs of equal counts in order, by id
	free    []int32  // the ids of the unused runs
	index   []slot   // open addressing, linear probing; a power of two at least 4k: short probes
	_       [48]byte // a sketch fills three cache lines: shards do not share theirs
}

type entry struct {
	key        []byte // reused by the next key of the counter
	hash       uint64
	count, err uint64
	pos, run   int32 // its place in order, and the id of its run
}

// run is the places [first, last] of order, whose entries all have count.
type run struct {
	count       uint64
	first, last int32
}

// slot is one place of the index: the low half of an entry's hash (its place in the index and
// a filter before comparing keys), and the entry plus one (0: empty).
type slot struct {
	hash  uint32
	entry int32
}

// setKey makes e's key a copy of key, reusing its buffer when it is large enough.
func (e *entry) setKey(key string, hash uint64) {
	if cap(e.key) < len(key) {
		e.key = make([]byte, 0, len(key))
	}
	e.key, e.hash = append(e.key[:0], key...), hash
}

// add counts key, of hash h, in bucket b on a sketch of k counters.
func (s *sketch) add(b int64, h uint64, key string, k int) {
	if s.index != nil && b < s.bucket {
		return // older than the ring: dropped
	}
	if s.index == nil || b != s.bucket {
		s.reset(b, k)
	}
	s.total++
	mask := uint64(len(s.index) - 1)
	for j := h & mask; ; j = (j + 1) & mask {
		e := s.index[j].entry
		if e == 0 {
			break
		}
		if s.index[j].hash == uint32(h) && string(s.entries[e-1].key) == key {
			s.incr(e - 1)
			return
		}
	}
	if n := len(s.entries); n < k {
		s.entries = s.entries[:n+1]
		e := &s.entries[n]
		e.setKey(key, h)
		e.count, e.err, e.pos = 1, 0, int32(n)
		s.order = append(s.order, int32(n))
		if r := n - 1; r >= 0 && s.runs[s.entries[s.order[r]].run].count == 1 {
			e.run = s.entries[s.order[r]].run // all counts are at least 1: the last run is 1's
			s.runs[e.run].last = int32(n)
		} else {
			e.run = s.newRun(1, int32(n))
		}
		s.insert(h, int32(n))
		return
	}
	i := s.order[len(s.order)-1] // the smallest count
	e := &s.entries[i]
	s.remove(e.hash, i)
	e.setKey(key, h)
	e.err = e.count
	s.insert(h, i)
	s.incr(i)
}

// incr adds one to the count of entry i, keeping order sorted.
func (s *sketch) incr(i int32) {
	e := &s.entries[i]
	id := e.run
	r := &s.runs[id]
	f := r.first
	if p := e.pos; p != f { // i takes the place of its run's first, which takes its place
		o := s.order[f]
		s.order[f], s.order[p] = i, o
		s.entries[o].pos, e.pos = p, f
	}
	e.count++
	if f > 0 {
		if prev := s.entries[s.order[f-1]].run; s.runs[prev].count == e.count {
			s.runs[prev].last = f // i joins the run before
			e.run = prev
			if r.first++; r.first > r.last {
				s.free = append(s.free, id)
			}
			return
		}
	}
	if r.first == r.last {
		r.count++ // i was its run's only entry: the run is now of the count after
		return
	}
	r.first++
	e.run = s.newRun(e.count, f)
}

func (s *sketch) newRun(count uint64, at int32) int32 {
	id := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.runs[id] = run{count: count, first: at, last: at}
	return id
}

// min returns the smallest count when the sketch holds k counters, and 0 when fewer: a key
// it does not hold was then never recorded in it.
func (s *sketch) min(k int) uint64 {
	if len(s.entries) < k {
		return 0
	}
	return s.entries[s.order[len(s.order)-1]].count
}

// insert indexes entry i by hash h.
func (s *sketch) insert(h uint64, i int32) {
	mask := uint64(len(s.index) - 1)
	j := h & mask
	for s.index[j].entry != 0 {
		j = (j + 1) & mask
	}
	s.index[j] = slot{hash: uint32(h), entry: i + 1}
}

// remove unindexes entry i, of hash h, moving back the entries probed past it so that every
// entry stays reachable from its hash's place with no empty place between.
func (s *sketch) remove(h uint64, i int32) {
	mask := uint64(len(s.index) - 1)
	j := h & mask
	for s.index[j].entry != i+1 {
		j = (j + 1) & mask
	}
	for {
		s.index[j] = slot{}
		k := j
		for {
			k = (k + 1) & mask
			if s.index[k].entry == 0 {
				return
			}
			// The entry at k moves to j if j lies on its probe path, from its place to k.
			if (k-uint64(s.index[k].hash))&mask >= (k-j)&mask {
				break
			}
		}
		s.index[j] = s.index[k]
		j = k
	}
}

func (s *sketch) reset(b int64, k int) {
	s.bucket, s.total = b, 0
	if s.index == nil {
		n := 1
		for n < 4*k {
			n *= 2
		}
		s.index = make([]slot, n)
		s.entries = make([]entry, 0, k)
		s.order = make([]int32, 0, k)
		s.runs = make([]run, k)
		s.free = make([]int32, 0, k)
	}
	clear(s.index)
	s.entries, s.order, s.free = s.entries[:0], s.order[:0], s.free[:0]
	for id := k - 1; id >= 0; id-- {
		s.free = append(s.free, int32(id))
	}
}
