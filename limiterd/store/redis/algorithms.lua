-- limiterd's algorithms on Redis: the library of functions the entry script (decide.lua) runs
-- on each limit's state. Go puts the script together (script.go): this library's sections that
-- the call needs, then the entry script, each protocol name replaced by its value from
-- protocol.go; Redis runs it as one script. See the package documentation for the design.
--
-- Redis runs the whole script on every call, making each function anew: the sections are kept
-- apart so that a call makes only the functions it may run, and 1e9 (nanoseconds a second) is
-- written as a literal rather than a local that every function would bind.
--
-- Each function mirrors the code of package limiter step by step: a token bucket's state is its
-- theoretical arrival time (TAT), a sliding window's the log of its admitted instants. Every
-- value they compute is an integer below 2^53, which Lua's doubles hold exactly: Go precomputed
-- every product and quotient.

-- The call: now (seconds, nanoseconds), the milliseconds added to every expiry and the sliding
-- windows' rebase threshold. The entry script sets them before it calls any function below.
local nows, nown, slack, rebase

-- expiry returns the expiry of a key whose state is fresh again in ms milliseconds: ms plus the
-- slack, and at least 1 (SET PX and PEXPIRE refuse 0). It is a number: Redis writes an integer
-- below 2^53 as its digits, and it stays below 2^42 (a refill of at most 366 days).
local function expiry(ms) return math.max(1, ms + slack) end

-- Token buckets. An instant or duration is three exact integers (s, n, f): s seconds + n ns +
-- f/rate ns, with 0 <= n < 1e9 and 0 <= f < rate <= 1e9. The state at the key is the string
-- "<fingerprint> <s> <n> <f>", its TAT, or absent (fresh); a list there is a sliding window's.
local function less(as, an, af, bs, bn, bf)
  if as ~= bs then return as < bs end
  if an ~= bn then return an < bn end
  return af < bf
end
local function add(rate, as, an, af, bs, bn, bf)
  local s, m, f = as + bs, an + bn, af + bf
  if f >= rate then f, m = f - rate, m + 1 end
  if m >= 1e9 then m, s = m - 1e9, s + 1 end
  return s, m, f
end
local function sub(rate, as, an, af, bs, bn, bf) -- a >= b
  local s, m, f = as - bs, an - bn, af - bf
  if f < 0 then f, m = f + rate, m - 1 end
  if m < 0 then m, s = m + 1e9, s - 1 end
  return s, m, f
end

-- tbDebt sets how far the bucket's TAT lies ahead of now: at most tau (a clock that jumped
-- backwards), 0 for a fresh bucket.
local function tbDebt(b)
  b.ds, b.dn, b.df = 0, 0, 0
  if b.ts and less(nows, nown, 0, b.ts, b.tn, b.tf) then
    b.ds, b.dn, b.df = sub(b.rate, b.ts, b.tn, b.tf, nows, nown, 0)
    if not less(b.ds, b.dn, b.df, b.taus, b.taun, b.tauf) then b.ds, b.dn, b.df = b.taus, b.taun, b.tauf end
  end
end

-- tbLoad reads the token bucket at key k whose block of arguments follows ARGV[o]. A state
-- that other parameters wrote is kept as raw (Go converts it: tbConvert); another algorithm's
-- state is other, and the bucket is fresh.
local function tbLoad(k, o)
  -- The fields a decision sets, made at once (growing a table costs more than making it); raw,
  -- converted and other are nil until set.
  local b = {k = k, o = o, fp = ARGV[o + L_FINGERPRINT], rate = tonumber(ARGV[o + TB_RATE]),
    taus = tonumber(ARGV[o + TB_TAU_S]), taun = tonumber(ARGV[o + TB_TAU_N]), tauf = tonumber(ARGV[o + TB_TAU_F]),
    ts = false, tn = 0, tf = 0, ds = 0, dn = 0, df = 0, xs = 0, xn = 0, xf = 0}
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then
    b.other = true
  elseif v then
    local vfp, s, m, f = string.match(v, '^(%S+) (%-?%d+) (%d+) (%d+)$')
    if vfp == b.fp then
      b.ts, b.tn, b.tf = tonumber(s), tonumber(m), tonumber(f)
      tbDebt(b)
    else
      b.raw = v
    end
  end
  return b
end

-- tbAdmits reports whether the bucket admits the cost of its arguments, and keeps the debt it
-- would leave (x).
local function tbAdmits(b)
  local o = b.o
  if ARGV[o + TB_COST_S] == '' then return false end -- the cost exceeds the capacity
  b.xs, b.xn, b.xf = add(b.rate, b.ds, b.dn, b.df,
    tonumber(ARGV[o + TB_COST_S]), tonumber(ARGV[o + TB_COST_N]), tonumber(ARGV[o + TB_COST_F]))
  return not less(b.taus, b.taun, b.tauf, b.xs, b.xn, b.xf)
end

-- tbSet writes the TAT (ts, tn, tf), expiring once the bucket is full again: (s, m, f) from now.
local function tbSet(b, ts, tn, tf, s, m, f)
  redis.call('SET', b.k, string.format('%s %d %d %d', b.fp, ts, tn, tf), 'PX',
    expiry(s * 1000 + math.ceil((m + (f > 0 and 1 or 0)) / 1000000)))
end

-- tbWrite writes a TAT of now + (s, m, f): a debt of (s, m, f).
local function tbWrite(b, s, m, f)
  local ts, tn, tf = add(b.rate, nows, nown, 0, s, m, f)
  tbSet(b, ts, tn, tf, s, m, f)
end

-- tbReply answers, at reply[at + R_*], the state the decision was made on: fresh, a TAT, or the
-- raw state Go must convert. Go derives the decision from it with the in-memory code.
local function tbReply(reply, at, b)
  if b.raw then
    reply[at + R_STATE], reply[at + R_RAW], reply[at + R_TAT_N], reply[at + R_TAT_F] = STATE_RAW, b.raw, 0, 0
  elseif b.ts then
    reply[at + R_STATE], reply[at + R_TAT_S], reply[at + R_TAT_N], reply[at + R_TAT_F] = STATE_TAT, b.ts, b.tn, b.tf
  else
    reply[at + R_STATE], reply[at + R_TAT_S], reply[at + R_TAT_N], reply[at + R_TAT_F] = STATE_FRESH, 0, 0, 0
  end
end


-- Token buckets: conversions and refunds, in the scripts of the calls that need them (a call
-- that refunds or carries a conversion: script.go).
-- tbConvert takes the TAT Go converted the raw state from to (s "": fresh), if the key still
-- holds that state.
local function tbConvert(b, from, s, m, f)
  if b.raw ~= from then return end
  b.raw, b.converted = false, true
  if s ~= '' then b.ts, b.tn, b.tf = tonumber(s), tonumber(m), tonumber(f) end
  tbDebt(b)
end

-- tbKeep writes the state read, when it differs from the key's: a conversion (kept even when
-- full, as limiter.Memory keeps it: after a clock step backwards it still counts as used; a
-- fresh one deletes the key).
local function tbKeep(b)
  if not b.converted then return end
  if b.ts then tbSet(b, b.ts, b.tn, b.tf, b.ds, b.dn, b.df) else redis.call('DEL', b.k) end
end

-- tbRefund moves the TAT back by the refund's interval (the cost arguments), never before now,
-- from where it is: a TAT more than tau ahead (a refund whose now lags behind a later
-- decision's) moves back by the interval only, as limiter.TokenBucket.Refund does.
local function tbRefund(b)
  if b.ds == 0 and b.dn == 0 and b.df == 0 then return tbKeep(b) end
  local o = b.o
  local cs, cn, cf = tonumber(ARGV[o + TB_COST_S]), tonumber(ARGV[o + TB_COST_N]), tonumber(ARGV[o + TB_COST_F])
  local ds, dn, df = sub(b.rate, b.ts, b.tn, b.tf, nows, nown, 0) -- the debt, not bounded by tau
  local rs, rn, rf = 0, 0, 0
  if less(cs, cn, cf, ds, dn, df) then rs, rn, rf = sub(b.rate, ds, dn, df, cs, cn, cf) end
  tbWrite(b, rs, rn, rf)
end

-- Sliding windows. The state at the key is the list [fingerprint, epoch, base, at_1, cum_1,
-- ..., at_n, cum_n], oldest first: epoch is Unix seconds, at_i an admitted instant in ns since
-- the epoch, cum_i the running total of units admitted up to it, base the total just before
-- at_1. Absent: fresh; a string there is a token bucket's state. Every duration is at most a
-- window (24h < 2^47 ns).

local function int(x) return string.format('%d', x) end

-- search returns the first i in [lo, hi) where past(i) is false, else hi (past must be true
-- then false along [lo, hi)).
local function search(lo, hi, past)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if past(mid) then lo = mid + 1 else hi = mid end
  end
  return lo
end
local function swAt(w, i) return tonumber(redis.call('LINDEX', w.k, 3 + 2 * i)) end
local function swCum(w, i) return tonumber(redis.call('LINDEX', w.k, 4 + 2 * i)) end

-- swLoad reads the sliding window at key k whose block of arguments follows ARGV[o]: its
-- entries still in the window at the decision's instant, converted when other parameters wrote
-- them (carryFrom). Another algorithm's state is other, and the window is fresh.
local function swLoad(k, o)
  local w = {k = k, fp = ARGV[o + L_FINGERPRINT], limit = tonumber(ARGV[o + SW_LIMIT]),
    window = tonumber(ARGV[o + SW_WINDOW]), epoch = nows, base = 0, n = 0, convert = false,
    other = false, list = false, now = 0, t = 0, lastAt = 0, lastCum = 0, first = 0, live = 0, used = 0}
  local h = redis.pcall('LRANGE', k, 0, 2)
  w.other = h.err ~= nil
  w.list = not w.other and #h > 0 -- a log: written over by an admission, deleted once empty
  if not w.other and #h == 3 then
    w.epoch, w.base = tonumber(h[2]), tonumber(h[3])
    w.n = (redis.call('LLEN', k) - 3) / 2
    w.convert = h[1] ~= w.fp
  end
  -- now relative to the epoch. It is exact within 104 days of the epoch; further away every
  -- entry is far outside any window, and comparisons with the inexact value still say so.
  w.now = (nows - w.epoch) * 1e9 + nown
  w.t = w.now -- the decision's instant: never before the newest entry (clamp)
  if w.n > 0 then
    w.lastAt = tonumber(redis.call('LINDEX', k, -2))
    w.lastCum = tonumber(redis.call('LINDEX', k, -1))
    if w.lastAt > w.t then w.t = w.lastAt end
  end
  -- Entries [0, first) left the window. Instants and running totals never decrease along the
  -- log, so binary searches find first in O(log n) reads, never walking the expired entries a
  -- peek leaves in place.
  w.first = search(0, w.n, function(j) return swAt(w, j) + w.window <= w.t end)
  if w.first > 0 then w.base = swCum(w, w.first - 1) end
  if w.convert and w.first < w.n then -- keep at most limit units, dropping the oldest
    local excess = w.lastCum - w.base - w.limit
    if excess > 0 then
      w.base = w.base + excess
      w.first = search(w.first, w.n, function(j) return swCum(w, j) <= w.base end)
    end
  end
  w.live = w.n - w.first
  if w.live > 0 then w.used = w.lastCum - w.base end
  return w
end

local function swAdmits(w, c) return c <= w.limit and w.used + c <= w.limit end

-- swHead rewrites the log's header: the entries that left the window dropped, a conversion's
-- fingerprint and base.
local function swHead(w)
  redis.call('LPOP', w.k, 3 + 2 * w.first)
  redis.call('LPUSH', w.k, int(w.base), int(w.epoch), w.fp)
end

-- swAdmit appends the cost c to the log.
local function swAdmit(w, c)
  if w.live == 0 then
    if w.list then redis.call('DEL', w.k) end
    w.epoch, w.base, w.now, w.t = nows, 0, nown, nown
    redis.call('RPUSH', w.k, w.fp, int(w.epoch), 0, int(w.t), int(c))
    w.lastAt, w.lastCum = w.t, c
  else
    if w.first > 0 or w.convert then swHead(w) end
    w.lastCum = w.lastCum + c
    if w.lastAt == w.t then
      redis.call('LSET', w.k, -1, int(w.lastCum))
    else
      redis.call('RPUSH', w.k, int(w.t), int(w.lastCum))
      w.lastAt = w.t
    end
    if w.lastAt > rebase or w.lastCum > rebase then
      -- Rewrite the log relative to the oldest entry's second, with base 0.
      local all = redis.call('LRANGE', w.k, 3, -1)
      local shift = math.floor(tonumber(all[1]) / 1e9)
      for j = 1, #all, 2 do
        all[j] = int(tonumber(all[j]) - shift * 1e9)
        all[j + 1] = int(tonumber(all[j + 1]) - w.base)
      end
      redis.call('DEL', w.k)
      redis.call('RPUSH', w.k, w.fp, int(w.epoch + shift), 0)
      for j = 1, #all, 4000 do
        redis.call('RPUSH', w.k, unpack(all, j, math.min(j + 3999, #all)))
      end
      w.epoch, w.base, w.now, w.lastAt = w.epoch + shift, 0, w.now - shift * 1e9, w.lastAt - shift * 1e9
    end
  end
  -- The key lives until the window is empty again, on the clock of now (not the clamped t).
  redis.call('PEXPIRE', w.k, expiry(math.ceil((w.lastAt + w.window - w.now) / 1000000)))
end

-- swReply answers, at reply[at + R_*], for the log as it is and a cost c that the limit admits
-- on its own or not: whether, the units remaining, and the ns until the window is empty and
-- until the cost fits.
local function swReply(reply, at, w, c, admitted)
  local resetAfter, retryAfter = 0, 0
  if w.used > 0 then
    resetAfter = w.lastAt + w.window - w.t
    if not admitted and c <= w.limit then
      -- The cost fits once the oldest entries holding used+c-limit units have left the window:
      -- the first entry whose running total reaches that.
      local need = w.base + w.used + c - w.limit
      local lo, hi = w.first, w.n - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if swCum(w, mid) >= need then hi = mid else lo = mid + 1 end
      end
      retryAfter = swAt(w, lo) + w.window - w.t
    end
  end
  reply[at + R_ADMITTED] = admitted and ADMITTED or REJECTED
  reply[at + R_REMAINING] = math.max(0, w.limit - w.used)
  reply[at + R_RESET_AFTER] = resetAfter
  reply[at + R_RETRY_AFTER] = retryAfter
end


-- Sliding windows: refunds, in the scripts of the calls that refund (script.go).
-- swKeep writes what reading the log changed: the entries that left the window dropped (the
-- whole log once none is left), a conversion.
local function swKeep(w)
  if w.live == 0 then
    if w.list then redis.call('DEL', w.k) end
  elseif w.first > 0 or w.convert then
    swHead(w)
  end
end

-- swRefund forgets the newest c units in the window (unpush).
local function swRefund(w, c)
  local back = c
  while back > 0 and w.live > 0 do
    local prev = w.base
    if w.live > 1 then prev = swCum(w, w.n - 2) end
    if w.lastCum - prev > back then
      w.lastCum = w.lastCum - back
      redis.call('LSET', w.k, -1, int(w.lastCum))
      back = 0
    else
      back = back - (w.lastCum - prev)
      redis.call('RPOP', w.k, 2)
      w.n, w.live = w.n - 1, w.live - 1
      if w.live > 0 then w.lastAt, w.lastCum = swAt(w, w.n - 1), swCum(w, w.n - 1) end
    end
  end
  w.used = 0
  if w.live > 0 then w.used = w.lastCum - w.base end
  swKeep(w)
end
