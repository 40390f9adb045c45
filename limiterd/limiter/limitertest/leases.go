package limitertest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/limiterd/limiterd/limiterd/limiter"
)

// LeaseOp is what a LeaseStep does.
type LeaseOp uint8

// The operations of a lease case.
const (
	// LeaseAcquire decides Cost places (Store.Decide); an admission takes a lease, issued at the
	// step's instant, that later steps name by the step's index.
	LeaseAcquire LeaseOp = iota
	// LeasePeek decides a cost of 0.
	LeasePeek
	// LeaseRelease ends the lease that step Lease took (Store.Refund with limiter.OpRelease), with
	// that lease's ID: naming a lease twice is a replay.
	LeaseRelease
	// LeaseExtend extends the lease that step Lease took (limiter.OpExtend); it spends that lease
	// and takes a new one, issued at the step's instant, that later steps name by this step's
	// index.
	LeaseExtend
	// LeaseRefund refunds Cost units (limiter.OpRefund) under an ID of its own.
	LeaseRefund
	// LeaseReset resets the client (Store.Reset); nothing of the answer is checked but Err.
	LeaseReset
)

// LeaseStep is one step of a lease case and what it must answer: the stack's Decision (every
// field, except RetryAfter of an admission and a ResetAfter of -1), each limit's when Limits is
// set, and for a release or an extension Freed, the places each concurrency limit freed or
// moved (Request.Refunded; 0 for every other limit). When Err is set, the step must fail with
// it (errors.Is) and nothing else is checked.
type LeaseStep struct {
	At    time.Duration // since T0
	Key   string        // default "client"
	Op    LeaseOp
	Cost  int64 // LeaseAcquire and LeaseRefund; default 1
	Lease int   // LeaseRelease and LeaseExtend: the index of the step whose lease they name
	Err   error

	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
	Limits     []LimitWant
	Freed      int64
}

// LeaseCase is a named sequence of lease steps on one stack.
type LeaseCase struct {
	Name  string
	Stack *limiter.Stack
	Steps []LeaseStep
}

// LeaseCases returns the conformance table of concurrency limits: acquisitions, releases,
// extensions, expiries, replays and resets, alone and stacked with a rate limit.
func LeaseCases() []LeaseCase {
	cc := func(limit int64, timeout time.Duration) limiter.RateLimiter {
		return must(limiter.NewConcurrency(limit, timeout))
	}
	const ms, s, h = time.Millisecond, time.Second, time.Hour
	rate := must(limiter.NewTokenBucket(2, 1, h))
	return []LeaseCase{
		{Name: "at most limit places are held; a release frees its lease's places once", Stack: One(cc(2, 10*s)), Steps: []LeaseStep{
			{At: 0, Allowed: true, Remaining: 1, ResetAfter: 10 * s},
			{At: s, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			// Without a release, a place is free when the first lease expires, at 10s.
			{At: 2 * s, Allowed: false, Remaining: 0, RetryAfter: 8 * s, ResetAfter: 9 * s},
			{At: 2 * s, Cost: 3, Allowed: false, Remaining: 0, RetryAfter: 0, ResetAfter: 9 * s},
			{At: 3 * s, Op: LeaseRelease, Lease: 0, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 8 * s},
			{At: 3 * s, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: 4 * s, Op: LeaseRelease, Lease: 0, Err: limiter.ErrRefunded},
			{At: 4 * s, Op: LeasePeek, Allowed: false, Remaining: 0, RetryAfter: 7 * s, ResetAfter: 9 * s},
		}},
		{Name: "a lease expires after its timeout, and is released no more", Stack: One(cc(1, 5*s)), Steps: []LeaseStep{
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 5 * s},
			{At: 5*s - ms, Allowed: false, Remaining: 0, RetryAfter: ms, ResetAfter: ms},
			{At: 5 * s, Allowed: true, Remaining: 0, ResetAfter: 5 * s},
			{At: 6 * s, Op: LeaseRelease, Lease: 0, Err: limiter.ErrLeaseExpired},
			{At: 6 * s, Op: LeasePeek, Allowed: false, Remaining: 0, RetryAfter: 4 * s, ResetAfter: 4 * s},
			{At: 7 * s, Op: LeaseRelease, Lease: 2, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 0},
		}},
		{Name: "an extension moves a lease's places to now plus the timeout, and spends the lease", Stack: One(cc(1, 5*s)), Steps: []LeaseStep{
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 5 * s},
			{At: 4 * s, Op: LeaseExtend, Lease: 0, Freed: 1, Allowed: false, Remaining: 0, RetryAfter: 5 * s, ResetAfter: 5 * s},
			{At: 4 * s, Op: LeaseRelease, Lease: 0, Err: limiter.ErrRefunded},
			{At: 4 * s, Op: LeaseExtend, Lease: 0, Err: limiter.ErrRefunded},
			{At: 6 * s, Allowed: false, Remaining: 0, RetryAfter: 3 * s, ResetAfter: 3 * s},
			{At: 7 * s, Op: LeaseRelease, Lease: 1, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 0},
			{At: 7 * s, Allowed: true, Remaining: 0, ResetAfter: 5 * s},
			{At: 12 * s, Op: LeaseExtend, Lease: 6, Err: limiter.ErrLeaseExpired},
		}},
		{Name: "leases of one instant are told apart, and each release frees its own places", Stack: One(cc(3, 10*s)), Steps: []LeaseStep{
			{At: 0, Allowed: true, Remaining: 2, ResetAfter: 10 * s},
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: s, Op: LeaseRelease, Lease: 0, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 9 * s},
			{At: s, Op: LeaseRelease, Lease: 0, Err: limiter.ErrRefunded},
			{At: s, Op: LeasePeek, Allowed: true, Remaining: 1, ResetAfter: 9 * s},
			{At: s, Op: LeaseRelease, Lease: 1, Freed: 2, Allowed: true, Remaining: 3, ResetAfter: 0},
		}},
		// A lease released and a lease taken after it at the same instant share an expiry: a
		// replay of the first frees nothing of the second.
		{Name: "a replay of a released lease frees nothing of a new lease of the same instant", Stack: One(cc(1, 10*s)), Steps: []LeaseStep{
			{At: s, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: s, Op: LeaseRelease, Lease: 0, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 0},
			{At: s, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: s, Op: LeaseRelease, Lease: 0, Err: limiter.ErrRefunded},
			{At: 2 * s, Op: LeaseRelease, Lease: 0, Err: limiter.ErrRefunded},
			{At: 2 * s, Op: LeaseExtend, Lease: 0, Err: limiter.ErrRefunded},
			{At: 2 * s, Op: LeasePeek, Allowed: false, Remaining: 0, RetryAfter: 9 * s, ResetAfter: 9 * s},
			{At: 2 * s, Op: LeaseRelease, Lease: 2, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 0},
		}},
		// An extension gives a new lease at its instant: the lease it spent, extended again or
		// released, frees nothing of it.
		{Name: "a lease extended is released and extended no more, its successor is", Stack: One(cc(2, 10*s)), Steps: []LeaseStep{
			{At: 0, Allowed: true, Remaining: 1, ResetAfter: 10 * s},
			{At: s, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: s, Op: LeaseExtend, Lease: 0, Freed: 1, Allowed: false, Remaining: 0, RetryAfter: 10 * s, ResetAfter: 10 * s},
			{At: s, Op: LeaseExtend, Lease: 0, Err: limiter.ErrRefunded},
			{At: 2 * s, Op: LeaseRelease, Lease: 0, Err: limiter.ErrRefunded},
			{At: 2 * s, Op: LeasePeek, Allowed: false, Remaining: 0, RetryAfter: 9 * s, ResetAfter: 9 * s},
			{At: 2 * s, Op: LeaseRelease, Lease: 2, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 9 * s},
			{At: 2 * s, Op: LeaseRelease, Lease: 2, Err: limiter.ErrRefunded},
			{At: 2 * s, Op: LeaseRelease, Lease: 1, Freed: 1, Allowed: true, Remaining: 2, ResetAfter: 0},
		}},
		{Name: "a peek takes no place, and a refund gives none back", Stack: One(cc(2, 10*s)), Steps: []LeaseStep{
			{At: 0, Op: LeasePeek, Allowed: true, Remaining: 2, ResetAfter: 0},
			{At: 0, Op: LeasePeek, Allowed: true, Remaining: 2, ResetAfter: 0},
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: s, Op: LeaseRefund, Cost: 2, Allowed: false, Remaining: 0, RetryAfter: 9 * s, ResetAfter: 9 * s},
			{At: s, Op: LeasePeek, Allowed: false, Remaining: 0, RetryAfter: 9 * s, ResetAfter: 9 * s},
		}},
		{Name: "a reset drops the leases and voids their release", Stack: One(cc(1, 10*s)), Steps: []LeaseStep{
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: s, Op: LeaseReset},
			{At: 2 * s, Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: 2 * s, Op: LeaseRelease, Lease: 0, Err: limiter.ErrReset},
			{At: 2 * s, Op: LeasePeek, Allowed: false, Remaining: 0, RetryAfter: 10 * s, ResetAfter: 10 * s},
			{At: 2 * s, Op: LeaseRelease, Lease: 2, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 0},
		}},
		{Name: "clients hold their own places", Stack: One(cc(1, 10*s)), Steps: []LeaseStep{
			{At: 0, Key: "a", Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: 0, Key: "b", Allowed: true, Remaining: 0, ResetAfter: 10 * s},
			{At: 0, Key: "a", Allowed: false, Remaining: 0, RetryAfter: 10 * s, ResetAfter: 10 * s},
			{At: s, Key: "a", Op: LeaseRelease, Lease: 0, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: 0},
			{At: s, Key: "b", Op: LeasePeek, Allowed: false, Remaining: 0, RetryAfter: 9 * s, ResetAfter: 9 * s},
		}},
		{Name: "a release needs a concurrency limit", Stack: One(rate), Steps: []LeaseStep{
			{At: 0, Allowed: true, Remaining: 1, ResetAfter: h},
			{At: 0, Op: LeaseRelease, Lease: 0, Err: limiter.ErrNoLease},
			{At: 0, Op: LeaseExtend, Lease: 0, Err: limiter.ErrNoLease},
		}},
		// All or nothing: a rejection by the concurrency limit charges no rate, one by the rate
		// takes no place, and a release gives back places only, never a rate's units.
		{Name: "a concurrency limit stacks with a rate, all or nothing", Stack: Stack("rate", rate, "inflight", cc(1, 10*s)), Steps: []LeaseStep{
			{At: 0, Allowed: true, Remaining: 0, ResetAfter: 10 * s, Limits: []LimitWant{
				{Allowed: true, Remaining: 1, ResetAfter: h}, {Allowed: true, Remaining: 0, ResetAfter: 10 * s}}},
			{At: 0, Allowed: false, Remaining: 0, RetryAfter: 10 * s, ResetAfter: 10 * s, Limits: []LimitWant{
				{Allowed: true, Remaining: 1, ResetAfter: h}, {Allowed: false, Remaining: 0, RetryAfter: 10 * s, ResetAfter: 10 * s}}},
			{At: s, Op: LeaseRelease, Lease: 0, Freed: 1, Allowed: true, Remaining: 1, ResetAfter: h - s, Limits: []LimitWant{
				{Allowed: true, Remaining: 1, ResetAfter: h - s}, {Allowed: true, Remaining: 1, ResetAfter: 0}}},
			{At: s, Allowed: true, Remaining: 0, ResetAfter: 2*h - s, Limits: []LimitWant{
				{Allowed: true, Remaining: 0, ResetAfter: 2*h - s}, {Allowed: true, Remaining: 0, ResetAfter: 10 * s}}},
			{At: 2 * s, Op: LeaseRelease, Lease: 3, Freed: 1, Allowed: false, Remaining: 0, RetryAfter: h - 2*s, ResetAfter: 2*h - 2*s, Limits: []LimitWant{
				{Allowed: false, Remaining: 0, RetryAfter: h - 2*s, ResetAfter: 2*h - 2*s}, {Allowed: true, Remaining: 1, ResetAfter: 0}}},
			{At: 2 * s, Allowed: false, Remaining: 0, RetryAfter: h - 2*s, ResetAfter: 2*h - 2*s, Limits: []LimitWant{
				{Allowed: false, Remaining: 0, RetryAfter: h - 2*s, ResetAfter: 2*h - 2*s}, {Allowed: true, Remaining: 1, ResetAfter: 0}}},
			{At: h, Allowed: true, Remaining: 0, ResetAfter: 2 * h, Limits: []LimitWant{
				{Allowed: true, Remaining: 0, ResetAfter: 2 * h}, {Allowed: true, Remaining: 0, ResetAfter: 10 * s}}},
		}},
	}
}

// lease is a lease a runner holds: its ID, the instant it was issued, the seq that names it
// (Decision.Lease) and its places.
type lease struct {
	id     [16]byte
	issued time.Time
	seq    uint64
	places int64
}

// RunLeases runs the lease table (LeaseCases) against stores made by newStore, each case on a
// fresh store, one call at a time.
func RunLeases(t *testing.T, newStore func(t *testing.T) limiter.Store) {
	for _, c := range LeaseCases() {
		t.Run(c.Name, func(t *testing.T) { runLeaseCase(t, newStore(t), c) })
	}
}

func runLeaseCase(t *testing.T, store limiter.Store, c LeaseCase) {
	ctx := context.Background()
	st := c.Stack
	leases := map[int]lease{}
	newID := func() [16]byte {
		var id [16]byte
		binary.BigEndian.PutUint64(id[8:], refundIDs.Add(1))
		return id
	}
	for i, step := range c.Steps {
		key := step.Key
		if key == "" {
			key = "client"
		}
		cost := step.Cost
		if cost == 0 {
			cost = 1
		}
		now := T0.Add(step.At)
		limits := make([]limiter.Decision, st.Len())
		freed := make([]int64, st.Len())
		var (
			d   limiter.Decision
			err error
		)
		switch step.Op {
		case LeaseAcquire:
			if d, err = store.Decide(ctx, key, st, now, cost, limits); err == nil && d.Allowed {
				leases[i] = lease{id: newID(), issued: now, seq: d.Lease, places: cost}
			}
		case LeasePeek:
			d, err = store.Decide(ctx, key, st, now, 0, limits)
		case LeaseRelease, LeaseExtend:
			l, ok := leases[step.Lease]
			if !ok {
				t.Fatalf("step %d names step %d, which took no lease", i, step.Lease)
			}
			op := limiter.OpRelease
			if step.Op == LeaseExtend {
				op = limiter.OpExtend
			}
			once := limiter.Once{Op: op, ID: l.id, Issued: l.issued, Until: st.LeaseExpiry(l.issued), Cost: l.places, Lease: l.seq}
			d, err = store.Refund(ctx, limiter.Request{Key: key, Stack: st, Cost: l.places, Limits: limits, Refunded: freed}, now, once)
			if err == nil && op == limiter.OpExtend {
				leases[i] = lease{id: newID(), issued: now, seq: d.Lease, places: l.places}
			}
		case LeaseRefund:
			d, err = store.Refund(ctx, limiter.Request{Key: key, Stack: st, Cost: cost, Limits: limits}, now,
				limiter.Once{ID: newID(), Until: now.Add(time.Hour)})
		case LeaseReset:
			err = store.Reset(ctx, key, now)
		}
		where := fmt.Sprintf("step %d (%v at %v)", i, step.Op, step.At)
		if step.Err != nil {
			if !errors.Is(err, step.Err) {
				t.Fatalf("%s: %+v, error %v; want error %v", where, d, err, step.Err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if step.Op == LeaseReset {
			continue
		}
		checkDecision(t, where, d, step.Allowed, step.Remaining, step.RetryAfter, step.ResetAfter)
		for j, w := range step.Limits {
			checkDecision(t, fmt.Sprintf("%s, limit %s", where, st.Name(j)), limits[j], w.Allowed, w.Remaining, w.RetryAfter, w.ResetAfter)
		}
		if step.Op == LeaseRelease || step.Op == LeaseExtend {
			for j := range st.Len() {
				want := int64(0)
				if st.Limiter(j).Algorithm() == limiter.AlgorithmConcurrency {
					want = step.Freed
				}
				if freed[j] != want {
					t.Errorf("%s, limit %s: %d places freed or moved, want %d", where, st.Name(j), freed[j], want)
				}
			}
		}
	}
}

// String returns the operation's name.
func (op LeaseOp) String() string {
	switch op {
	case LeaseAcquire:
		return "acquire"
	case LeasePeek:
		return "peek"
	case LeaseRelease:
		return "release"
	case LeaseExtend:
		return "extend"
	case LeaseRefund:
		return "refund"
	case LeaseReset:
		return "reset"
	}
	return fmt.Sprintf("LeaseOp(%d)", uint8(op))
}

// checkDecision checks every field of d (RetryAfter only of a rejection; ResetAfter unless -1).
func checkDecision(t *testing.T, where string, d limiter.Decision, allowed bool, remaining int64, retryAfter, resetAfter time.Duration) {
	t.Helper()
	if d.Allowed != allowed || d.Remaining != remaining || !allowed && d.RetryAfter != retryAfter ||
		resetAfter != -1 && d.ResetAfter != resetAfter {
		t.Errorf("%s: got %+v, want allowed %t, remaining %d, retry after %v, reset after %v",
			where, d, allowed, remaining, retryAfter, resetAfter)
	}
}
