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

-- The call's now (seconds, nanoseconds). The entry script sets it before it calls any function
-- below.
local nows, nown

-- A key whose state is fresh again in ms milliseconds expires in ms plus the slack (ARG_SLACK_MS,
-- parsed where a state is written: a rejection never parses it), and at least 1 (SET PX and
-- PEXPIRE refuse 0): math.max(1, ms + tonumber(ARGV[ARG_SLACK_MS])), written where each
-- algorithm writes rather than as a function that every call would make. It is a number: Redis
-- writes an integer below 2^53 as its digits, and it stays below 2^42 (a refill of at most 366
-- days).

-- Token buckets. An instant or duration is three exact integers (s, n, f): s seconds + n ns +
-- f/rate ns, with 0 <= n < 1e9 and 0 <= f < rate <= 1e9. The state at the key is the string
-- "<fingerprint> <s> <n> <f>", its TAT, or absent (fresh); a list there is a sliding window's.
-- A conversion never gives usage back (the package documentation): a token bucket's state that
-- other parameters wrote, or a sliding window's log, is answered to Go, which converts it
-- exactly (tbConvert).
--
-- This section is the decision: the script makes its functions before the entry script's own
-- way for a decision on one token bucket (decide.lua), the most common call, which makes no other
-- function and no table but its reply. They take and return numbers, not a bucket's table.

-- tbState matches a token bucket's state, "<fingerprint> <s> <n> <f>" (tbSet writes it), into its
-- four fields: read by the entry script's own way (decide.lua) and by tbLoad.
local tbState = '^(%S+) (%-?%d+) (%d+) (%d+)$'

-- tbDebt reports whether the bucket whose block of arguments follows ARGV[o], at the TAT (ts, tn,
-- tf; ts false: fresh), admits the cost of its block, and returns the debt it would leave: the
-- debt owed (how far the TAT lies ahead of now, 0 if it does not) plus the cost. TokenBucket.debt
-- clamps the debt owed to tau; for a decision's cost (above 0: a cost of 0 is a peek) the clamp
-- changes nothing: the debt left exceeds tau with it exactly when it does without it, and it is
-- written only when it does not.
local function tbDebt(o, ts, tn, tf)
  if ARGV[o + TB_COST_S] == '' then return false end -- the cost exceeds the capacity
  local s, m, f = tonumber(ARGV[o + TB_COST_S]), tonumber(ARGV[o + TB_COST_N]), tonumber(ARGV[o + TB_COST_F])
  if ts and (ts > nows or ts == nows and (tn > nown or tn == nown and tf > 0)) then
    -- Plus the TAT, less now: each sum of limbs is carried once (f < 2 rate, -1e9 < m < 2e9).
    s, m, f = s + ts - nows, m + tn - nown, f + tf
    local rate = tonumber(ARGV[o + TB_RATE])
    if f >= rate then f, m = f - rate, m + 1 end
    if m >= 1e9 then m, s = m - 1e9, s + 1 elseif m < 0 then m, s = m + 1e9, s - 1 end
  end
  local taus, taun = tonumber(ARGV[o + TB_TAU_S]), tonumber(ARGV[o + TB_TAU_N])
  return s < taus or s == taus and (m < taun or m == taun and f <= tonumber(ARGV[o + TB_TAU_F])), s, m, f
end

-- tbSet writes at key k the TAT (ts, tn, tf) of the strategy fp, by default now + (s, m, f) (a
-- debt of (s, m, f)), expiring once the bucket is full again: (s, m, f) from now.
local function tbSet(k, fp, s, m, f, ts, tn, tf)
  if not ts then
    ts, tn, tf = nows + s, nown + m, f
    if tn >= 1e9 then tn, ts = tn - 1e9, ts + 1 end
  end
  redis.call('SET', k, string.format('%s %d %d %d', fp, ts, tn, tf), 'PX',
    math.max(1, s * 1000 + math.ceil((m + (f > 0 and 1 or 0)) / 1000000) + tonumber(ARGV[ARG_SLACK_MS])))
end

-- Sliding-window logs read by the other algorithms. logOfOther reads the list at key k as a
-- token bucket or a quota finds it there: raw identifies the log (its header and newest entry)
-- for Go to convert (tbConvert, qtConvert), and used is the units it holds in its own window at
-- now (SlidingWindow.usedUnits), which Go charges to the new algorithm. nil when k holds a list
-- that is no such log. One function for both, in a section of their scripts only: a conversion
-- is rare, but the lean script must read it, since only Redis knows what the key holds.
local function logOfOther(k)
  local h = redis.pcall('LRANGE', k, 0, 2)
  if h.err ~= nil then -- a concurrency limit's leases: raw, for Go to count (leasesUsed)
    local z = redis.pcall('ZRANGE', k, 0, -1, 'WITHSCORES')
    if z.err == nil then return 'cc ' .. table.concat(z, ' '), nil end
  end
  if h.err ~= nil or #h ~= 3 then return nil, nil end
  local n = (redis.call('LLEN', k) - 3) / 2
  local lastAt, lastCum = redis.call('LINDEX', k, -2), redis.call('LINDEX', k, -1)
  local raw, used = table.concat(h, ' ') .. ' ' .. n .. ' ' .. lastAt .. ' ' .. lastCum, 0
  local window = tonumber(string.match(h[1], '^sw:%d+:(%d+)$') or '')
  if window and n > 0 then
    -- Entries [0, lo) left the window at t, now clamped to the newest entry.
    local t = math.max((nows - tonumber(h[2])) * 1e9 + nown, tonumber(lastAt))
    local lo, hi = 0, n
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if tonumber(redis.call('LINDEX', k, 3 + 2 * mid)) + window <= t then lo = mid + 1 else hi = mid end
    end
    local base = tonumber(h[3])
    if lo > 0 then base = tonumber(redis.call('LINDEX', k, 4 + 2 * (lo - 1))) end
    if lo < n then used = tonumber(lastCum) - base end
  end
  return raw, used
end

-- Token buckets: a limit of the general way (a stack, a peek, a refund, a conversion), in a
-- table. tbLoad reads the token bucket at key k whose block of arguments follows ARGV[o]. A state
-- that other parameters wrote is kept as raw (Go converts it: tbConvert). Another algorithm's
-- state is other: a sliding window's log is raw too, identified by its header and newest entry,
-- with the units it holds in its own window at now (used: SlidingWindow.usedUnits), which Go
-- charges to the bucket; any other value is fresh.
local function tbLoad(k, o)
  -- The fields a decision sets, made at once (growing a table costs more than making it), and
  -- few enough for the table's smaller size (16); raw, used, converted, other and the stack's
  -- tb and admits are nil until set.
  local b = {k = k, o = o, fp = ARGV[o + L_FINGERPRINT], rate = tonumber(ARGV[o + TB_RATE]),
    ts = false, tn = 0, tf = 0, xs = 0, xn = 0, xf = 0}
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then
    b.other = true
    b.raw, b.used = logOfOther(k)
  elseif v then
    local vfp, s, m, f = string.match(v, tbState)
    if vfp == b.fp then
      b.ts, b.tn, b.tf = tonumber(s), tonumber(m), tonumber(f)
    else
      b.raw = v
    end
  end
  return b
end

-- tbAdmits reports whether the bucket admits the cost of its arguments, and keeps the debt it
-- would leave (x: tbDebt).
local function tbAdmits(b)
  local admits
  admits, b.xs, b.xn, b.xf = tbDebt(b.o, b.ts, b.tn, b.tf)
  return admits
end

-- tbReply answers, at reply[at + R_*], the state the decision was made on: fresh, a TAT (charged
-- when converted from another algorithm's state: a refund has nothing to refund on it), or the
-- raw state Go must convert (with a sliding window's used units). Go derives the decision from it
-- with the in-memory code.
local function tbReply(reply, at, b)
  if b.raw and b.used then
    reply[at + R_STATE], reply[at + R_RAW], reply[at + R_USED], reply[at + R_TAT_F] = STATE_USED, b.raw, b.used, 0
  elseif b.raw then
    reply[at + R_STATE], reply[at + R_RAW], reply[at + R_TAT_N], reply[at + R_TAT_F] = STATE_RAW, b.raw, 0, 0
  elseif b.ts then
    local state = STATE_TAT
    if b.other then state = STATE_CHARGED end
    reply[at + R_STATE], reply[at + R_TAT_S], reply[at + R_TAT_N], reply[at + R_TAT_F] = state, b.ts, b.tn, b.tf
  else
    reply[at + R_STATE], reply[at + R_TAT_S], reply[at + R_TAT_N], reply[at + R_TAT_F] = STATE_FRESH, 0, 0, 0
  end
end

-- Token buckets: conversions and refunds, in the scripts of the calls that need them (a call
-- that refunds or carries a conversion: script.go).
local function less(as, an, af, bs, bn, bf)
  if as ~= bs then return as < bs end
  if an ~= bn then return an < bn end
  return af < bf
end
local function sub(rate, as, an, af, bs, bn, bf) -- a >= b
  local s, m, f = as - bs, an - bn, af - bf
  if f < 0 then f, m = f + rate, m - 1 end
  if m < 0 then m, s = m + 1e9, s - 1 end
  return s, m, f
end

-- tbOwed returns how far the bucket's TAT lies ahead of now, unclamped: beyond a full refill for
-- a debt carried from other parameters or after a clock that jumped backwards (TokenBucket.owed);
-- 0 for a fresh bucket. It is computed where it is used, not kept in the bucket's table: each
-- field more a decision makes costs Redis more than the subtraction.
local function tbOwed(b)
  if b.ts and less(nows, nown, 0, b.ts, b.tn, b.tf) then return sub(b.rate, b.ts, b.tn, b.tf, nows, nown, 0) end
  return 0, 0, 0
end

-- tbConvert takes the TAT Go converted the raw state from to (s "": fresh), if the key still
-- holds that state: another token bucket's debt carried exactly and unclamped, or a sliding
-- window's used units charged (TokenBucket.Charged).
local function tbConvert(b, from, s, m, f)
  if b.raw ~= from then return end
  b.raw, b.converted = false, true
  if s ~= '' then b.ts, b.tn, b.tf = tonumber(s), tonumber(m), tonumber(f) end
end

-- tbKeep writes the state read, when it differs from the key's: a conversion (kept even when
-- full, as limiter.Memory keeps it: after a clock step backwards it still counts as used; a
-- fresh one deletes the key), expiring once the bucket is full again: after the debt owed,
-- unclamped (a debt carried beyond a full refill must not expire before it is repaid).
local function tbKeep(b)
  if not b.converted then return end
  if not b.ts then
    redis.call('DEL', b.k)
    return
  end
  local os, on, of = tbOwed(b)
  tbSet(b.k, b.fp, os, on, of, b.ts, b.tn, b.tf)
end

-- tbRefund moves the TAT back by the refund's interval (the cost arguments), never before now:
-- off the debt owed, unclamped, as TokenBucket.Refund (only the refunded tokens come off a
-- debt carried beyond a full refill).
local function tbRefund(b)
  local os, on, of = tbOwed(b)
  if os == 0 and on == 0 and of == 0 then return tbKeep(b) end
  local o = b.o
  local cs, cn, cf = tonumber(ARGV[o + TB_COST_S]), tonumber(ARGV[o + TB_COST_N]), tonumber(ARGV[o + TB_COST_F])
  local rs, rn, rf = 0, 0, 0
  if less(cs, cn, cf, os, on, of) then rs, rn, rf = sub(b.rate, os, on, of, cs, cn, cf) end
  tbSet(b.k, b.fp, rs, rn, rf)
end

-- Sliding windows. The state at the key is the list [head, epoch, base, at_1, cum_1, ...,
-- at_n, cum_n], oldest first: epoch is Unix seconds, at_i an admitted instant in ns since the
-- epoch, cum_i the running total of units admitted up to it, base the total just before at_1.
-- Absent: fresh; a string there is a token bucket's state, raw until Go charges its used units
-- (swConvert). Every duration is at most a window (24h < 2^47 ns).
--
-- The head is the fingerprint "sw:<limit>:<window>", or the fingerprint carrying the newest
-- entry, "sw:<at_n><cum_n><limit>:<window>" with at_n and cum_n in 16 digits each (swNewest): a
-- decision then reads the newest entry with the head, and drops the entries that left the
-- window with its rewrite, in one command fewer (swLoad, swAdmit). A head that carries the
-- newest entry carries it as it is: every write that changes the newest entry rewrites such a
-- head (swHeadOf). It is still "sw:<digits>:<window>", so the previous release's script, which
-- knew the plain fingerprint only, decides exactly on it during a rolling upgrade: it reads its
-- window (a conversion from the same window keeps every entry that is still in it), and every
-- write of its rewrites the head with the plain fingerprint (see TestReleasesMixMatchesMemory).

local function int(x) return string.format('%d', x) end

-- swNewest matches a head that carries the newest entry: its instant, its running total, and
-- the fingerprint after "sw:". A plain fingerprint's limit has at most 6 digits.
local swNewest = '^sw:(%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)(%d+:%d+)$'

-- swHeadOf returns the head to write for the log as w now holds it: carrying the newest entry
-- when the log holds 6 entries or more (n false: maybe), which a decision reads with the head
-- rather than from the tail; else the fingerprint, since the decision reads the whole log.
local function swHeadOf(w)
  if (not w.n or w.n >= 6) and w.lastAt >= 0 and w.lastAt < 1e16 and w.lastCum >= 0 and w.lastCum < 1e16 then
    return string.format('sw:%016d%016d%s', w.lastAt, w.lastCum, string.sub(w.fp, 4))
  end
  return w.fp
end

-- search returns the first i in [lo, hi) where past(i) is false, else hi (past must be true
-- then false along [lo, hi)). It gallops from lo (lo, lo + 2, lo + 6, ...) before it bisects:
-- O(log k) reads when i is k past lo. The entries that left a window are the oldest, and few
-- but after an idle spell: a log whose oldest entry is in the window costs one read, not
-- log n reads from the middle of the list (each a walk through it).
local function search(lo, hi, past)
  local step = 1
  while lo + step - 1 < hi do
    local probe = lo + step - 1
    if not past(probe) then
      hi = probe
      break
    end
    lo, step = probe + 1, step * 2
  end
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
-- them (carryFrom). Another algorithm's state is other: a token bucket's is raw, for Go to
-- convert (swConvert); until then, as any other value, the window is fresh.
--
-- Each Redis command a script calls costs more than the elements it answers, so a decision reads
-- the log in one or two: its header with its 6 oldest entries (one LRANGE), then its newest
-- entry (one LRANGE), unless the first held the whole log or a head that carries the newest
-- entry (carried). The first live entry is among the oldest ones but after an idle spell: an
-- admission leaves up to 2 expired entries in place (swAdmit), as a peek does. Only when it is
-- not does the decision read the log's length (LLEN) and search the rest. n, the log's
-- entries, is false until read (swLen); first is false when every entry left the window and n
-- is unread.
local function swLoad(k, o)
  local w = {k = k, fp = ARGV[o + L_FINGERPRINT], limit = tonumber(ARGV[o + SW_LIMIT]),
    window = tonumber(ARGV[o + SW_WINDOW]), epoch = nows, base = 0, n = 0, convert = false,
    other = false, raw = false, charged = false, list = false, now = 0, t = 0, lastAt = 0, lastCum = 0,
    first = 0, live = 0, used = 0, carried = false}
  local h = redis.pcall('LRANGE', k, 0, 14)
  w.other = h.err ~= nil
  if w.other then
    local v = redis.pcall('GET', k)
    if type(v) == 'string' then
      w.raw = v
    else -- a concurrency limit's leases: raw, for Go to count (leasesUsed)
      local z = redis.pcall('ZRANGE', k, 0, -1, 'WITHSCORES')
      if z.err == nil then w.raw = 'cc ' .. table.concat(z, ' ') end
    end
  end
  w.list = not w.other and #h > 0 -- a log: written over by an admission, deleted once empty
  local m = 0 -- the entries h holds
  if not w.other and #h >= 3 then
    w.epoch, w.base = tonumber(h[2]), tonumber(h[3])
    m = (#h - 3) / 2
    w.n = m
    if #h == 15 then w.n = false end -- maybe more
    local fp = h[1]
    if fp ~= w.fp then
      local at, cum, params = string.match(fp, swNewest)
      if at then fp, w.carried, w.lastAt, w.lastCum = 'sw:' .. params, true, tonumber(at), tonumber(cum) end
    end
    w.convert = fp ~= w.fp
  end
  -- now relative to the epoch. It is exact within 104 days of the epoch; further away every
  -- entry is far outside any window, and comparisons with the inexact value still say so.
  w.now = (nows - w.epoch) * 1e9 + nown
  w.t = w.now -- the decision's instant: never before the newest entry (clamp)
  if m > 0 then
    if w.n then
      w.lastAt, w.lastCum = tonumber(h[#h - 1]), tonumber(h[#h])
    elseif not w.carried then
      local tail = redis.call('LRANGE', k, -2, -1)
      w.lastAt, w.lastCum = tonumber(tail[1]), tonumber(tail[2])
    end
    if w.lastAt > w.t then w.t = w.lastAt end
    -- Entries [0, first) left the window. Instants and running totals never decrease along
    -- the log: unless the newest entry left the window too (then every entry did), first lies
    -- before it.
    if w.lastAt + w.window <= w.t then
      w.first, w.base = w.n, w.lastCum
    else
      -- Under other parameters (convert), the entries that had left their window at their
      -- newest entry, which their admission left in place, are gone too (carryFrom keeps what
      -- the old window held): at most 2, among those read.
      local old = w.convert and tonumber(string.match(h[1], '^sw:%d+:(%d+)$') or '')
      local j = 0
      while j < m and (tonumber(h[4 + 2 * j]) + w.window <= w.t or old and tonumber(h[4 + 2 * j]) + old <= w.lastAt) do
        j = j + 1
      end
      if j == m then -- every entry read left the window: search the rest, O(log k) reads
        w.n = (redis.call('LLEN', k) - 3) / 2
        j = search(m, w.n - 1, function(i) return swAt(w, i) + w.window <= w.t end)
        w.base = swCum(w, j - 1)
      elseif j > 0 then
        w.base = tonumber(h[5 + 2 * (j - 1)])
      end
      w.first, w.live = j, 1
      if w.n then w.live = w.n - j end
      -- A conversion keeps every entry still in the window, beyond the limit too: it never
      -- gives usage back (SlidingWindow.carryFrom).
      w.used = w.lastCum - w.base
    end
  end
  return w
end

-- swLen reads the log's length, when swLoad did not (n false), and the entries live.
local function swLen(w)
  if w.n then return end
  w.n = (redis.call('LLEN', w.k) - 3) / 2
  w.first = w.first or w.n
  w.live = w.n - w.first
end

local function swAdmits(w, c) return c <= w.limit and w.used + c <= w.limit end

-- swHead rewrites the log's header: the entries that left the window dropped, a conversion's
-- fingerprint and base, the head of the log as w holds it (swHeadOf: w's newest entry is the one
-- the log holds once the caller's write is done). The entries left are renumbered from 0, as the
-- reply's search reads them after a refund.
local function swHead(w)
  redis.call('LPOP', w.k, 3 + 2 * w.first)
  if w.n then w.n = w.n - w.first end
  w.first = 0
  redis.call('LPUSH', w.k, int(w.base), int(w.epoch), swHeadOf(w))
end

-- swAdmit appends the cost c to the log. It drops the entries that left the window only once 3
-- have (or the header changes anyway): fewer stay in place, read with the header (swLoad), which
-- saves a decision the two commands that rewrite the header. Those two write the newest entry
-- into the head as well, which a decision on a head that carries it rewrites anyway (one
-- command, instead of reading the newest entry). On a log of 6 entries or more whose head does
-- not carry the newest entry (the tail read), the decision writes such a head instead of
-- dropping 3 to 5 entries: the next decision drops them, without reading the tail.
local function swAdmit(w, c)
  if w.live == 0 then
    if w.list then redis.call('DEL', w.k) end
    w.epoch, w.base, w.now, w.t = nows, 0, nown, nown
    redis.call('RPUSH', w.k, w.fp, int(w.epoch), 0, int(w.t), int(c))
    w.lastAt, w.lastCum = w.t, c
  else
    if w.charged then -- the log of another algorithm's usage (swConvert), written now
      redis.call('RPUSH', w.k, w.fp, int(w.epoch), int(w.base), int(w.lastAt), int(w.lastCum))
    end
    local append = w.lastAt ~= w.t -- else the newest entry's total grows
    w.lastAt, w.lastCum = w.t, w.lastCum + c
    if append and w.n then w.n = w.n + 1 end
    if w.first >= 3 and (w.carried or w.n) or w.convert then
      swHead(w)
    elseif w.carried or w.first >= 3 then
      redis.call('LSET', w.k, 0, swHeadOf(w))
    end
    if append then
      redis.call('RPUSH', w.k, int(w.t), int(w.lastCum))
    else
      redis.call('LSET', w.k, -1, int(w.lastCum))
    end
    -- The rebase threshold (2^52 but in tests) is parsed here, where it is compared: a decision
    -- on a token bucket or a quota never pays for parsing its 16 digits.
    local rebase = tonumber(ARGV[ARG_REBASE])
    if w.lastAt > rebase or w.lastCum > rebase then
      -- Rewrite the live entries relative to the oldest one's second, with base 0.
      local all = redis.call('LRANGE', w.k, 3 + 2 * w.first, -1)
      local shift = math.floor(tonumber(all[1]) / 1e9)
      for j = 1, #all, 2 do
        all[j] = int(tonumber(all[j]) - shift * 1e9)
        all[j + 1] = int(tonumber(all[j + 1]) - w.base)
      end
      w.epoch, w.now, w.lastAt, w.lastCum = w.epoch + shift, w.now - shift * 1e9, w.lastAt - shift * 1e9, w.lastCum - w.base
      w.base, w.n, w.first = 0, #all / 2, 0
      redis.call('DEL', w.k)
      redis.call('RPUSH', w.k, swHeadOf(w), int(w.epoch), 0)
      for j = 1, #all, 4000 do
        redis.call('RPUSH', w.k, unpack(all, j, math.min(j + 3999, #all)))
      end
    end
  end
  -- The key lives until the window is empty again, on the clock of now (not the clamped t).
  redis.call('PEXPIRE', w.k, math.max(1, math.ceil((w.lastAt + w.window - w.now) / 1000000) + tonumber(ARGV[ARG_SLACK_MS])))
end

-- swReply answers, at reply[at + R_*], for the log as it is and a cost c that the limit admits
-- on its own or not: whether, the units remaining, and the ns until the window is empty and
-- until the cost fits.
local function swReply(reply, at, w, c, admitted)
  local resetAfter, retryAfter = 0, 0
  if w.used > 0 then
    resetAfter = w.lastAt + w.window - w.t
    if not admitted and c <= w.limit then
      swLen(w)
      -- The cost fits once the oldest entries holding used+c-limit units have left the window:
      -- the first entry whose running total reaches that.
      local need = w.base + w.used + c - w.limit
      local lo, hi = w.first, w.n - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if swCum(w, mid) >= need then hi = mid else lo = mid + 1 end
      end
      -- The newest entry is read already (and is the only one of a charged log).
      if lo == w.n - 1 then retryAfter = w.lastAt + w.window - w.t else retryAfter = swAt(w, lo) + w.window - w.t end
    end
  end
  reply[at + R_ADMITTED] = admitted and ADMITTED or REJECTED
  reply[at + R_REMAINING] = math.max(0, w.limit - w.used)
  reply[at + R_RESET_AFTER] = resetAfter
  reply[at + R_RETRY_AFTER] = retryAfter
end


-- Sliding windows: conversions and refunds, in the scripts of the calls that need them (a call
-- that refunds or carries a conversion: script.go).
-- swConvert takes the units u Go charged for the raw state from, a token bucket's (its used
-- tokens: limiter.UsedUnits), at the instant (s, m) the script read it, if the key still holds
-- that state: a log of one entry of u units then (SlidingWindow.chargeUnits), kept here until an
-- admission writes it (swAdmit), since a rejection writes nothing.
local function swConvert(w, from, s, m, u)
  if w.raw ~= from then return end
  w.raw = false
  u = tonumber(u)
  if u <= 0 then return end -- fresh
  w.epoch, w.base, w.n, w.lastAt, w.lastCum = tonumber(s), 0, 1, tonumber(m), u
  w.now = (nows - w.epoch) * 1e9 + nown
  w.t = math.max(w.now, w.lastAt)
  if w.lastAt + w.window > w.t then
    w.charged, w.live, w.used = true, 1, u
  else -- it left the window already
    w.first, w.base = 1, u
  end
end

-- swKeep writes, after a refund, what reading the log changed: the entries that left the window
-- dropped (the whole log once none is left), a conversion; and a head that carried the newest
-- entry, which the refund changed.
local function swKeep(w)
  if w.live == 0 then
    if w.list then redis.call('DEL', w.k) end
  elseif w.first > 0 or w.convert then
    swHead(w)
  elseif w.carried then
    redis.call('LSET', w.k, 0, swHeadOf(w))
  end
end

-- swRefund forgets the newest c units in the window (unpush).
local function swRefund(w, c)
  swLen(w)
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

-- Quotas. The state at the key is the string "<fingerprint> <end> <used>": the end of the
-- counted period, Unix seconds (a period's boundaries are whole seconds), and the units used in
-- it, as limiter.Quota keeps them; absent: fresh. The script knows no time zone: Go passes the
-- bounds [QT_START, QT_END) of the period that holds the instant it expects the decision at,
-- and a decision that would start a period at a now outside them (the server's clock, across a
-- boundary from the caller's) answers OUTCOME_PERIOD with its now instead, for Go to compute
-- them there. A decision within the stored period is a comparison and an addition. Another
-- strategy's state (another quota's count, a token bucket's TAT, a sliding window's log) is
-- answered raw to Go, which converts it exactly (qtConvert): a conversion never gives usage back.

-- qtOpen sets whether the count read is of a period that holds now (Quota's count), and the
-- units used in it.
local function qtOpen(q)
  q.open = q.e ~= false and nows < q.e
  q.used = 0
  if q.open then q.used = q.u end
end

-- qtLoad reads the quota at key k whose block of arguments follows ARGV[o]. A sliding window's
-- log is other, and raw, identified as tbLoad identifies it, with the units it holds in its own
-- window at now (logUsed), which Go charges to the quota; a token bucket's state or another
-- quota's is raw.
local function qtLoad(k, o)
  local q = {k = k, qt = true, fp = ARGV[o + L_FINGERPRINT], limit = tonumber(ARGV[o + QT_LIMIT]),
    start = tonumber(ARGV[o + QT_START]), stop = tonumber(ARGV[o + QT_END]), e = false, u = 0, used = 0, open = false, other = false, raw = false, logUsed = false,
    converted = false, charged = false}
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then
    q.other = true
    local raw, used = logOfOther(k)
    if raw then q.raw, q.logUsed = raw, used end
  elseif v then
    local vfp, e, u = string.match(v, '^(%S+) (%-?%d+) (%d+)$')
    if vfp == q.fp then
      q.e, q.u = tonumber(e), tonumber(u)
    else
      q.raw = v
    end
  end
  qtOpen(q)
  return q
end

-- qtAdmits reports whether the quota admits a cost of c.
local function qtAdmits(q, c) return c <= q.limit - q.used end

-- qtNeedsPeriod reports whether admitting a cost of c would start a period whose bounds Go
-- did not pass: now lies outside [QT_START, QT_END).
local function qtNeedsPeriod(q, c)
  if q.open or c > q.limit then return false end
  return nows < q.start or nows >= q.stop
end

-- qtSet writes a count of used units in the period that ends at e, expiring at its end.
local function qtSet(q, e, used)
  redis.call('SET', q.k, string.format('%s %d %d', q.fp, e, used), 'PX',
    math.max(1, (e - nows) * 1000 - math.floor(nown / 1000000) + tonumber(ARGV[ARG_SLACK_MS])))
end

-- qtAdmit charges the cost c: to the period counted, or to the one that starts (QT_END ends it).
local function qtAdmit(q, c)
  local e = q.e
  if not q.open then e = q.stop end
  qtSet(q, e, q.used + c)
end

-- qtReply answers, at reply[at + R_*], the state the decision was made on: fresh, a count
-- (charged when converted from another algorithm's state: a refund has nothing to refund on
-- it), or the raw state Go must convert (with a sliding window's used units). Go derives the
-- decision from it with the in-memory code.
local function qtReply(reply, at, q)
  reply[at + R_TAT_F] = 0
  if q.raw and q.logUsed then
    reply[at + R_STATE], reply[at + R_RAW], reply[at + R_USED] = STATE_USED, q.raw, q.logUsed
  elseif q.raw then
    reply[at + R_STATE], reply[at + R_RAW], reply[at + R_USED] = STATE_RAW, q.raw, 0
  elseif q.e then
    local state = STATE_TAT
    if q.charged then state = STATE_CHARGED end
    reply[at + R_STATE], reply[at + R_QT_END], reply[at + R_QT_USED] = state, q.e, q.u
  else
    reply[at + R_STATE], reply[at + R_QT_END], reply[at + R_QT_USED] = STATE_FRESH, 0, 0
  end
end


-- Quotas: conversions and refunds, in the scripts of the calls that need them (a call that
-- refunds or carries a conversion: script.go).
-- qtConvert takes the count Go converted the raw state from to (e "": fresh), if the key still
-- holds that state: another quota's count carried, another algorithm's used units charged
-- (Quota.Convert).
local function qtConvert(q, from, e, u)
  if q.raw ~= from then return end
  q.raw, q.logUsed, q.converted, q.charged = false, false, true, q.other
  if e ~= '' then q.e, q.u = tonumber(e), tonumber(u) end
  qtOpen(q)
end

-- qtRefund takes c units off the count of the period that holds now, never below 0, as
-- Quota.Refund, on the count converted from another quota's or a token bucket's state (as
-- limiter.Memory, which keeps them in one table); a count charged from a sliding window's log
-- has nothing to refund. A conversion is kept (a fresh one deletes the key).
local function qtRefund(q, c)
  if q.charged then return end
  if q.open and (q.used > 0 or q.converted) then
    qtSet(q, q.e, q.used - math.min(q.used, c))
  elseif q.converted then
    redis.call('DEL', q.k)
  end
end

-- Concurrency limits. The state at the key is a sorted set of leases, one member a lease: its
-- score the second of its expiry (Unix seconds), its member "<ns> <seq> <places>", with ns the
-- nanoseconds of that second in 9 digits, so that Redis orders the leases by their exact expiry
-- (the score, then the member's bytes), as limiter.Concurrency's ring of entries. seq names the
-- lease (limiter.Decision.Lease; 0 for places charged from another algorithm's state, which no
-- lease names): one INCR of the client's lease counter (the key after the limits', ending
-- LEASE_SUFFIX), so no two leases of the client share one, whichever replica took them. A lease
-- holds its places until its expiry; the expired ones lead the set, and a write drops them.
-- The key expires when its latest lease does (and the slack). Absent: fresh; another
-- algorithm's state there is charged as one lease of its used units (ccConvert: a token
-- bucket's or a quota's raw for Go, a sliding window's log here). Every duration is at most a
-- lease timeout (24h < 2^47 ns), exact in a double.

local ccMember = '^(%d+) (%d+) (%d+)$'

-- ccCharge sets c's leases to one of u places expiring a lease timeout after now, which no seq
-- names, unwritten (c.charge): another algorithm's used units (limiter.Concurrency's
-- conversion), written by the admission that replaces that state.
local function ccCharge(c, u)
  c.held, c.at, c.seq, c.places, c.members = 0, {}, {}, {}, {}
  if u > 0 then
    c.charge, c.held = true, u
    c.at[1], c.seq[1], c.places[1], c.members[1] = c.timeout, '0', u, false
  end
end

-- ccLoad reads the concurrency limit at key k whose block of arguments follows ARGV[o]: its live
-- leases at now, oldest first (c.at: each's expiry in ns after now; c.seq, c.places,
-- c.members), the places they hold, and how many expired leases lead the set (c.dead).
local function ccLoad(k, o)
  local c = {k = k, o = o, cc = true, limit = tonumber(ARGV[o + CC_LIMIT]), timeout = tonumber(ARGV[o + CC_TIMEOUT]),
    held = 0, dead = 0, at = {}, seq = {}, places = {}, members = {}}
  local v = redis.pcall('ZRANGE', k, 0, -1, 'WITHSCORES')
  if v.err ~= nil then -- another algorithm's state
    c.other = true
    local s = redis.pcall('GET', k)
    if type(s) == 'string' then
      c.raw = s -- a token bucket's or a quota's: Go charges its used units (ccConvert)
    elseif type(s) == 'table' then
      local _, used = logOfOther(k)
      ccCharge(c, used or 0)
    end
    return c
  end
  for i = 1, #v, 2 do
    local ns, seq, places = string.match(v[i], ccMember)
    local dt = (tonumber(v[i + 1]) - nows) * 1e9 + tonumber(ns) - nown
    if dt <= 0 then
      c.dead = c.dead + 1
    else
      local j = #c.at + 1
      c.at[j], c.seq[j], c.places[j], c.members[j] = dt, seq, tonumber(places), v[i]
      c.held = c.held + c.places[j]
    end
  end
  return c
end

-- ccAdmits reports whether the limit admits cost places more.
local function ccAdmits(c, cost) return cost <= c.limit - c.held end

-- ccDecision answers, at reply[at + R_*], limiter.Concurrency's decision on the leases of c for a
-- decision of cost places, held places being held (counting them when admitted): pending tells
-- that an admitted decision's lease, expiring a lease timeout from now, is not among c's leases.
local function ccDecision(reply, at, c, held, cost, allowed, pending)
  reply[at + R_ADMITTED] = allowed and ADMITTED or REJECTED
  reply[at + R_REMAINING] = math.max(0, c.limit - held)
  reply[at + R_RESET_AFTER], reply[at + R_RETRY_AFTER] = 0, 0
  if held == 0 then return end
  local last = c.at[#c.at] or 0
  if pending then last = math.max(last, c.timeout) end
  reply[at + R_RESET_AFTER] = last
  if allowed or cost > c.limit then return end
  -- Without a release, the cost fits once the earliest leases holding held+cost-limit places
  -- have expired.
  local need = held + cost - c.limit
  for j = 1, #c.at do
    need = need - c.places[j]
    if need <= 0 then
      reply[at + R_RETRY_AFTER] = c.at[j]
      return
    end
  end
end

-- ccPeek answers whether one place is free, taking none.
local function ccPeek(reply, at, c)
  ccDecision(reply, at, c, c.held, 1, c.held + 1 <= c.limit, false)
end

-- ccWrite writes a lease expiring dt ns after now, named seq, of places, and returns its member.
local function ccWrite(c, dt, seq, places)
  local s = math.floor(dt / 1e9)
  local ns = nown + dt - s * 1e9
  s = nows + s
  if ns >= 1e9 then ns, s = ns - 1e9, s + 1 end
  local m = string.format('%09d %d %d', ns, seq, places)
  redis.call('ZADD', c.k, s, m)
  return m
end

-- ccInsert adds to c's leases one expiring dt ns after now, named seq, of places, after the
-- leases of the same expiry, and writes it.
local function ccInsert(c, dt, seq, places)
  local j = #c.at + 1
  while j > 1 and c.at[j - 1] > dt do j = j - 1 end
  table.insert(c.at, j, dt)
  table.insert(c.seq, j, tostring(seq))
  table.insert(c.places, j, places)
  table.insert(c.members, j, ccWrite(c, dt, seq, places))
  c.held = c.held + places
end

-- ccTrim drops the expired leases, once, before a write; ccExpire makes the key expire when its
-- latest lease does, and the slack.
local function ccTrim(c)
  if c.dead > 0 then
    redis.call('ZREMRANGEBYRANK', c.k, 0, c.dead - 1)
    c.dead = 0
  end
end
local function ccExpire(c)
  local last = c.at[#c.at]
  if last then
    redis.call('PEXPIRE', c.k, math.max(1, math.ceil(last / 1e6) + tonumber(ARGV[ARG_SLACK_MS])))
  end
end

-- ccAdmit takes cost places under the lease seq (the stack admitted the cost): a conversion's
-- charge first (the caller deleted the other algorithm's state), as one lease expiring a lease
-- timeout after now that no seq names.
local function ccAdmit(c, cost, seq)
  ccTrim(c)
  if c.charge then
    c.members[1], c.charge = ccWrite(c, c.at[1], 0, c.places[1]), false
  end
  ccInsert(c, c.timeout, seq, cost)
  ccExpire(c)
end

-- ccFind returns the index among c's live leases of the lease named seq, issued at (is, isn):
-- exact tells that the instants are the caller's clock, on which the lease expires a lease
-- timeout after it was issued (the server's clock took its own instant); nil if none.
local function ccFind(c, seq, is, isn, exact)
  if c.other then return nil end
  local want = (is - nows) * 1e9 + isn - nown + c.timeout
  for j = 1, #c.at do
    if c.seq[j] == seq and (not exact or c.at[j] == want) then return j end
  end
  return nil
end

-- ccRemove drops the lease at index j, and returns its places.
local function ccRemove(c, j)
  local places = c.places[j]
  ccTrim(c)
  redis.call('ZREM', c.k, c.members[j])
  table.remove(c.at, j)
  table.remove(c.seq, j)
  table.remove(c.members, j)
  table.remove(c.places, j)
  c.held = c.held - places
  return places
end

-- ccConvert takes the charge Go converted the raw state from (units at the instant read, which
-- is now's on the caller's clock), if the key still holds that state.
local function ccConvert(c, from, units)
  if c.raw ~= from then return end
  c.raw = false
  ccCharge(c, tonumber(units))
end
