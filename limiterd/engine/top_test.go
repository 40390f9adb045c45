package engine_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/limiterd/engine"
	"github.com/limiterd/limiterd/limiterd/heavyhitters"
)

// topOf returns the top's keys and counts as "key=count" in order.
func topOf(t *testing.T, e *engine.Engine, id v1alpha1.PolicyID, d heavyhitters.Direction) string {
	t.Helper()
	top, _, err := e.TopClients(id, d, 10)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, en := range top.Entries {
		s = append(s, fmt.Sprintf("%s=%d", en.Key, en.Count))
	}
	return strings.Join(s, " ")
}

// Decisions, single and batched, are recorded by outcome (a dry-run tier's rejection as
// rejected), under the stored key; peeks are not.
func TestTopClientsRecordsDecisions(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	e := engine.New(engine.Options{Clock: func() time.Time { return now }})
	p := compile(t, "api", nil) // free: 2 per hour; try-*: dry run of 1; boss: unlimited
	e.Swap(set(t, p))
	for range 3 {
		if _, err := e.Decide(ctx, p.ID, "alice", 1); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		_, _ = e.Decide(ctx, p.ID, "alice", 0) // peeks
		_, _ = e.Peek(ctx, p.ID, "alice")
	}
	long := strings.Repeat("k", v1alpha1.MaxClientKeyBytes+1)
	items := []engine.BatchItem{{Policy: p.ID, Key: "boss", Cost: 1}, {Policy: p.ID, Key: "boss", Cost: 1},
		{Policy: p.ID, Key: "try-1", Cost: 1}, {Policy: p.ID, Key: "try-1", Cost: 1}, {Policy: p.ID, Key: "bob", Cost: 0},
		{Policy: p.ID, Key: long, Cost: 1}}
	if err := e.DecideBatch(ctx, items, make([]engine.BatchResult, len(items))); err != nil {
		t.Fatal(err)
	}
	if got, want := topOf(t, e, p.ID, heavyhitters.Admitted), "alice=2 boss=2 "+engine.ClientKey(long)+"=1 try-1=1"; got != want {
		t.Errorf("admitted: %s, want %s", got, want)
	}
	if got, want := topOf(t, e, p.ID, heavyhitters.Rejected), "alice=1 try-1=1"; got != want {
		t.Errorf("rejected: %s, want %s", got, want)
	}
	// The record outlives a swap that keeps the policy, and goes with a policy removed.
	e.Swap(set(t, p, compile(t, "other", nil)))
	if got := topOf(t, e, p.ID, heavyhitters.Rejected); got != "alice=1 try-1=1" {
		t.Errorf("after a swap: %s", got)
	}
	e.Swap(set(t, compile(t, "other", nil)))
	e.Swap(set(t, p))
	if got := topOf(t, e, p.ID, heavyhitters.Rejected); got != "" {
		t.Errorf("after the policy was removed and added: %s, want nothing", got)
	}
	if _, _, err := e.TopClients("team/nope", heavyhitters.Rejected, 10); !errors.Is(err, engine.ErrUnknownPolicy) {
		t.Errorf("unknown policy: %v", err)
	}
	// Five minutes later, the decisions are out of the period.
	_, _ = e.Decide(ctx, p.ID, "alice", 1)
	now = now.Add(5 * time.Minute)
	if got := topOf(t, e, p.ID, heavyhitters.Rejected); got != "" {
		t.Errorf("five minutes later: %s, want nothing", got)
	}
}

func TestTopClientsOff(t *testing.T) {
	e := engine.New(engine.Options{NoTopClients: true})
	p := compile(t, "api", nil)
	e.Swap(set(t, p))
	if _, err := e.Decide(ctx, p.ID, "alice", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.TopClients(p.ID, heavyhitters.Admitted, 10); !errors.Is(err, engine.ErrTopClientsOff) {
		t.Errorf("err = %v, want ErrTopClientsOff", err)
	}
}

// A caller cannot make the record's memory grow: a flood of distinct keys, of the longest
// length stored as such and longer (stored as digests), single and batched, leaves at most
// MaxEntries entries of at most 1,024 bytes each, and a client heavier than N/k stays on top of it.
func TestTopClientsKeyFlood(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	cfg := heavyhitters.Config{Counters: 16, Shards: 2}
	e := engine.New(engine.Options{Clock: func() time.Time { return now }, TopClients: cfg})
	p := compile(t, "api", nil)
	e.Swap(set(t, p))
	pad := strings.Repeat("k", v1alpha1.MaxClientKeyBytes-10)
	items := make([]engine.BatchItem, 0, 100)
	out := make([]engine.BatchResult, 100)
	for i := range 20000 {
		key := fmt.Sprintf("%s%010d", pad, i) // 1,024 bytes, stored as itself
		if i%3 == 0 {
			key += "-and-longer" // stored as its digest
		}
		if i%4 == 0 {
			if _, err := e.Decide(ctx, p.ID, "boss", 1); err != nil { // unlimited: admitted
				t.Fatal(err)
			}
		}
		items = append(items, engine.BatchItem{Policy: p.ID, Key: key, Cost: 1})
		if len(items) == cap(items) {
			if err := e.DecideBatch(ctx, items, out); err != nil {
				t.Fatal(err)
			}
			items = items[:0]
			now = now.Add(time.Second) // 200 s in all: within the period
		}
	}
	entries, keyBytes := engine.TopClientsSize(e, p.ID)
	if max := cfg.MaxEntries(); entries == 0 || entries > max || keyBytes > max*v1alpha1.MaxClientKeyBytes {
		t.Errorf("%d entries of %d key bytes, bound %d entries of %d bytes", entries, keyBytes, max, v1alpha1.MaxClientKeyBytes)
	}
	top, _, err := e.TopClients(p.ID, heavyhitters.Admitted, 1)
	if err != nil {
		t.Fatal(err)
	}
	if top.Total != 25000 || top.Bound >= 5000 {
		t.Fatalf("%d decisions, bound %d: the flood does not test the bound", top.Total, top.Bound)
	}
	if len(top.Entries) != 1 || top.Entries[0].Key != "boss" || top.Entries[0].Count < 5000 || top.Entries[0].Count-top.Entries[0].Error > 5000 {
		t.Errorf("top admitted: %+v (bound %d), want boss with 5000", top.Entries, top.Bound)
	}
}
