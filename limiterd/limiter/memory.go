package limiter

import (
	"context"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// memoryShards is the number of independently locked parts of a Memory store: enough that
// decisions on different keys rarely wait for each other on any machine limiterd runs on.
const memoryShards = 256

// The bytes a client's state is accounted for, besides its key (copied on insertion, so that it
// never holds a larger buffer alive): a token-bucket client's 33-byte table slot at the table's
// load (0.6 to 0.9); a sliding-window or concurrency client's map entry, State and log header,
// plus 16 bytes an entry of its log's capacity (24 of its leases').
const (
	bucketClientBytes = 48
	windowClientBytes = 128
)

func bucketBytes(key string) int64 { return int64(len(key)) + bucketClientBytes }

func windowBytes(key string, s *State) int64 {
	return int64(len(key)) + windowClientBytes + logBytes(s)
}

func logBytes(s *State) int64 {
	switch {
	case s.log != nil:
		return 16 * int64(cap(s.log.entries))
	case s.leases != nil:
		return 24 * int64(cap(s.leases.entries))
	}
	return 0
}

// evictionSample is how many tracked clients an insertion into a full store looks at to pick the
// one to evict.
const evictionSample = 8

// Budget bounds the clients tracked by a set of Memory stores (one per policy) and counts what
// happens to them. It is safe for concurrent use. Its zero value tracks any number of clients.
//
// When a new client takes the budget over its bound, one client is evicted from the store
// holding the largest share of the budget (see Memory): a flood of distinct keys on one policy
// evicts that policy's clients, not those of a policy holding less than an equal share.
//
// The bound holds once each decision has returned. A new client is inserted before the
// evictions it requires, which happen after its shard's lock is released, so meanwhile the
// budget may be over its bound by at most one client per decision in flight.
type Budget struct {
	max       int64 // clients; 0: unbounded
	maxBytes  int64 // bytes of client state (see Memory); 0: unbounded
	tracked   atomic.Int64
	bytes     atomic.Int64
	evictions atomic.Int64 // evictions that lost usage (state that was not fresh)
	dropped   atomic.Int64 // fresh states dropped (idle clients, or evicted while fresh)

	mu      sync.Mutex
	stores  map[*Memory]struct{} // the open stores counting against the budget
	nStores atomic.Int64
	largest atomic.Pointer[Memory] // the store evictions come from, refreshed lazily
}

// NewBudget returns a budget of at most maxClients tracked clients and maxBytes bytes of their
// state, keys included (0: unbounded).
func NewBudget(maxClients, maxBytes int64) *Budget {
	return &Budget{max: maxClients, maxBytes: maxBytes}
}

// Tracked returns the number of clients whose state is kept.
func (b *Budget) Tracked() int64 { return b.tracked.Load() }

// Bytes returns the memory the tracked clients' state takes, keys included, as Memory accounts it.
func (b *Budget) Bytes() int64 { return b.bytes.Load() }

// Evictions returns how many clients were evicted, to respect the bound, while their state still
// held usage: each such eviction may have admitted that client more than its limit.
func (b *Budget) Evictions() int64 { return b.evictions.Load() }

// Dropped returns how many fresh (idle) client states were dropped. Dropping them changes no
// decision.
func (b *Budget) Dropped() int64 { return b.dropped.Load() }

func (b *Budget) over() bool {
	return b.max > 0 && b.tracked.Load() > b.max || b.maxBytes > 0 && b.bytes.Load() > b.maxBytes
}

// size is how much of the budget a store holds: its bytes when bytes are bounded, else its
// clients. total is the same measure over every store.
func (b *Budget) size(m *Memory) int64 {
	if b.maxBytes > 0 {
		return m.bytes.Load()
	}
	return m.clients.Load()
}

func (b *Budget) total() int64 {
	if b.maxBytes > 0 {
		return b.bytes.Load()
	}
	return b.tracked.Load()
}

func (b *Budget) register(m *Memory) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stores == nil {
		b.stores = make(map[*Memory]struct{})
	}
	b.stores[m] = struct{}{}
	b.nStores.Store(int64(len(b.stores)))
}

func (b *Budget) unregister(m *Memory) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.stores, m)
	b.nStores.Store(int64(len(b.stores)))
	b.largest.CompareAndSwap(m, nil)
}

// reclaim evicts clients until the budget is within its bound; from is the store whose client
// just took it over. With a bound in clients that is one eviction per new client; with a bound
// in bytes, a client with a long key may take several clients with short keys.
func (b *Budget) reclaim(from *Memory, now time.Time) {
	for b.over() {
		v := b.victim(from)
		if v == nil || !v.evictOne(now) {
			return // every store is empty or closing: the bound is exceeded by in-flight inserts only
		}
	}
}

// victim returns the store to evict from: the one holding the most clients (or bytes, when
// bytes are bounded) as far as the budget knows. It is tracked lazily: a store that admits a client while holding more than the current
// victim becomes the victim, and a victim holding less than an equal share of the tracked clients
// (because others grew or it shrank) is replaced by the largest store, found by a scan. So the
// victim always holds at least an equal share, and a store holding less never loses a client to
// another's new one.
func (b *Budget) victim(from *Memory) *Memory {
	v := b.largest.Load()
	if v == nil || v.closed.Load() || b.size(from) > b.size(v) {
		v = from
	}
	if b.size(v)*b.nStores.Load() < b.total() {
		v = b.scanLargest()
	}
	b.largest.Store(v)
	return v
}

func (b *Budget) scanLargest() *Memory {
	b.mu.Lock()
	defer b.mu.Unlock()
	var largest *Memory
	for m := range b.stores {
		if largest == nil || b.size(m) > b.size(largest) {
			largest = m
		}
	}
	return largest
}

// Memory keeps per-client state in process memory: the registry of one policy's clients.
// A client's state is created on its first decision, lives only in the shard its key hashes to,
// and a decision touches that one client's state under that shard's lock, never any other
// client's (O(1), no scan). Token-bucket and quota clients live in the shard's open-addressing
// table (see bucketTable), sliding-window and concurrency clients in the shard's map.
//
// Token-bucket clients cost a 32-byte slot (key header and state) plus their key; sliding-window
// clients cost a map entry, a State and their log, concurrency clients a map entry, a State and
// their leases. Unlimited clients cost nothing.
//
// Memory bounds: a client whose state has decayed to fresh is dropped by Sweep. When a new client
// takes the Budget over its bound, one client is evicted from the store holding the largest
// share of the budget (this one, or another policy's): the sampled client closest to fresh
// (evictionSample candidates from a random point of one shard, so no scan). Evicting a client
// that still had usage lets it start again with a full allowance: under a flood of distinct keys
// that bounds memory at the price of over-admitting evicted clients of the flooded policy, which
// Budget.Evictions counts. Size the budget so that it only happens under attack.
//
// A store counts against its budget until Close, which forgets every client.
//
// Memory is safe for concurrent use; N goroutines racing on one key admit exactly what a serial
// run would.
type Memory struct {
	budget  *Budget
	seed    maphash.Seed
	clients atomic.Int64  // clients tracked by this store
	bytes   atomic.Int64  // their state's bytes, as accounted by bucketBytes and windowBytes
	closed  atomic.Bool   // set by Close: new clients are decided on but not kept
	next    atomic.Uint64 // rotates the shard evictions start from
	// shards is allocated by the first decision (about 32 KB), so that a policy that never
	// decides, or whose tiers are all Unlimited, costs a few hundred bytes.
	shards atomic.Pointer[[memoryShards]memoryShard]
	// refunds records the refunds made by Refund until they expire (and the grace).
	refunds refundRecords
	// resets marks the clients reset while they had state that could back a reservation.
	resets resetMarks
}

type memoryShard struct {
	shardState
	// Pad shards to 128 bytes (two cache lines, the unit adjacent-line prefetchers fetch), so
	// cores deciding on neighbouring shards do not write to one line.
	_ [128 - unsafe.Sizeof(shardState{})%128]byte
}

type shardState struct {
	sync.Mutex
	buckets bucketTable       // token-bucket clients
	windows map[string]*State // sliding-window and concurrency clients
	writers []writer          // the strategies that wrote the token-bucket states
}

// bucketState is the compact form of a token bucket's State: instead of a reference to the
// strategy that wrote it, it holds that strategy's place among its shard's writers, so that a
// slot stays 32 bytes and free of a second pointer.
type bucketState struct {
	tat  int64
	frac uint32
	by   uint32 // 1 + the index of the strategy in the shard's writers; 0: fresh
}

// writer is the stamp of a strategy that wrote token-bucket states of a shard, and how many of
// the shard's states it wrote. The shard references it for them, so that the strategy stays in
// use, and drops it with the last of them: a shard holds the strategies its clients need,
// however many were ever used.
type writer struct {
	stamp  *stamp
	states int
}

// unpack returns the State that b is the compact form of.
func (sh *shardState) unpack(b bucketState) State {
	s := State{tat: b.tat, frac: b.frac}
	if b.by != 0 {
		s.stamp = sh.writers[b.by-1].stamp
	}
	return s
}

// pack returns the compact form of s, the new state of a slot whose previous state, written by
// writer prev (0: a new slot, or a fresh state), unpacked to a State written by was. It counts
// the change of writer, if any.
func (sh *shardState) pack(s *State, was *stamp, prev uint32) bucketState {
	if s.stamp == was {
		return bucketState{tat: s.tat, frac: s.frac, by: prev} // the common case: the same writer
	}
	return sh.packNewWriter(s, prev)
}

// packNewWriter is pack for a state whose writer changed.
func (sh *shardState) packNewWriter(s *State, prev uint32) bucketState {
	by := sh.retain(s.stamp)
	sh.release(prev)
	return bucketState{tat: s.tat, frac: s.frac, by: by}
}

// retain counts one more state stamped st (nil: fresh), and returns the place of its writer.
func (sh *shardState) retain(st *stamp) uint32 {
	if st == nil {
		return 0
	}
	free := -1
	for i := range sh.writers {
		switch w := &sh.writers[i]; w.stamp {
		case st:
			w.states++
			return uint32(i + 1)
		case nil:
			if free < 0 {
				free = i
			}
		}
	}
	if free < 0 {
		sh.writers = append(sh.writers, writer{})
		free = len(sh.writers) - 1
	}
	sh.writers[free] = writer{stamp: st, states: 1}
	return uint32(free + 1)
}

// release counts one state fewer for writer by (0: none), dropping the writer with its last.
func (sh *shardState) release(by uint32) {
	if by == 0 {
		return
	}
	w := &sh.writers[by-1]
	if w.states--; w.states > 0 {
		return
	}
	*w = writer{}
	n := len(sh.writers)
	for n > 0 && sh.writers[n-1].stamp == nil {
		n--
	}
	if n == 0 {
		sh.writers = nil // let the array go: a shard with no clients costs nothing
		return
	}
	sh.writers = sh.writers[:n] // the writers cut off are all empty
}

// NewMemory returns an empty store whose clients count against budget (nil: unbounded) until
// Close.
func NewMemory(budget *Budget) *Memory {
	if budget == nil {
		budget = &Budget{}
	}
	m := &Memory{budget: budget, seed: maphash.MakeSeed()}
	budget.register(m)
	return m
}

// shard returns the shard of a key and the key's hash as its bucketTable computes it. Before the
// store's first decision it returns a nil shard, unless create is set.
func (m *Memory) shard(key string, create bool) (*memoryShard, uint64) {
	shards := m.shards.Load()
	if shards == nil {
		if !create {
			return nil, 0
		}
		shards = m.createShards()
	}
	h := maphash.String(m.seed, key)
	return &shards[h>>56], tableHash(h) // memoryShards is 256: the top byte picks the shard
}

func (m *Memory) createShards() *[memoryShards]memoryShard {
	shards := new([memoryShards]memoryShard)
	for i := range shards {
		shards[i].buckets.seed = m.seed
	}
	if m.shards.CompareAndSwap(nil, shards) {
		return shards
	}
	return m.shards.Load()
}

// Decide implements Store: every limit's state is read, decided and written, or restored, under
// the shard lock of the client key. It fails only on a negative cost (ErrInvalidCost).
func (m *Memory) Decide(_ context.Context, key string, st *Stack, now time.Time, cost int64, out []Decision) (Decision, error) {
	o := opDecide
	if cost <= 0 { // one comparison on the common path
		if cost < 0 {
			return Decision{}, ErrInvalidCost
		}
		o, cost = opPeek, 1
	}
	if !inSeconds(now) { // the common case inlined: no call
		now = ClampInstant(now)
	}
	var (
		d     Decision
		added bool
	)
	if rl := st.one; rl != nil { // the common case: a call less, and no stack's working space
		d, added = m.applyOne(key, rl, now, cost, o)
		if out != nil {
			out[0] = d
		}
	} else {
		d, added = m.applyStacked(key, st, now, cost, o, out)
	}
	if added && m.budget.over() {
		m.budget.reclaim(m, now)
	}
	return d, nil
}

// DecideBatch implements Store: it decides every request in turn, in one pass over the store,
// exactly as successive Decide calls would: a request fails only on a negative cost.
func (m *Memory) DecideBatch(ctx context.Context, reqs []Request, now time.Time, out []Answer) {
	for i := range reqs {
		r := &reqs[i]
		d, err := m.Decide(ctx, r.Key, r.Stack, now, r.Cost, r.Limits)
		out[i] = Answer{Decision: d, Err: err}
	}
}

// applyStacked applies o to every limit of st for key, a stack that is not Decide's fast case
// (Stack.one, decided by applyOne), writing each limit's decision to out unless nil, and returns
// the stack's decision; added reports that the store's bytes grew (new clients, grown logs).
//
// The working space is zeroed on every decision (some 240 bytes a limit), so it is sized to the
// stack: a stack of two limits, the common one, zeroes two, not MaxStack; and the decisions'
// array is zeroed only when the caller passes none.
func (m *Memory) applyStacked(key string, st *Stack, now time.Time, cost int64, o op, out []Decision) (d Decision, added bool) {
	n := st.Len()
	if out == nil {
		var own [MaxStack]Decision
		out = own[:n]
	}
	switch n {
	case 1: // a sliding window, a concurrency limit, or a limit not named DefaultLimitName
		var limits [1]stackLimit
		added = m.applyStack(key, st, now, cost, o, limits[:], out, nil)
		return out[0], added
	case 2:
		var limits [2]stackLimit
		added = m.applyStack(key, st, now, cost, o, limits[:], out, nil)
	case 3:
		var limits [3]stackLimit
		added = m.applyStack(key, st, now, cost, o, limits[:], out, nil)
	default:
		var limits [MaxStack]stackLimit
		added = m.applyStack(key, st, now, cost, o, limits[:], out, nil)
	}
	d, _ = Combine(out[:n])
	return d, added
}

// applyOne is applyStack for a stack of one limit named DefaultLimitName whose state is compact
// (a token bucket or a quota: Stack.one), without a stack's working space, which made the stack path take
// 36% longer on BenchmarkHotKey's Memory.Decide (92.8 ns against 68.4 ns). It keeps applyStack's rules: a rejection writes nothing, an admission
// replaces another algorithm's state. TestApplyOneMatchesStack holds the two to one answer.
func (m *Memory) applyOne(key string, rl RateLimiter, now time.Time, cost int64, o op) (d Decision, added bool) {
	key = storedKey(key)
	sh, h := m.shard(key, o == opDecide)
	if sh == nil { // the store never decided: the client is fresh
		return peek(rl, &State{}, now), false
	}
	sh.Lock()
	defer sh.Unlock()
	i, tracked := sh.buckets.find(key, h)
	var (
		s    State
		prev uint32 // the slot's writer
	)
	if tracked {
		prev = sh.buckets.slots[i].state.by
		s = sh.unpack(sh.buckets.slots[i].state)
	} else if w, ok := sh.windows[key]; ok {
		s = *w // another algorithm's state: converted (its usage charged) by the decision
	}
	switch {
	case o == opPeek, o == opRefund && !tracked: // nothing to refund
		return peek(rl, &s, now), false
	case o == opRefund:
		was := s.stamp
		d = refund(rl, &s, now, cost, nil) // Memory.Refund takes applyStack's path
		sh.buckets.slots[i].state = sh.pack(&s, was, prev)
		return d, false
	}
	was := s.stamp
	if tb, ok := rl.(*TokenBucket); ok { // the most common: a direct call, no interface dispatch (too large to inline)
		d = tb.Decide(&s, now, cost)
	} else {
		d = decide(rl, &s, now, cost)
	}
	if !d.Allowed {
		return d, false
	}
	if tracked {
		sh.buckets.slots[i].state = sh.pack(&s, was, prev)
		return d, false
	}
	if _, ok := sh.windows[key]; ok {
		forgetWindow(m, sh, key, now) // the limit changed algorithm: its usage was carried over
	}
	return d, m.keepBucket(sh, key, h, &s)
}

// compact reports whether rl keeps a client's state in the bucket table (two integers).
func compact(rl RateLimiter) bool {
	switch rl.Algorithm() {
	case AlgorithmTokenBucket, AlgorithmQuota:
		return true
	case AlgorithmSlidingWindow, AlgorithmConcurrency, AlgorithmUnlimited:
	}
	return false
}

// op is what applyStack does to a client's state.
type op uint8

const (
	opDecide op = iota // decide cost units
	opPeek             // read only
	opRefund           // refund cost units; a client not tracked has nothing to refund
	// (Memory.Refund takes applyStack's path, which checks the refund's gate: applyOne, the
	// decisions' fast path, has none, and refunds through it only in tests.)
)

// Reset implements Store: it forgets the client's state under every limit name, those of the
// loaded policy and those a policy edit removed alike. A client's limits all live in the shard of
// its stored key, so Reset visits that shard's clients (O(clients/256) under its lock: a reset is
// an admin operation, rare, and a shard's scan takes microseconds at a million clients) and
// forgets each state whose key is a stack key of the client (isStackKeyOf: exactly those, however
// the client's key and its neighbours' are crafted). In the same step it marks the client reset
// at now, while a state it forgot had units to refill (resetMarks), so that Refund voids the
// charges made before (ErrReset). It never fails.
func (m *Memory) Reset(_ context.Context, key string, now time.Time) error {
	now = ClampInstant(now)
	key = storedKey(key)
	sh, h := m.shard(key, false)
	if sh == nil {
		return nil
	}
	sh.Lock()
	defer sh.Unlock()
	var left time.Duration // the longest any forgotten state had left to refill
	forgot := func(s *State) {
		if s.stamp != nil {
			left = max(left, s.stamp.rl.Peek(s, now).ResetAfter)
		}
	}
	if i, ok := sh.buckets.find(key, h); ok {
		s := sh.unpack(sh.buckets.slots[i].state)
		forgot(&s)
		forgetBucket(m, sh, i)
	}
	if w, ok := sh.windows[key]; ok {
		forgot(w)
		forgetWindow(m, sh, key, now)
	}
	for t, i := &sh.buckets, 0; i < len(t.slots); {
		if t.tags[i] != 0 && isStackKeyOf(t.slots[i].key, key) {
			s := sh.unpack(t.slots[i].state)
			forgot(&s)
			forgetBucket(m, sh, i)
			continue // remove may have shifted an unvisited entry into slot i (see Sweep)
		}
		i++
	}
	for k, w := range sh.windows {
		if isStackKeyOf(k, key) {
			forgot(w)
			forgetWindow(m, sh, k, now)
		}
	}
	if left > 0 {
		m.resets.mark(key, now, now.Add(left))
	}
	return nil
}

// Close forgets every client and takes them out of the budget, for good: a decision still in
// flight (a request that raced with the removal of the store's policy) is answered as for a new
// client but keeps no state. Call it once no decision is routed to the store any more.
func (m *Memory) Close() {
	if m.closed.Swap(true) {
		return
	}
	m.budget.unregister(m)
	shards := m.shards.Load()
	if shards == nil {
		return
	}
	for i := range shards {
		sh := &shards[i]
		sh.Lock()
		n, bytes := int64(sh.buckets.n+len(sh.windows)), int64(0)
		for i, tag := range sh.buckets.tags {
			if tag != 0 {
				bytes += bucketBytes(sh.buckets.slots[i].key)
			}
		}
		for key, s := range sh.windows {
			bytes += windowBytes(key, s)
			if l := leasesOf(s); l != nil {
				l.drop(math.MinInt64) // they end with the store, none as expired
			}
		}
		sh.buckets = bucketTable{seed: m.seed}
		sh.writers = nil
		clear(sh.windows)
		m.account(-n, -bytes)
		sh.Unlock()
	}
}

// keepBucket starts keeping the state s of a new token-bucket client of a shard (h: the key's
// table hash), unless the store is closed; it reports whether it did.
func (m *Memory) keepBucket(sh *memoryShard, key string, h uint64, s *State) bool {
	if !m.admit(bucketBytes(key)) {
		return false
	}
	sh.buckets.insert(strings.Clone(key), h, sh.pack(s, nil, 0))
	return true
}

// keepWindow starts keeping the state s of a new sliding-window or concurrency client of a
// shard, unless the store is closed; it reports whether it did.
func (m *Memory) keepWindow(sh *memoryShard, key string, s *State) bool {
	if !m.admit(windowBytes(key, s)) {
		return false
	}
	if sh.windows == nil {
		sh.windows = make(map[string]*State)
	}
	sh.windows[strings.Clone(key)] = s
	return true
}

// accountLogGrowth accounts for a kept sliding window's log or concurrency limit's leases having
// changed from before bytes,
// like a new client's bytes; it reports whether the store's bytes grew.
func (m *Memory) accountLogGrowth(s *State, before int64) bool {
	grown := logBytes(s) - before
	if grown != 0 {
		m.account(0, grown)
	}
	return grown > 0
}

// forgetBucket deletes the token-bucket client in slot i of a shard.
func forgetBucket(m *Memory, sh *memoryShard, i int) {
	bytes := bucketBytes(sh.buckets.slots[i].key)
	sh.release(sh.buckets.slots[i].state.by)
	sh.buckets.remove(i)
	m.account(-1, -bytes)
}

// forgetWindow deletes a sliding-window or concurrency client of a shard at now, ending its
// leases (LeaseStats).
func forgetWindow(m *Memory, sh *memoryShard, key string, now time.Time) {
	s := sh.windows[key]
	if l := leasesOf(s); l != nil {
		l.drop(now.UnixNano())
	}
	bytes := windowBytes(key, s)
	delete(sh.windows, key)
	m.account(-1, -bytes)
}

// account adds to the clients and bytes of the store and of its budget.
func (m *Memory) account(clients, bytes int64) {
	m.clients.Add(clients)
	m.budget.tracked.Add(clients)
	m.bytes.Add(bytes)
	m.budget.bytes.Add(bytes)
}

// admit counts a new client of the given bytes, under its shard's lock, unless the store is
// closed. The caller reclaims memory, if the budget is over its bound, once it has released the
// lock.
func (m *Memory) admit(bytes int64) bool {
	if m.closed.Load() {
		return false
	}
	m.account(1, bytes)
	return true
}

// evictOne drops the sampled client of this store whose state is closest to fresh: it samples
// evictionSample clients from the shards after a rotating starting point, dropping the first fresh
// one it meets, else the closest to fresh in the last shard it sampled. It reports whether it
// dropped a client.
func (m *Memory) evictOne(now time.Time) bool {
	shards := m.shards.Load()
	if shards == nil {
		return false
	}
	start := int(m.next.Add(1) * 167) // 167 is prime to 256: consecutive evictions visit every shard
	seen, last := 0, -1
	for n := 0; n < memoryShards && seen < evictionSample && m.clients.Load() > 0; n++ {
		i := (start + n) % memoryShards
		sh := &shards[i]
		sh.Lock()
		k, evicted := m.evict(sh, now, true)
		sh.Unlock()
		if evicted {
			return true
		}
		if k > 0 {
			seen, last = seen+k, i
		}
	}
	if last < 0 {
		return false
	}
	sh := &shards[last]
	sh.Lock()
	defer sh.Unlock()
	_, evicted := m.evict(sh, now, false)
	return evicted
}

// evict drops the sampled client of sh whose state is closest to fresh (only a fresh one if
// onlyFresh): up to evictionSample token-bucket clients from a random point of the table, then
// sliding-window clients in the map's random order. It returns how many clients it sampled.
func (m *Memory) evict(sh *memoryShard, now time.Time, onlyFresh bool) (sampled int, evicted bool) {
	var (
		victimKey  string
		victimSlot               = -1
		best       time.Duration = -1
		seen       int
	)
	left := func(s *State) time.Duration {
		if s.stamp != nil {
			return s.stamp.rl.Peek(s, now).ResetAfter
		}
		return 0
	}
	if t := &sh.buckets; t.n > 0 {
		for i := t.home(uint64(now.UnixNano()) * 0x9E3779B97F4A7C15); seen < evictionSample && seen < t.n; {
			if t.tags[i] != 0 {
				s := sh.unpack(t.slots[i].state)
				if l := left(&s); best < 0 || l < best {
					victimSlot, best = i, l
				}
				seen++
			}
			if i++; i == len(t.slots) {
				i = 0
			}
		}
	}
	for key, s := range sh.windows {
		if seen >= evictionSample || best == 0 {
			break
		}
		if l := left(s); best < 0 || l < best {
			victimKey, victimSlot, best = key, -1, l
		}
		seen++
	}
	if best < 0 || onlyFresh && best > 0 {
		return seen, false
	}
	if best > 0 {
		m.budget.evictions.Add(1)
	} else {
		m.budget.dropped.Add(1)
	}
	if victimSlot >= 0 {
		forgetBucket(m, sh, victimSlot)
	} else {
		forgetWindow(m, sh, victimKey, now)
	}
	return seen, true
}

// Sweep drops the states that have decayed back to fresh at now, so that idle clients cost no
// memory, and the records of refunds whose until and RefundRecordGrace have passed (Refund). It visits every
// client, one shard at a time, off the decision path: call it
// periodically from one goroutine. A decision waits at most for one shard's sweep.
func (m *Memory) Sweep(now time.Time) {
	now = ClampInstant(now)
	m.refunds.sweep(now)
	m.resets.sweep(now)
	shards := m.shards.Load()
	if shards == nil {
		return
	}
	for i := range shards {
		sh := &shards[i]
		sh.Lock()
		for t, i := &sh.buckets, 0; i < len(t.slots); {
			if t.tags[i] != 0 {
				if s := sh.unpack(t.slots[i].state); IsFresh(&s, now) {
					forgetBucket(m, sh, i)
					m.budget.dropped.Add(1)
					continue // remove may have shifted an unvisited entry into slot i
				}
			}
			i++
		}
		for key, s := range sh.windows {
			if IsFresh(s, now) {
				forgetWindow(m, sh, key, now)
				m.budget.dropped.Add(1)
			} else if l := leasesOf(s); l != nil {
				l.trim(now.UnixNano()) // its expired leases end (LeaseStats); no decision changes
			}
		}
		sh.Unlock()
	}
}

// Len returns the number of clients this store keeps state for.
func (m *Memory) Len() int { return int(m.clients.Load()) }
