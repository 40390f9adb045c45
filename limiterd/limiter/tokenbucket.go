package limiter

import (
	"fmt"
	"math/big"
	"math/bits"
	"time"
)

// TokenBucket is a token bucket of Capacity tokens that starts full and refills continuously at
// RefillRate tokens per RefillPeriod, never above Capacity. A request of cost n takes n tokens if
// the bucket holds them.
//
// It is implemented as GCRA: a client's state is its theoretical arrival time (TAT), the instant
// at which its bucket will be full again. Admitting n tokens moves the TAT n*period/rate later;
// a request is admitted if the new TAT is at most one full refill (capacity*period/rate) ahead of
// now. The TAT is kept exactly as nanoseconds plus a fraction in units of 1/rate ns, so there is
// no floating point and no drift.
//
// A TokenBucket is immutable and safe for concurrent use; build one with NewTokenBucket.
type TokenBucket struct {
	stamp
	capacity int64
	rate     uint64  // tokens per period
	period   uint64  // ns
	tau      instant // time for a full refill: capacity*period/rate
}

type tokenBucketParams struct {
	capacity, rate int64
	period         time.Duration
}

// NewTokenBucket returns the token bucket strategy for the given parameters. It fails if
// capacity or rate is outside [1, 1e9], period outside [1ms, 24h], or a full refill would take
// longer than a year.
func NewTokenBucket(capacity, rate int64, period time.Duration) (*TokenBucket, error) {
	if err := checkPositive("capacity", capacity, MaxCapacity); err != nil {
		return nil, err
	}
	if err := checkPositive("refillRate", rate, MaxCapacity); err != nil {
		return nil, err
	}
	if err := checkPeriod("refillPeriod", period); err != nil {
		return nil, err
	}
	// A full refill, capacity*period/rate, must fit the bound; check before dividing, since the
	// quotient of the largest products does not fit 64 bits, and compare it unsigned, since one
	// of 2^63 ns or more is negative as an int64.
	hi, lo := bits.Mul64(uint64(capacity), uint64(period))
	if hi >= uint64(rate) {
		return nil, errRefillTooSlow
	}
	if q, _ := bits.Div64(hi, lo, uint64(rate)); q > uint64(MaxRefillWindow) {
		return nil, errRefillTooSlow
	}
	tau := mulDiv(uint64(capacity), uint64(period), uint64(rate))
	return intern(tokenBucketParams{capacity, rate, period}, func(id uint64) *TokenBucket {
		b := &TokenBucket{capacity: capacity, rate: uint64(rate), period: uint64(period), tau: tau}
		b.stamp = stamp{rl: b, id: id}
		return b
	}), nil
}

type strategyError string

func (e strategyError) Error() string { return string(e) }

var errRefillTooSlow = strategyError(fmt.Sprintf("capacity*refillPeriod/refillRate (a full refill) must be at most %d days",
	MaxRefillWindow/(24*time.Hour)))

// instant is ns + frac/rate nanoseconds, with frac < rate; it also serves as a duration.
type instant struct {
	ns   int64
	frac uint64
}

// mulDiv returns n*period/rate as an instant (exact quotient and remainder). Callers ensure
// the quotient fits: NewTokenBucket bounds capacity*period/rate (a full refill) to a year, and
// every other n is at most the capacity.
func mulDiv(n, period, rate uint64) instant {
	hi, lo := bits.Mul64(n, period)
	q, r := bits.Div64(hi, lo, rate)
	return instant{ns: int64(q), frac: r}
}

func (b *TokenBucket) add(a, d instant) instant {
	a.ns += d.ns
	a.frac += d.frac
	if a.frac >= b.rate {
		a.frac -= b.rate
		a.ns++
	}
	return a
}

// sub returns a-d for a >= d.
func (b *TokenBucket) sub(a, d instant) instant {
	if a.frac < d.frac {
		a.frac += b.rate
		a.ns--
	}
	a.ns -= d.ns
	a.frac -= d.frac
	return a
}

func less(a, b instant) bool { return a.ns < b.ns || (a.ns == b.ns && a.frac < b.frac) }

// ceil returns d rounded up to whole nanoseconds.
func ceil(d instant) time.Duration {
	if d.frac > 0 {
		return time.Duration(d.ns + 1)
	}
	return time.Duration(d.ns)
}

// tokens returns floor(d*rate/period): how many tokens accrue in d.
func (b *TokenBucket) tokens(d instant) int64 {
	hi, lo := bits.Mul64(uint64(d.ns), b.rate)
	var carry uint64
	lo, carry = bits.Add64(lo, d.frac, 0)
	hi += carry
	q, _ := bits.Div64(hi, lo, b.period)
	return int64(q)
}

// debt returns how far the client's TAT lies ahead of now: 0 when the bucket is full, at most
// one full refill (an empty bucket). A TAT further ahead can only come from a clock that jumped
// backwards; the bucket is then taken as empty, which never admits more than the limit. A fresh
// state (no stamp) owes nothing, whatever now is (before 1970 too: its TAT of 0 is no debt).
func (b *TokenBucket) debt(s *State, now int64) instant {
	if s.stamp == nil {
		return instant{}
	}
	tat := instant{ns: s.tat, frac: uint64(s.frac)}
	at := instant{ns: now}
	if !less(at, tat) {
		return instant{}
	}
	if d := b.sub(tat, at); less(d, b.tau) {
		return d
	}
	return b.tau
}

// Decide implements RateLimiter.
func (b *TokenBucket) Decide(s *State, now time.Time, cost int64) Decision {
	t := now.UnixNano()
	adopt(&b.stamp, s, t)
	debt := b.debt(s, t)
	if cost > b.capacity {
		return b.reject(debt, instant{}) // never admitted: no retry time
	}
	next := b.add(debt, mulDiv(uint64(cost), b.period, b.rate))
	if less(b.tau, next) {
		return b.reject(debt, b.sub(next, b.tau))
	}
	tat := b.add(instant{ns: t}, next)
	s.tat, s.frac, s.stamp = tat.ns, uint32(tat.frac), &b.stamp
	return Decision{
		Allowed:    true,
		Limit:      b.capacity,
		Remaining:  b.tokens(b.sub(b.tau, next)),
		ResetAfter: ceil(next),
	}
}

func (b *TokenBucket) reject(debt, wait instant) Decision {
	return Decision{
		Limit:      b.capacity,
		Remaining:  b.tokens(b.sub(b.tau, debt)),
		ResetAfter: ceil(debt),
		RetryAfter: ceil(wait),
	}
}

// Peek implements RateLimiter.
func (b *TokenBucket) Peek(s *State, now time.Time) Decision {
	t := now.UnixNano()
	c := *s
	adopt(&b.stamp, &c, t)
	debt := b.debt(&c, t)
	d := Decision{Limit: b.capacity, Remaining: b.tokens(b.sub(b.tau, debt)), ResetAfter: ceil(debt)}
	d.Allowed = d.Remaining >= 1
	if !d.Allowed {
		one := b.add(debt, mulDiv(1, b.period, b.rate))
		d.RetryAfter = ceil(b.sub(one, b.tau))
	}
	return d
}

// Refund implements RateLimiter: the TAT moves back by amount tokens' refill time, never before
// now (a full bucket). The TAT moves from where it is, even when it lies more than a full refill
// ahead of now (a refund whose instant lags behind a later decision's): taking the bucket as
// empty there, as a decision does, would give back the units of the later decisions too.
func (b *TokenBucket) Refund(s *State, now time.Time, amount int64) Decision {
	return b.refundBy(s, now, b.refundInterval(amount, 0, 0))
}

// RefundInterval returns how far a refund of amount units of the charge once names moves the
// TAT back, at instant now: amount tokens' refill time (a full refill for the capacity or
// more), and, when once.Cost > 0, at most the refill time of once.Cost tokens less the time
// elapsed since the charge (once.Issued; none when now is before it), exactly (ns plus
// frac/refillRate ns): 0 once the charge has refilled. Without a cost (once.Cost 0) it is
// amount's refill time, as Refund moves it. RefundBy applies it.
//
// Why this is what the history without the charge holds, and never more: let D(s) be the
// bucket's debt (TAT - s, at least 0) at instant s, and D' the debt of the same history in
// which the charge (of c tokens at a, taking c*T, T = period/rate) had been k tokens smaller.
// Right after the charge D = D' + k*T. Both decay at the same rate until D' reaches 0, both
// grow alike at each later admitted decision (a refund of another charge takes the same off
// both, clamped at 0 alike), so D - D' = min(k*T, the least D since the charge). The charge left
// D(a) >= c*T, and D falls by at most the time elapsed, so D(s) >= c*T - (s-a) at every s until
// now, whatever came between (refunds of other charges included: each leaves D at or above its
// own history without its charge, which holds this one's c*T - (s-a)). A refund of
// min(k*T, c*T - (now-a)), never below now, thus leaves D >= D': the client never gets more
// than if the charge had been k tokens smaller. The refund is of time, not of whole tokens:
// a whole-token bound (c - ceil((now-a)/T)) loses the token being refilled, all of a one-token
// charge. And it is the whole charge when nothing came between on a bucket that was full at the
// charge (then D(now) = c*T - (now-a) and D' = 0: the bucket is full again); on a bucket already
// in debt at the charge, the refill since the charge is lost (at most (now-a)/T of a token), since
// the bucket's state cannot tell whether a decision came between (one that found D at 0 would
// make the rest unsafe).
func (b *TokenBucket) RefundInterval(amount int64, once Once, now time.Time) (ns int64, frac uint64) {
	back := b.refundInterval(amount, once.Cost, max(now.Sub(once.Issued), 0))
	return back.ns, back.frac
}

// refundInterval is RefundInterval for a charge of cost tokens (0: none named) elapsed ago.
func (b *TokenBucket) refundInterval(amount, cost int64, elapsed time.Duration) instant {
	back := b.tau // a refund of the capacity or more fills any bucket that is not overdrawn
	if amount < b.capacity {
		back = mulDiv(uint64(amount), b.period, b.rate)
	}
	if cost <= 0 {
		return back
	}
	charged := b.tau // an admitted charge is at most the capacity
	if cost < b.capacity {
		charged = mulDiv(uint64(cost), b.period, b.rate)
	}
	if e := (instant{ns: int64(elapsed)}); !less(e, charged) {
		return instant{} // refilled
	}
	if left := b.sub(charged, instant{ns: int64(elapsed)}); less(left, back) {
		return left
	}
	return back
}

// RefundBy moves the TAT back by ns + frac/refillRate ns (frac < refillRate; RefundInterval),
// never before now, as Refund does, and answers what Peek would after it.
func (b *TokenBucket) RefundBy(s *State, now time.Time, ns int64, frac uint64) Decision {
	return b.refundBy(s, now, instant{ns: ns, frac: frac})
}

func (b *TokenBucket) refundBy(s *State, now time.Time, back instant) Decision {
	t := now.UnixNano()
	adopt(&b.stamp, s, t)
	// The debt unclamped: one carried from other parameters may exceed a full refill, and
	// only the refunded tokens come off it.
	if debt := b.owed(s, t); debt != (instant{}) {
		next := instant{}
		if less(back, debt) {
			next = b.sub(debt, back)
		}
		tat := b.add(instant{ns: t}, next)
		s.tat, s.frac, s.stamp = tat.ns, uint32(tat.frac), &b.stamp
	}
	return b.Peek(s, now)
}

// Fresh implements RateLimiter: the bucket is full.
func (b *TokenBucket) Fresh(s *State, now time.Time) bool {
	return b.debt(s, now.UnixNano()) == instant{}
}

// owed returns how far the client's TAT lies ahead of now, unclamped: 0 when the bucket is
// full; more than a full refill for a debt carried from other parameters (carryFrom) or after a
// clock that jumped backwards. It is at most MaxRefillWindow beyond a full refill.
func (b *TokenBucket) owed(s *State, now int64) instant {
	if s.stamp == nil {
		return instant{}
	}
	tat := instant{ns: s.tat, frac: uint64(s.frac)}
	if at := (instant{ns: now}); less(at, tat) {
		return b.sub(tat, at)
	}
	return instant{}
}

// carryFrom converts a state written by from (the rule for parameter changes: a conversion
// never gives usage back): the tokens the client has used, a fraction of a token included, stay
// used, unclamped. A debt of u tokens (from's debt times from's rate over its period) becomes
// the time the new bucket takes to refill u tokens, rounded up to its resolution (1/rate ns);
// a debt beyond the new capacity just waits longer. The carried debt is capped at
// MaxRefillWindow, after which a bucket of any valid parameters is full again.
func (b *TokenBucket) carryFrom(from *TokenBucket, s *State, now int64) {
	d := from.owed(s, now)
	// In units of 1/b.rate ns: ceil((d.ns*from.rate + d.frac) * b.period / from.period).
	x := new(big.Int).Mul(big.NewInt(d.ns), new(big.Int).SetUint64(from.rate))
	x.Add(x, new(big.Int).SetUint64(d.frac))
	x.Mul(x, new(big.Int).SetUint64(b.period))
	x.Add(x, new(big.Int).SetUint64(from.period-1))
	x.Quo(x, new(big.Int).SetUint64(from.period))
	b.charge(s, now, x)
}

// chargeUnits sets s to a bucket of b that has used u tokens at now (unclamped; capped at
// MaxRefillWindow): another algorithm's usage carried over.
func (b *TokenBucket) chargeUnits(s *State, now, u int64) {
	x := new(big.Int).Mul(big.NewInt(u), new(big.Int).SetUint64(b.period))
	b.charge(s, now, x)
}

// charge sets s to a debt of x/b.rate ns at now, at most MaxRefillWindow.
func (b *TokenBucket) charge(s *State, now int64, x *big.Int) {
	r := new(big.Int).SetUint64(b.rate)
	q, m := new(big.Int).QuoRem(x, r, new(big.Int))
	debt := instant{ns: int64(MaxRefillWindow)}
	if q.IsInt64() && q.Int64() < int64(MaxRefillWindow) {
		debt = instant{ns: q.Int64(), frac: m.Uint64()}
	}
	tat := b.add(instant{ns: now}, debt)
	*s = State{stamp: &b.stamp, tat: tat.ns, frac: uint32(tat.frac)}
}

// usedUnits returns the tokens the client has used at now, a started token counting as used
// (another algorithm carries them over), at most MaxCapacity.
func (b *TokenBucket) usedUnits(s *State, now int64) int64 {
	d := b.owed(s, now)
	x := new(big.Int).Mul(big.NewInt(d.ns), new(big.Int).SetUint64(b.rate))
	x.Add(x, new(big.Int).SetUint64(d.frac))
	x.Add(x, new(big.Int).SetUint64(b.period-1))
	x.Quo(x, new(big.Int).SetUint64(b.period))
	if !x.IsInt64() || x.Int64() > MaxCapacity {
		return MaxCapacity
	}
	return x.Int64()
}

// Algorithm implements RateLimiter.
func (b *TokenBucket) Algorithm() Algorithm { return AlgorithmTokenBucket }

// Limit implements RateLimiter: the capacity.
func (b *TokenBucket) Limit() int64 { return b.capacity }

// Window implements RateLimiter: the time a full refill takes.
func (b *TokenBucket) Window() time.Duration { return ceil(b.tau) }
