package limiter

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// memoryShards is the number of independently locked parts of a Memory store: enough that
// decisions on different keys rarely wait for each other on any machine limiterd runs on.
const memoryShards = 256

// evictionSample is how many tracked clients an insertion into a full store looks at to pick the
// one to evict.
const evictionSample = 8

// Budget bounds the clients tracked by a set of Memory stores (one per policy) and counts what
// happens to them. It is safe for concurrent use. Its zero value tracks any number of clients.
type Budget struct {
	max       int64 // 0: unbounded
	tracked   atomic.Int64
	evictions atomic.Int64 // evictions that lost usage (state that was not fresh)
	dropped   atomic.Int64 // fresh states dropped (idle clients, or evicted while fresh)
}

// NewBudget returns a budget of at most maxClients tracked clients (0: unbounded).
func NewBudget(maxClients int64) *Budget { return &Budget{max: maxClients} }

// Tracked returns the number of clients whose state is kept.
func (b *Budget) Tracked() int64 { return b.tracked.Load() }

// Evictions returns how many clients were evicted, to respect the bound, while their state still
// held usage: each such eviction may have admitted that client more than its limit.
func (b *Budget) Evictions() int64 { return b.evictions.Load() }

// Dropped returns how many fresh (idle) client states were dropped. Dropping them changes no
// decision.
func (b *Budget) Dropped() int64 { return b.dropped.Load() }

func (b *Budget) full() bool { return b.max > 0 && b.tracked.Load() >= b.max }

// Memory keeps per-client state in process memory: the registry of one policy's clients.
// A client's state is created on its first decision, lives only in the shard its key hashes to,
// and a decision touches that one client's state under that shard's lock, never any other
// client's (O(1), no scan).
//
// Token-bucket clients cost 16 bytes of state plus their key and the map slot; sliding-window
// clients cost a pointer to their log. Unlimited clients cost nothing.
//
// Memory bounds: a client whose state has decayed to fresh is dropped by Sweep. When the Budget is
// full, inserting a new client first evicts, from the same shard, the sampled client closest to
// fresh (fewest evictionSample candidates, picked by the map's random iteration order, so no
// scan). Evicting a client that still had usage lets it start again with a full allowance: under
// a flood of distinct keys that bounds memory at the price of over-admitting evicted clients,
// which Budget.Evictions counts. Size the budget so that it only happens under attack.
//
// Memory is safe for concurrent use; N goroutines racing on one key admit exactly what a serial
// run would.
type Memory struct {
	budget *Budget
	seed   maphash.Seed
	shards [memoryShards]memoryShard
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
	windows map[string]*State // sliding-window clients
}

// bucketState is the compact form of a token bucket's State.
type bucketState struct {
	tat   int64
	frac  uint32
	stamp uint32
}

// NewMemory returns an empty store whose clients count against budget (nil: unbounded).
func NewMemory(budget *Budget) *Memory {
	if budget == nil {
		budget = &Budget{}
	}
	m := &Memory{budget: budget, seed: maphash.MakeSeed()}
	for i := range m.shards {
		m.shards[i].buckets.seed = m.seed
		m.shards[i].windows = make(map[string]*State)
	}
	return m
}

// shard returns the shard of a key and the key's hash as its bucketTable computes it.
func (m *Memory) shard(key string) (*memoryShard, uint64) {
	h := maphash.String(m.seed, key)
	return &m.shards[h>>56], tableHash(h) // memoryShards is 256: the top byte picks the shard
}

// Decide implements Store. It never fails.
func (m *Memory) Decide(_ context.Context, key string, rl RateLimiter, now time.Time, cost int64) (Decision, error) {
	return m.apply(key, rl, now, cost, false), nil
}

// Peek implements Store: what a one-unit decision would answer, without consuming anything or
// creating state. It never fails.
func (m *Memory) Peek(_ context.Context, key string, rl RateLimiter, now time.Time) (Decision, error) {
	return m.apply(key, rl, now, 1, true), nil
}

func (m *Memory) apply(key string, rl RateLimiter, now time.Time, cost int64, peek bool) Decision {
	switch rl.Algorithm() {
	case AlgorithmTokenBucket:
		sh, h := m.shard(key)
		sh.Lock()
		defer sh.Unlock()
		i, ok := sh.buckets.find(key, h)
		var s State
		if ok {
			b := &sh.buckets.slots[i].state
			s = State{stamp: b.stamp, frac: b.frac, tat: b.tat}
		} else if _, had := sh.windows[key]; had && !peek {
			forgetWindow(m, sh, key) // the client changed algorithm: it starts fresh
		}
		tb := rl.(*TokenBucket) // the set is closed; a concrete call keeps s on the stack
		if peek {
			return tb.Peek(&s, now)
		}
		stamp := s.stamp
		d := tb.Decide(&s, now, cost)
		if d.Allowed || s.stamp != stamp { // the state changed
			b := bucketState{tat: s.tat, frac: s.frac, stamp: s.stamp}
			if ok {
				sh.buckets.slots[i].state = b
			} else {
				m.admit(sh, now)
				sh.buckets.insert(key, h, b)
			}
		}
		return d
	case AlgorithmSlidingWindow:
		sh, h := m.shard(key)
		sh.Lock()
		defer sh.Unlock()
		s, ok := sh.windows[key]
		if !ok {
			if peek {
				return rl.Peek(&State{}, now)
			}
			if i, had := sh.buckets.find(key, h); had {
				forgetBucket(m, sh, i) // the client changed algorithm: it starts fresh
			}
			s = &State{}
		}
		if peek {
			return rl.Peek(s, now)
		}
		d := rl.Decide(s, now, cost)
		if !ok && d.Allowed {
			m.admit(sh, now)
			sh.windows[key] = s
		}
		return d
	default:
		if peek {
			return rl.Peek(nil, now)
		}
		return rl.Decide(nil, now, cost)
	}
}

// Reset implements Store: it forgets the client's state. It never fails.
func (m *Memory) Reset(_ context.Context, key string) error {
	sh, h := m.shard(key)
	sh.Lock()
	defer sh.Unlock()
	if i, ok := sh.buckets.find(key, h); ok {
		forgetBucket(m, sh, i)
	}
	if _, ok := sh.windows[key]; ok {
		forgetWindow(m, sh, key)
	}
	return nil
}

// forgetBucket deletes the token-bucket client in slot i of a shard.
func forgetBucket(m *Memory, sh *memoryShard, i int) {
	sh.buckets.remove(i)
	m.budget.tracked.Add(-1)
}

// forgetWindow deletes a sliding-window client of a shard.
func forgetWindow(m *Memory, sh *memoryShard, key string) {
	delete(sh.windows, key)
	m.budget.tracked.Add(-1)
}

// admit counts a new client, first evicting one from sh if the budget is full.
func (m *Memory) admit(sh *memoryShard, now time.Time) {
	if m.budget.full() {
		m.evict(sh, now)
	}
	m.budget.tracked.Add(1)
}

// evict drops the sampled client of sh whose state is closest to fresh: up to evictionSample
// token-bucket clients from a random point of the table, then sliding-window clients in the map's
// random order.
func (m *Memory) evict(sh *memoryShard, now time.Time) {
	var (
		victimKey  string
		victimSlot               = -1
		best       time.Duration = -1
		seen       int
	)
	left := func(s *State) time.Duration {
		if rl := strategyOf(s.stamp); rl != nil {
			return rl.Peek(s, now).ResetAfter
		}
		return 0
	}
	if t := &sh.buckets; t.n > 0 {
		for i := t.home(uint64(now.UnixNano()) * 0x9E3779B97F4A7C15); seen < evictionSample && seen < t.n; {
			if t.tags[i] != 0 {
				b := t.slots[i].state
				if l := left(&State{stamp: b.stamp, frac: b.frac, tat: b.tat}); best < 0 || l < best {
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
	if best < 0 {
		return // nothing here to evict; the bound is exceeded by at most one client a shard
	}
	if best > 0 {
		m.budget.evictions.Add(1)
	} else {
		m.budget.dropped.Add(1)
	}
	if victimSlot >= 0 {
		forgetBucket(m, sh, victimSlot)
	} else {
		forgetWindow(m, sh, victimKey)
	}
}

// Sweep drops the states that have decayed back to fresh at now, so that idle clients cost no
// memory. It visits every client, one shard at a time, off the decision path: call it
// periodically from one goroutine. A decision waits at most for one shard's sweep.
func (m *Memory) Sweep(now time.Time) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.Lock()
		for t, i := &sh.buckets, 0; i < len(t.slots); {
			b := t.slots[i].state
			if t.tags[i] != 0 && IsFresh(&State{stamp: b.stamp, frac: b.frac, tat: b.tat}, now) {
				forgetBucket(m, sh, i)
				m.budget.dropped.Add(1)
				continue // remove may have shifted an unvisited entry into slot i
			}
			i++
		}
		for key, s := range sh.windows {
			if IsFresh(s, now) {
				forgetWindow(m, sh, key)
				m.budget.dropped.Add(1)
			}
		}
		sh.Unlock()
	}
}

// Len returns the number of clients this store keeps state for.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.Lock()
		n += sh.buckets.n + len(sh.windows)
		sh.Unlock()
	}
	return n
}
