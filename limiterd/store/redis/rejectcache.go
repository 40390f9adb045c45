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
// cannot be admitted: a rejection's RetryAfter only grows as other requests are admitted, and
// neither time nor other replicas can make it come sooner (a parameter change does, so an
// entry holds for its strategy only; so does a Reset by any replica, which trust tracks: see
// cacheTrust). It is safe for concurrent use and holds at most about its size entries.
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
	rl    limiter.RateLimiter
	cost  int64
	at    time.Time        // when it was decided (the caller's clock)
	d     limiter.Decision // as decided at
	until time.Time        // at + RetryAfter
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

// get returns the cached rejection of cost units for key by rl, aged to now, if there is one,
// its retry time has not come, and the cache is trusted.
func (c *rejectCache) get(key string, rl limiter.RateLimiter, cost int64, now time.Time) (limiter.Decision, bool) {
	if !c.trust.subscribed.Load() {
		return limiter.Decision{}, false
	}
	sh := c.shard(key)
	sh.Lock()
	e, ok := sh.m[key]
	if ok && (e.rl != rl || !now.Before(e.until)) {
		delete(sh.m, key) // stale: its strategy was replaced, or its retry time came
		ok = false
	}
	sh.Unlock()
	if !ok || e.cost != cost || now.Before(e.at) {
		return limiter.Decision{}, false
	}
	elapsed := now.Sub(e.at)
	d := e.d
	d.RetryAfter -= elapsed
	d.ResetAfter = max(0, d.ResetAfter-elapsed)
	return d, true
}

// put remembers a rejection decided at now, unless the trust epoch moved from epoch, read
// before the rejection was decided.
func (c *rejectCache) put(key string, rl limiter.RateLimiter, cost int64, now time.Time, d limiter.Decision, epoch uint64) {
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
	sh.m[key] = rejection{rl: rl, cost: cost, at: now, d: d, until: now.Add(d.RetryAfter)}
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
