package limiter

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
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
	sync.Mutex
	buckets map[string]bucketState // token-bucket clients
	windows map[string]*State      // sliding-window clients
	_       [64 - 24]byte          // keep shards on separate cache lines
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
		m.shards[i].buckets = make(map[string]bucketState)
		m.shards[i].windows = make(map[string]*State)
	}
	return m
}

func (m *Memory) shard(key string) *memoryShard {
	return &m.shards[maphash.String(m.seed, key)%memoryShards]
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
		sh := m.shard(key)
		sh.Lock()
		defer sh.Unlock()
		b, ok := sh.buckets[key]
		if _, had := sh.windows[key]; !ok && !peek && had {
			forget(m, sh.windows, key) // the client changed algorithm: it starts fresh
		}
		s := State{stamp: b.stamp, frac: b.frac, tat: b.tat}
		if peek {
			return rl.Peek(&s, now)
		}
		d := rl.Decide(&s, now, cost)
		if d.Allowed || s.stamp != b.stamp { // the state changed
			if !ok {
				m.admit(sh, now)
			}
			sh.buckets[key] = bucketState{tat: s.tat, frac: s.frac, stamp: s.stamp}
		}
		return d
	case AlgorithmSlidingWindow:
		sh := m.shard(key)
		sh.Lock()
		defer sh.Unlock()
		s, ok := sh.windows[key]
		if !ok {
			if peek {
				return rl.Peek(&State{}, now)
			}
			if _, had := sh.buckets[key]; had {
				forget(m, sh.buckets, key) // the client changed algorithm: it starts fresh
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
	sh := m.shard(key)
	sh.Lock()
	defer sh.Unlock()
	if _, ok := sh.buckets[key]; ok {
		forget(m, sh.buckets, key)
	}
	if _, ok := sh.windows[key]; ok {
		forget(m, sh.windows, key)
	}
	return nil
}

// forget deletes a tracked client's state from one of a shard's maps.
func forget[V any](m *Memory, states map[string]V, key string) {
	delete(states, key)
	m.budget.tracked.Add(-1)
}

// admit counts a new client, first evicting one from sh if the budget is full.
func (m *Memory) admit(sh *memoryShard, now time.Time) {
	if m.budget.full() {
		m.evict(sh, now)
	}
	m.budget.tracked.Add(1)
}

// evict drops the sampled client of sh whose state is closest to fresh.
func (m *Memory) evict(sh *memoryShard, now time.Time) {
	var (
		victim   string
		inBucket bool
		best     time.Duration = -1
		seen     int
	)
	consider := func(key string, s *State) bool {
		d := strategyOf(s.stamp)
		var left time.Duration
		if d != nil {
			left = d.Peek(s, now).ResetAfter
		}
		if best < 0 || left < best {
			victim, best = key, left
			return true
		}
		return false
	}
	for key, b := range sh.buckets {
		s := State{stamp: b.stamp, frac: b.frac, tat: b.tat}
		if consider(key, &s) {
			inBucket = true
		}
		if seen++; seen == evictionSample || best == 0 {
			break
		}
	}
	for key, s := range sh.windows {
		if seen >= evictionSample || best == 0 {
			break
		}
		if consider(key, s) {
			inBucket = false
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
	if inBucket {
		forget(m, sh.buckets, victim)
	} else {
		forget(m, sh.windows, victim)
	}
}

// Sweep drops the states that have decayed back to fresh at now, so that idle clients cost no
// memory. It visits every client, one shard at a time, off the decision path: call it
// periodically from one goroutine. A decision waits at most for one shard's sweep.
func (m *Memory) Sweep(now time.Time) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.Lock()
		for key, b := range sh.buckets {
			s := State{stamp: b.stamp, frac: b.frac, tat: b.tat}
			if IsFresh(&s, now) {
				forget(m, sh.buckets, key)
				m.budget.dropped.Add(1)
			}
		}
		for key, s := range sh.windows {
			if IsFresh(s, now) {
				forget(m, sh.windows, key)
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
		n += len(sh.buckets) + len(sh.windows)
		sh.Unlock()
	}
	return n
}
