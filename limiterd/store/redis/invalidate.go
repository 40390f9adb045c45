package redis

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/rueidis"
)

// ResetChannel is the Redis Pub/Sub channel on which a Reset tells every replica to forget the
// client's cached rejection. Its messages are "<policy ID>\x00<client key>".
const ResetChannel = KeyPrefix + "reset"

// cacheTrust says whether the reject caches of a Client may answer. A cached rejection is
// trusted only while the Client is subscribed to ResetChannel: a reset made by any replica then
// reaches this one, and drops the rejection. Whenever the subscription is lost, nothing cached
// is trusted until it is back and every cache has been emptied (resets may have been missed).
//
// epoch changes on every event that can make a rejection being decided stale (a reset
// message, the subscription lost or made): a rejection is cached only if epoch did not change
// since before its round trip, checked under the cache shard's lock. An invalidation changes
// epoch before it deletes, so either it deletes the entry or the entry is never written.
type cacheTrust struct {
	subscribed atomic.Bool
	epoch      atomic.Uint64
}

// rejectCacheOf returns the reject cache of a policy's stores, shared by every Store of that
// policy ID so that a reset message finds it. The Client keeps it only while a Store uses it.
func (c *Client) rejectCacheOf(policyID string) *rejectCache {
	for {
		if v, ok := c.caches.Load(policyID); ok {
			if rc := v.(weak.Pointer[rejectCache]).Value(); rc != nil {
				return rc
			}
			c.caches.CompareAndDelete(policyID, v)
		}
		rc := newRejectCache(c.opts.RejectCache, &c.trust)
		wp := weak.Make(rc)
		if _, loaded := c.caches.LoadOrStore(policyID, wp); loaded {
			continue // another Store of the policy was made meanwhile
		}
		runtime.AddCleanup(rc, func(id string) { c.caches.CompareAndDelete(id, wp) }, policyID)
		return rc
	}
}

// subscribeResets keeps the Client subscribed to ResetChannel until ctx is done, resubscribing
// with backoff after a failure. It closes started once the first attempt has subscribed or
// failed, and c.resetsDone when it returns.
func (c *Client) subscribeResets(ctx context.Context, started chan<- struct{}) {
	defer close(c.resetsDone)
	var once sync.Once
	signal := func() { once.Do(func() { close(started) }) }
	defer signal()
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		if cn := c.conn.Load(); cn != nil {
			var subscribed atomic.Bool
			hook := func(s rueidis.PubSubSubscription) { // on the connection's goroutine
				if s.Kind == "subscribe" && s.Channel == ResetChannel {
					c.resubscribed()
					subscribed.Store(true)
					signal()
				}
			}
			err := cn.Receive(rueidis.WithOnSubscriptionHook(ctx, hook),
				cn.B().Subscribe().Channel(ResetChannel).Build(), c.invalidate)
			c.unsubscribed()
			if ctx.Err() != nil {
				return
			}
			c.log.Warn("redis reset subscription lost, cached rejections not trusted until it is back", "error", err)
			if subscribed.Load() {
				wait = 100 * time.Millisecond
			}
		}
		signal()
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// resubscribed trusts the caches again, emptied.
func (c *Client) resubscribed() {
	c.trust.epoch.Add(1)
	c.caches.Range(func(_, v any) bool {
		if rc := v.(weak.Pointer[rejectCache]).Value(); rc != nil {
			rc.clear()
		}
		return true
	})
	c.trust.subscribed.Store(true)
}

// unsubscribed stops trusting the caches.
func (c *Client) unsubscribed() {
	c.trust.subscribed.Store(false)
	c.trust.epoch.Add(1)
}

// invalidate drops the cached rejection a reset message names.
func (c *Client) invalidate(m rueidis.PubSubMessage) {
	policyID, key, ok := strings.Cut(m.Message, "\x00")
	if !ok {
		return
	}
	c.trust.epoch.Add(1)
	if v, ok := c.caches.Load(policyID); ok {
		if rc := v.(weak.Pointer[rejectCache]).Value(); rc != nil {
			rc.delete(key)
		}
	}
	c.resetsReceived.Add(1)
}

// RejectCacheStats count what the reject caches of a Client did since it was made.
type RejectCacheStats struct {
	// Hits are decisions answered from a cache, without Redis.
	Hits uint64
	// ResetsReceived are reset messages received from any replica (this one included).
	ResetsReceived uint64
}

// RejectCacheStats returns the counters of the Client's reject caches.
func (c *Client) RejectCacheStats() RejectCacheStats {
	return RejectCacheStats{Hits: c.cacheHits.Load(), ResetsReceived: c.resetsReceived.Load()}
}
