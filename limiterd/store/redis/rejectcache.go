package redis

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// rejectShards is the number of independently locked parts of a rejectCache.
const rejectShards = 64

// rejectCache remembers, for clients recently rejected, the instant before which the same cost
// cannot be admitted by the same stack: a rejection's RetryAfter only grows as other requests are
// admitted, and neither time nor other replicas can make it come sooner (a parameter change
// does, so an entry holds for its stack's limits only; so does a refund or a Reset by any
// replica, which trust tracks: see cacheTrust). A stack is rejected while any of its limits
// rejects: an entry holds until the first of the rejecting limits' retry times, so that every
// limit's cached decision still holds (a limit that can never admit the cost, RetryAfter 0, is
// not cached: the stack's RetryAfter is then 0 too). It is safe for concurrent use and holds at
// most about its size entries.
type rejectCache struct {
	seed     maphash.Seed
	perShard int
	trust    *cacheTrust
	shards   [rejectShards]rejectShard
}

type rejectShard struct {
	sync.Mutex
	m map[string]rejection
}

type rejection struct {
	st     *limiter.Stack
	cost   int64
	at     time.Time                          // when it was decided (the caller's clock)
	d      limiter.Decision                   // as decided at
	limits [limiter.MaxStack]limiter.Decision // each limit's, as decided at
	until  time.Time                          // at + the soonest RetryAfter of a rejecting limit
}

func newRejectCache(size int, trust *cacheTrust) *rejectCache {
	c := &rejectCache{seed: maphash.MakeSeed(), perShard: max(1, (size+rejectShards-1)/rejectShards), trust: trust}
	for i := range c.shards {
		c.shards[i].m = make(map[string]rejection)
	}
	return c
}

func (c *rejectCache) shard(key string) *rejectShard {
	return &c.shards[maphash.String(c.seed, key)%rejectShards]
}

// get returns the cached rejection of cost units for key by st, aged to now, if there is one,
// its retry time has not come, and the cache is trusted; out, if not nil, receives each limit's
// decision, aged likewise.
func (c *rejectCache) get(key string, st *limiter.Stack, cost int64, now time.Time, out []limiter.Decision) (limiter.Decision, bool) {
	if !c.trust.subscribed.Load() {
		return limiter.Decision{}, false
	}
	sh := c.shard(key)
	sh.Lock()
	e, ok := sh.m[key]
	if ok && (!sameStack(e.st, st) || !now.Before(e.until)) {
		delete(sh.m, key) // stale: its limits were replaced, or a retry time came
		ok = false
	}
	sh.Unlock()
	if !ok || e.cost != cost || now.Before(e.at) {
		return limiter.Decision{}, false
	}
	elapsed := now.Sub(e.at)
	if out != nil {
		for i := range st.Len() {
			out[i] = aged(e.limits[i], elapsed)
		}
	}
	return aged(e.d, elapsed), true
}

// aged returns a rejection's decision elapsed after it was decided.
func aged(d limiter.Decision, elapsed time.Duration) limiter.Decision {
	if d.RetryAfter > 0 {
		d.RetryAfter -= elapsed
	}
	d.ResetAfter = max(0, d.ResetAfter-elapsed)
	return d
}

// sameStack reports whether a and b decide alike: the same limits (strategies) under the same
// names, in the same order.
func sameStack(a, b *limiter.Stack) bool {
	if a == b {
		return true
	}
	if a.Len() != b.Len() {
		return false
	}
	for i := range a.Len() {
		if a.Limiter(i) != b.Limiter(i) || a.Name(i) != b.Name(i) {
			return false
		}
	}
	return true
}

// put remembers the decision d of cost units by st, decided at now with each limit's decision in
// limits (nil: not known, and nothing is remembered), if it is a rejection that waiting cures
// (RetryAfter > 0), unless the trust epoch moved from epoch, read before the decision was made.
// A stack with a concurrency limit is never remembered: a release, on any replica and at any
// time, frees places before the retry time (the earliest lease's expiry), and releases are the
// rule there, not the exception that a refund is.
func (c *rejectCache) put(key string, st *limiter.Stack, cost int64, now time.Time, d limiter.Decision, limits []limiter.Decision, epoch uint64) {
	if d.Allowed || d.RetryAfter <= 0 || len(limits) < st.Len() || st.HasLeases() {
		return
	}
	e := rejection{st: st, cost: cost, at: now, d: d, until: now.Add(d.RetryAfter)}
	for i := range st.Len() {
		l := limits[i]
		if !l.Allowed {
			if l.RetryAfter <= 0 {
				return // never admitted: the stack's RetryAfter would be 0
			}
			if u := now.Add(l.RetryAfter); u.Before(e.until) {
				e.until = u
			}
		}
		e.limits[i] = l
	}
	sh := c.shard(key)
	sh.Lock()
	defer sh.Unlock()
	if c.trust.epoch.Load() != epoch {
		return // a reset may have been missed, or may have come after the decision
	}
	if _, ok := sh.m[key]; !ok && len(sh.m) >= c.perShard {
		// Full: drop expired entries among a few, else one arbitrary entry (map order is random).
		seen, dropped := 0, false
		for k, e := range sh.m {
			if !now.Before(e.until) {
				delete(sh.m, k)
				dropped = true
			}
			if seen++; seen == 8 {
				break
			}
		}
		if !dropped {
			for k := range sh.m {
				delete(sh.m, k)
				break
			}
		}
	}
	sh.m[key] = e
}

// delete forgets key.
func (c *rejectCache) delete(key string) {
	sh := c.shard(key)
	sh.Lock()
	delete(sh.m, key)
	sh.Unlock()
}

// clear forgets every entry.
func (c *rejectCache) clear() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.Lock()
		clear(sh.m)
		sh.Unlock()
	}
}
