package engine_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
)

// BenchmarkDecide runs the engine's decisions with the record of heaviest clients on and off
// (Options.NoTopClients), side by side in one run: the record's cost per decision. Run with
// -count to alternate the pairs. A decision is DecideInto's, the servers' call, into one
// Result reused (Decide adds the Result's copy).
func BenchmarkDecide(b *testing.B) {
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = fmt.Sprint("client-", i)
	}
	cases := []struct {
		name string
		run  func(b *testing.B, e *engine.Engine, id v1alpha1.PolicyID)
	}{
		{"HotKey", func(b *testing.B, e *engine.Engine, id v1alpha1.PolicyID) {
			var r engine.Result
			for b.Loop() {
				_ = e.DecideInto(ctx, id, "alice", 1, &r)
			}
		}},
		{"ManyClients", func(b *testing.B, e *engine.Engine, id v1alpha1.PolicyID) {
			var r engine.Result
			i := 0
			for b.Loop() {
				_ = e.DecideInto(ctx, id, keys[i&(len(keys)-1)], 1, &r)
				i++
			}
		}},
		{"ParallelHotKey", func(b *testing.B, e *engine.Engine, id v1alpha1.PolicyID) {
			b.RunParallel(func(pb *testing.PB) {
				var r engine.Result
				for pb.Next() {
					_ = e.DecideInto(ctx, id, "alice", 1, &r)
				}
			})
		}},
		{"Batch100", func(b *testing.B, e *engine.Engine, id v1alpha1.PolicyID) {
			items := make([]engine.BatchItem, 100)
			for i := range items {
				items[i] = engine.BatchItem{Policy: id, Key: keys[i%10], Cost: 1}
			}
			out := make([]engine.BatchResult, len(items))
			for b.Loop() {
				_ = e.DecideBatch(ctx, items, out)
			}
		}},
	}
	for _, c := range cases {
		for _, off := range []bool{false, true} {
			name := c.name + "/top=on"
			if off {
				name = c.name + "/top=off"
			}
			b.Run(name, func(b *testing.B) {
				e := engine.New(engine.Options{NoTopClients: off})
				// Admits (nearly) everything: the record of admitted decisions is the busy one.
				p := compile(b, "api", func(s *v1alpha1.RateLimitPolicySpec) {
					s.Tiers[0].TokenBucket.Capacity, s.Tiers[0].TokenBucket.RefillRate = 1_000_000_000, 1_000_000_000
					s.Tiers[0].TokenBucket.RefillPeriod.Duration = time.Second
				})
				e.Swap(set(b, p))
				c.run(b, e, p.ID)
			})
		}
	}
}
