package limiter

import (
	"strings"
	"time"
	"unsafe"
)

// A stacked limit's state lives in the same tables as a single-limit client's, under its stack
// key: the client's stored key, 0xFF and the limit's name, or the stored key alone for the limit
// named DefaultLimitName (the single-limit form's state). A client's stored key is its key with
// every 0xFF byte doubled (storedKey): 0xFF never occurs in UTF-8, so for the keys the APIs
// accept it is the key itself, and whatever bytes a key holds a stack key (one 0xFF, then a
// name's first character) is no client's stored key. All the limits of a client live in the
// shard of its stored key, so one shard lock makes a stack decision atomic. Each limit with
// state counts as one tracked client against the budget, and is swept and evicted as one.
const stackKeySeparator = 0xFF

// storedKey returns the key under which a store keeps the state of client key: key with every
// 0xFF doubled (key itself for a UTF-8 key, without allocating).
func storedKey(key string) string {
	if strings.IndexByte(key, stackKeySeparator) < 0 {
		return key
	}
	return strings.ReplaceAll(key, "\xff", "\xff\xff")
}

// appendStackKey appends the stack key of a limit to buf; key is a stored key.
func appendStackKey(buf []byte, key, name string) []byte {
	buf = append(buf, key...)
	buf = append(buf, stackKeySeparator)
	return append(buf, name...)
}

// isStackKeyOf reports whether k is the stack key of a limit of the client whose stored key is
// key: key, 0xFF, and a name with no 0xFF. Exactly: a stored key has its 0xFF bytes in pairs and
// a limit's name has none (NewStack), so the last 0xFF of a stack key is its separator, and the
// stored key before it is the one client it belongs to. A key with key as a prefix, such as
// another client's stored key key+"\xff\xff..." or its stack keys, is not one.
func isStackKeyOf(k, key string) bool {
	return len(k) > len(key)+1 && k[:len(key)] == key && k[len(key)] == stackKeySeparator &&
		strings.IndexByte(k[len(key)+1:], stackKeySeparator) < 0
}

// stackLimit is one limit of a stack decision, under its shard's lock.
type stackLimit struct {
	h       uint64 // the table hash of the limit's stack key
	s       State  // a token bucket's state as read, or an untracked sliding window's or concurrency limit's working state
	next    State  // a token bucket's state after the decision
	w       *State // a tracked sliding window's state, decided on in place; a tracked concurrency limit's, checked, then decided once every limit admits
	slot    int    // a tracked token bucket's slot, valid until the tables change
	tracked bool   // state of the limit's algorithm is kept under key
	other   bool   // the other algorithm's state is kept under key (a changed algorithm)
	undo    windowUndo
}

// windowUndo restores a sliding window's state after a decision that its stack rejected.
// SlidingWindow.Decide changes a tracked log in three ways only: it moves the header (expiring
// entries from the head, converting), it adds to the newest entry's total, and it appends an
// entry, into the slot after the newest of the same ring or into a new, larger ring. Expired
// entries leave from the head, so the only slots of the old ring it writes are the newest's
// and the one after it: saving the state, the header and those two slots restores it exactly.
type windowUndo struct {
	s          State
	hdr        windowLog
	last, next admission
	bytes      int64 // logBytes before
}

func (u *windowUndo) save(s *State) {
	u.s, u.bytes = *s, logBytes(s)
	if l := s.log; l != nil {
		u.hdr = *l
		if len(l.entries) > 0 {
			u.last, u.next = *l.at(l.n - 1), *l.at(l.n)
		}
	}
}

func (u *windowUndo) restore(s *State) {
	*s = u.s
	if l := s.log; l != nil {
		*l = u.hdr
		if len(l.entries) > 0 {
			*l.at(l.n - 1), *l.at(l.n) = u.last, u.next
		}
	}
}

// applyStack decides (all or nothing), peeks or refunds a stack for key; it reports whether the
// store's bytes grew (new clients, grown logs). limits is zeroed working space for st.Len()
// limits; out has room for st.Len() decisions. A refund (opRefund) passes its gate g (nil:
// none) under the client's shard lock before it changes anything (Memory.admitRefund); when the
// gate refuses, nothing changes and g.err says why.
func (m *Memory) applyStack(key string, st *Stack, now time.Time, cost int64, o op, limits []stackLimit, out []Decision, g *refundGate) (added bool) {
	n := st.Len()
	out = out[:n]
	key = storedKey(key)
	sh, _ := m.shard(key, o == opDecide)
	if sh == nil { // the store never decided: every limit is fresh
		if o == opRefund && !m.openRefund(key, g, now, n) {
			return false
		}
		if g != nil && g.once.Op != OpRefund {
			g.err = ErrRefunded // no lease is held (applyLease)
			return false
		}
		for i, rl := range st.limits {
			out[i] = rl.Peek(&State{}, now)
		}
		return false
	}
	var (
		// The limits' stack keys: views of scratch memory, cloned when inserted. They are kept
		// apart from limits, whose fields are written through pointers, so that escape analysis
		// keeps scratch on the stack.
		keys    [MaxStack]string
		scratch [192]byte
	)
	buf := scratch[:0]
	sh.Lock()
	defer sh.Unlock()
	for i := range st.limits { // reads only: a refund's gate is passed before any change
		l := &limits[i]
		if name := st.names[i]; name == DefaultLimitName {
			keys[i] = key
		} else {
			start := len(buf)
			buf = appendStackKey(buf, key, name)
			// A view of buf: an append that outgrows it leaves the bytes viewed in place.
			keys[i] = unsafe.String(&buf[start], len(buf)-start)
		}
		l.h = sh.buckets.hash(keys[i])
		switch st.algs[i] {
		case AlgorithmTokenBucket, AlgorithmQuota: // compact states, in the bucket table
			if j, ok := sh.buckets.find(keys[i], l.h); ok {
				l.s, l.slot, l.tracked = sh.unpack(sh.buckets.slots[j].state), j, true
			} else if w, ok := sh.windows[keys[i]]; ok {
				l.s, l.other = *w, true // converted (its usage charged) by the decision
			}
		case AlgorithmSlidingWindow, AlgorithmConcurrency:
			if w, ok := sh.windows[keys[i]]; ok {
				l.w, l.tracked = w, true
			} else if j, ok := sh.buckets.find(keys[i], l.h); ok {
				l.s, l.other = sh.unpack(sh.buckets.slots[j].state), true // converted by the decision
			}
		case AlgorithmUnlimited: // NewStack admits none
		}
	}

	switch o {
	case opPeek:
		for i, rl := range st.limits {
			out[i] = peekLimit(rl, &limits[i], now)
		}
		return false
	case opRefund:
		if !m.openRefund(key, g, now, n) {
			return false
		}
		var once *Once
		if g != nil {
			once = &g.once
			if g.once.Op != OpRefund {
				return m.applyLease(st, now, limits, out, g)
			}
		}
		for i, rl := range st.limits {
			l := &limits[i]
			var before Decision
			switch {
			case !l.tracked:
				out[i] = peek(rl, &l.s, now) // nothing to refund
				continue
			case l.w != nil:
				before = peek(rl, l.w, now)
				out[i] = refund(rl, l.w, now, cost, once) // the log only shrinks: its capacity stays
			default:
				before = peek(rl, &l.s, now)
				was, prev := l.s.stamp, sh.buckets.slots[l.slot].state.by
				out[i] = refund(rl, &l.s, now, cost, once)
				sh.buckets.slots[l.slot].state = sh.pack(&l.s, was, prev)
			}
			if g != nil && g.refunded != nil {
				g.refunded[i] = max(0, out[i].Remaining-before.Remaining)
			}
		}
		return false
	case opDecide:
	}

	var seq uint64 // the lease's, shared by the stack's concurrency limits
	if st.HasLeases() {
		seq = nextLeaseSeq()
	}
	allowed := true
	for i, rl := range st.limits {
		l := &limits[i]
		// Direct calls for the two rates, not through the interface (too large to inline).
		switch rl := rl.(type) {
		case *Concurrency:
			if l.w != nil {
				l.undo.bytes = logBytes(l.w)
				out[i] = rl.check(l.w, now, cost) // decided below, once every limit admits
			} else {
				out[i] = rl.take(&l.s, now, cost, seq, nil) // untracked: decided on a fresh state, counted once kept
			}
		case *SlidingWindow:
			if l.w != nil {
				l.undo.save(l.w)
				out[i] = rl.Decide(l.w, now, cost)
			} else {
				out[i] = rl.Decide(&l.s, now, cost) // untracked: decided on a fresh state
			}
		case *TokenBucket:
			l.next = l.s
			out[i] = rl.Decide(&l.next, now, cost)
		default:
			l.next = l.s
			out[i] = decide(rl, &l.next, now, cost)
		}
		allowed = allowed && out[i].Allowed
	}
	if !allowed {
		// No limit is charged: each state is as it was (a conversion included), and a limit that
		// admitted answers its state as it is.
		for i, rl := range st.limits {
			l := &limits[i]
			if _, sw := rl.(*SlidingWindow); sw && l.w != nil { // a concurrency limit was only checked
				l.undo.restore(l.w)
			}
			if out[i].Allowed {
				s := &l.s
				if l.w != nil {
					s = l.w
				} else if !compact(rl) {
					l.s = State{} // untracked: fresh again, or the other algorithm's state as read
					if l.other {
						j, _ := sh.buckets.find(keys[i], l.h)
						l.s = sh.unpack(sh.buckets.slots[j].state)
					}
				}
				out[i] = UnchargedDecision(rl, s, now)
			}
		}
		return false
	}
	// Every limit admitted: write each state. Once the tables changed (an insertion may grow the
	// bucket table, a removal or an eviction shift its entries), slots are found again.
	changed := false
	for i, rl := range st.limits {
		l := &limits[i]
		switch st.algs[i] {
		case AlgorithmTokenBucket, AlgorithmQuota:
			if l.tracked {
				j := l.slot
				if changed {
					j, _ = sh.buckets.find(keys[i], l.h)
				}
				slot := &sh.buckets.slots[j].state
				*slot = sh.pack(&l.next, l.s.stamp, slot.by)
				continue
			}
			if l.other {
				forgetWindow(m, sh, keys[i], now) // the limit changed algorithm: its usage was carried over
			}
			added = m.keepBucket(sh, keys[i], l.h, &l.next) || added
		case AlgorithmSlidingWindow, AlgorithmConcurrency:
			if l.tracked {
				if c, ok := rl.(*Concurrency); ok {
					c.take(l.w, now, cost, seq, st.statsOf(i)) // admits: check did, on this state at this instant
					out[i].Lease = seq
				} else if dropped := l.undo.s.leases; dropped != nil && l.w.leases == nil {
					dropped.drop(now.UnixNano()) // a concurrency limit became a sliding window: its leases ended
				}
				added = m.accountLogGrowth(l.w, l.undo.bytes) || added
				continue
			}
			if l.other {
				j, _ := sh.buckets.find(keys[i], l.h)
				forgetBucket(m, sh, j)
			}
			if l.s.leases != nil {
				l.s.leases.count(st.statsOf(i))
			}
			s := new(State)
			*s = l.s
			added = m.keepWindow(sh, keys[i], s) || added
		case AlgorithmUnlimited:
		}
		changed = true
	}
	return added
}

// openRefund clears g's counts of what each of the n limits refunded (a limit that keeps nothing
// to refund gives nothing back), then passes the refund's gate (admitRefund). applyStack calls
// it on a refund only, under the client's shard lock when the shard exists, before it changes
// anything: a decision pays nothing for refunds.
func (m *Memory) openRefund(key string, g *refundGate, now time.Time, n int) bool {
	if g != nil && g.refunded != nil {
		clear(g.refunded[:n])
	}
	return m.admitRefund(key, g, now)
}

// applyLease releases or extends (g.once.Op) the lease issued at g.once.Issued named
// g.once.Lease, on the concurrency limits of st whose state limits read, under the client's
// shard lock; the other limits are only peeked. It reports whether the store's bytes grew (an
// extension may grow a client's leases). When no limit holds the lease (released, extended,
// expired, dropped or never issued), nothing changed and g.err is ErrRefunded.
func (m *Memory) applyLease(st *Stack, now time.Time, limits []stackLimit, out []Decision, g *refundGate) (added bool) {
	issued, seq := g.once.Issued.UnixNano(), g.once.Lease
	var next uint64 // the extended lease's seq
	if g.once.Op == OpExtend {
		next = nextLeaseSeq()
	}
	found := false
	for i, rl := range st.limits {
		l := &limits[i]
		c, ok := rl.(*Concurrency)
		if !ok || l.w == nil {
			out[i] = peekLimit(rl, l, now) // a rate limit, or no lease kept: nothing to change
			continue
		}
		bytes := logBytes(l.w)
		var places int64
		if g.once.Op == OpExtend {
			places, out[i] = c.extend(l.w, now, issued, seq, next)
		} else {
			places, out[i] = c.release(l.w, now, issued, seq)
		}
		found = found || places > 0
		added = m.accountLogGrowth(l.w, bytes) || added
		if g.refunded != nil {
			g.refunded[i] = places
		}
	}
	if !found {
		g.err = ErrRefunded
	}
	return added
}

// peekLimit answers what limit l would answer for one unit at now, changing nothing.
func peekLimit(rl RateLimiter, l *stackLimit, now time.Time) Decision {
	s := &l.s
	if l.w != nil {
		s = l.w
	}
	return peek(rl, s, now)
}
