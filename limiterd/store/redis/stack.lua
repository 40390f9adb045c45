-- limiterd stacked limits, one client: every limit of a tier decided all or nothing in one
-- atomic step. See the package documentation for the design.
--
-- Each limit is a token bucket or a sliding window whose state is kept exactly as
-- tokenbucket.lua and slidingwindow.lua keep it, under its own key; this script mirrors both
-- step by step (and limiter.Memory.DecideStack), in two phases: it reads every limit's state
-- and decides on it, then writes every limit's new state if every limit admitted the cost, and
-- nothing otherwise (not even an expiry or a conversion), so that a rejected request charges
-- no limit.
--
-- KEYS     one per limit, in the stack's order: its state (all on the client's slot)
-- ARGV     named by the ARG_ locals below: the mode (MODE_PEEK reads only; MODE_REFUND returns
--          the cost to every limit, clamped, and answers as a peek after it), now (s, n; ""
--          for s: the server's clock, TIME), the cost (a peek's is 1), the milliseconds added
--          to a key's expiry, the sliding windows' rebase threshold and the number of limits;
--          then one block of LIMIT_ARGS arguments a limit, named by the L_ locals (read with
--          limitArg): its algorithm, fingerprint and parameters as the scripts of one limit take
--          them, and, for a token bucket whose state another strategy wrote, the state Go
--          converted it to (CONVERT_FROM: the state read, "" none; CONVERT_S, N, F: the
--          converted TAT, "" for S: fresh), used only if the key still holds the state read.
-- Returns  the OUTCOME, the instant decided at (NOW) and, from REPLY_LIMITS on, one block of
--          LIMIT_REPLY elements a limit, named by the R_ locals: a token bucket's state the
--          decision was made on (R_STATE: fresh, a TAT, or with OUTCOME_CONVERT the raw state
--          Go must convert; Go derives the decision with the in-memory code), a sliding
--          window's decision (R_ADMITTED: whether it admits the cost on its own; with the stack
--          rejected, the state as it is).

-- Protocol: mirrors protocol.go (Go indices are 0-based); TestScriptsMirrorProtocol compares.
local MODE_DECIDE = 'd'
local MODE_PEEK = 'p'
local MODE_REFUND = 'r'
local ALGORITHM_TOKEN_BUCKET = 'tb'
local ALGORITHM_SLIDING_WINDOW = 'sw'
local ARG_MODE = 1
local ARG_NOW_S = 2
local ARG_NOW_N = 3
local ARG_COST = 4
local ARG_SLACK_MS = 5
local ARG_REBASE = 6
local ARG_LIMITS = 7
local ARGS = 7
local L_ALGORITHM = 1
local L_FINGERPRINT = 2
local L_RATE = 3
local L_TAU_S = 4
local L_TAU_N = 5
local L_TAU_F = 6
local L_COST_S = 7
local L_COST_N = 8
local L_COST_F = 9
local L_LIMIT = 10
local L_WINDOW = 11
local L_CONVERT_FROM = 12
local L_CONVERT_S = 13
local L_CONVERT_N = 14
local L_CONVERT_F = 15
local LIMIT_ARGS = 15
local REPLY_OUTCOME = 1
local REPLY_NOW_S = 2
local REPLY_NOW_N = 3
local REPLY_LIMITS = 4
local R_STATE = 1
local R_TAT_S = 2
local R_TAT_N = 3
local R_TAT_F = 4
local R_RAW = 2
local R_ADMITTED = 1
local R_REMAINING = 2
local R_RESET_AFTER = 3
local R_RETRY_AFTER = 4
local LIMIT_REPLY = 4
local OUTCOME_REJECTED = 0
local OUTCOME_ADMITTED = 1
local OUTCOME_CONVERT = 2
local OUTCOME_REFUNDED = 3
local OUTCOME_PEEKED = 4
local STATE_FRESH = 0
local STATE_TAT = 1
local STATE_RAW = 2
local REJECTED = 0
local ADMITTED = 1
-- End of protocol.

if #ARGV < ARGS then return redis.error_reply('stack: ' .. #ARGV .. ' arguments, want at least ' .. ARGS) end
local n = tonumber(ARGV[ARG_LIMITS])
if #ARGV ~= ARGS + n * LIMIT_ARGS or #KEYS ~= n then
  return redis.error_reply('stack: ' .. #ARGV .. ' arguments and ' .. #KEYS .. ' keys for ' .. n .. ' limits')
end
local mode = ARGV[ARG_MODE]
local decide, refund = mode == MODE_DECIDE, mode == MODE_REFUND
local G = 1000000000
local nows, nown
if ARGV[ARG_NOW_S] == '' then
  local t = redis.call('TIME')
  nows, nown = tonumber(t[1]), tonumber(t[2]) * 1000
else
  nows, nown = tonumber(ARGV[ARG_NOW_S]), tonumber(ARGV[ARG_NOW_N])
end
local cost = tonumber(ARGV[ARG_COST])
local slack, rebase = tonumber(ARGV[ARG_SLACK_MS]), tonumber(ARGV[ARG_REBASE])
local function limitArg(i, field) return ARGV[ARGS + (i - 1) * LIMIT_ARGS + field] end
local function int(x) return string.format('%d', x) end

-- Token buckets (tokenbucket.lua): instants and durations as (s, n, f), f in 1/rate ns.
local function less(as, an, af, bs, bn, bf)
  if as ~= bs then return as < bs end
  if an ~= bn then return an < bn end
  return af < bf
end
local function add(rate, as, an, af, bs, bn, bf)
  local s, m, f = as + bs, an + bn, af + bf
  if f >= rate then f, m = f - rate, m + 1 end
  if m >= G then m, s = m - G, s + 1 end
  return s, m, f
end
local function sub(rate, as, an, af, bs, bn, bf) -- a >= b
  local s, m, f = as - bs, an - bn, af - bf
  if f < 0 then f, m = f + rate, m - 1 end
  if m < 0 then m, s = m + G, s - 1 end
  return s, m, f
end

local function tbLoad(i, k)
  local b = {k = k, fp = limitArg(i, L_FINGERPRINT), rate = tonumber(limitArg(i, L_RATE))}
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then v = false end -- a sliding window's list: another algorithm starts fresh
  if v then
    local vfp, s, m, f = string.match(v, '^(%S+) (%-?%d+) (%d+) (%d+)$')
    if vfp == b.fp then
      b.ts, b.tn, b.tf = tonumber(s), tonumber(m), tonumber(f)
    elseif limitArg(i, L_CONVERT_FROM) == v then -- Go converted this very state
      b.converted = true
      if limitArg(i, L_CONVERT_S) ~= '' then
        b.ts, b.tn, b.tf = tonumber(limitArg(i, L_CONVERT_S)), tonumber(limitArg(i, L_CONVERT_N)), tonumber(limitArg(i, L_CONVERT_F))
      end
    else
      b.raw = v
    end
  end
  -- debt: how far the TAT lies ahead of now, at most tau (a clock that jumped backwards).
  b.taus, b.taun, b.tauf = tonumber(limitArg(i, L_TAU_S)), tonumber(limitArg(i, L_TAU_N)), tonumber(limitArg(i, L_TAU_F))
  b.ds, b.dn, b.df = 0, 0, 0
  if b.ts and less(nows, nown, 0, b.ts, b.tn, b.tf) then
    b.ds, b.dn, b.df = sub(b.rate, b.ts, b.tn, b.tf, nows, nown, 0)
    if not less(b.ds, b.dn, b.df, b.taus, b.taun, b.tauf) then b.ds, b.dn, b.df = b.taus, b.taun, b.tauf end
  end
  return b
end

-- tbAdmits reports whether the bucket admits the cost, and keeps the debt it would leave.
local function tbAdmits(b, i)
  if limitArg(i, L_COST_S) == '' then return false end -- the cost exceeds the capacity
  local cs, cn, cf = tonumber(limitArg(i, L_COST_S)), tonumber(limitArg(i, L_COST_N)), tonumber(limitArg(i, L_COST_F))
  b.xs, b.xn, b.xf = add(b.rate, b.ds, b.dn, b.df, cs, cn, cf)
  return not less(b.taus, b.taun, b.tauf, b.xs, b.xn, b.xf)
end

-- tbWrite writes a TAT of now + (s, m, f), expiring when the bucket is full again.
local function tbWrite(b, s, m, f)
  local ns, nn, nf = add(b.rate, nows, nown, 0, s, m, f)
  local ttl = s * 1000 + math.ceil((m + (f > 0 and 1 or 0)) / 1000000) + slack
  redis.call('SET', b.k, string.format('%s %d %d %d', b.fp, ns, nn, nf), 'PX', math.max(1, ttl))
end

local function tbRefund(b, i)
  local cs, cn, cf = tonumber(limitArg(i, L_COST_S)), tonumber(limitArg(i, L_COST_N)), tonumber(limitArg(i, L_COST_F))
  if b.ds ~= 0 or b.dn ~= 0 or b.df ~= 0 then
    -- The debt shrinks by the refund, never below 0 (tokenbucket.lua).
    local rs, rn, rf = 0, 0, 0
    if less(cs, cn, cf, b.ds, b.dn, b.df) then rs, rn, rf = sub(b.rate, b.ds, b.dn, b.df, cs, cn, cf) end
    tbWrite(b, rs, rn, rf)
  elseif b.converted then
    -- A full bucket keeps its conversion, as limiter.Memory keeps it.
    if b.ts then
      redis.call('SET', b.k, string.format('%s %d %d %d', b.fp, b.ts, b.tn, b.tf), 'PX', math.max(1, slack))
    else
      redis.call('DEL', b.k)
    end
  end
end

local function tbReply(reply, at, b)
  if b.raw then
    reply[at + R_STATE], reply[at + R_RAW], reply[at + R_TAT_N], reply[at + R_TAT_F] = STATE_RAW, b.raw, 0, 0
  elseif b.ts then
    reply[at + R_STATE], reply[at + R_TAT_S], reply[at + R_TAT_N], reply[at + R_TAT_F] = STATE_TAT, b.ts, b.tn, b.tf
  else
    reply[at + R_STATE], reply[at + R_TAT_S], reply[at + R_TAT_N], reply[at + R_TAT_F] = STATE_FRESH, 0, 0, 0
  end
end

-- Sliding windows (slidingwindow.lua): the log [fingerprint, epoch, base, at_1, cum_1, ...].
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

local function swLoad(i, k)
  local w = {k = k, fp = limitArg(i, L_FINGERPRINT), limit = tonumber(limitArg(i, L_LIMIT)),
    window = tonumber(limitArg(i, L_WINDOW)), epoch = nows, base = 0, n = 0, convert = false}
  local h = redis.pcall('LRANGE', k, 0, 2)
  w.held = h.err ~= nil or #h > 0 -- the key holds something: an admission starts by deleting it
  w.list = not h.err and #h > 0 -- a sliding window's log: a refund that empties it deletes it
  if not h.err and #h == 3 then
    w.epoch, w.base = tonumber(h[2]), tonumber(h[3])
    w.n = (redis.call('LLEN', k) - 3) / 2
    w.convert = h[1] ~= w.fp -- written by other parameters: carry the usage over (carryFrom)
  end
  w.now = (nows - w.epoch) * G + nown
  w.t = w.now -- the decision's instant: never before the newest entry (clamp)
  if w.n > 0 then
    w.lastAt = tonumber(redis.call('LINDEX', k, -2))
    w.lastCum = tonumber(redis.call('LINDEX', k, -1))
    if w.lastAt > w.t then w.t = w.lastAt end
  end
  -- Entries [0, first) left the window: binary searches, as in slidingwindow.lua.
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
  w.used = 0
  if w.live > 0 then w.used = w.lastCum - w.base end
  return w
end

local function swAdmits(w, c) return c <= w.limit and w.used + c <= w.limit end

-- swKeep rewrites the log's header after a refund (expired entries, a conversion). A token
-- bucket's state at the key is another algorithm's: a refund leaves it.
local function swKeep(w)
  if w.live == 0 then
    if w.list then redis.call('DEL', w.k) end
  elseif w.first > 0 or w.convert then
    redis.call('LPOP', w.k, 3 + 2 * w.first)
    redis.call('LPUSH', w.k, int(w.base), int(w.epoch), w.fp)
  end
end

-- swAdmit appends the cost to the log (slidingwindow.lua's admission).
local function swAdmit(w, c)
  if w.live == 0 then
    if w.held then redis.call('DEL', w.k) end
    w.epoch, w.base, w.now, w.t = nows, 0, nown, nown
    redis.call('RPUSH', w.k, w.fp, int(w.epoch), 0, int(w.t), int(c))
    w.lastAt, w.lastCum = w.t, c
  else
    if w.first > 0 or w.convert then
      redis.call('LPOP', w.k, 3 + 2 * w.first)
      redis.call('LPUSH', w.k, int(w.base), int(w.epoch), w.fp)
    end
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
      local shift = math.floor(tonumber(all[1]) / G)
      for j = 1, #all, 2 do
        all[j] = int(tonumber(all[j]) - shift * G)
        all[j + 1] = int(tonumber(all[j + 1]) - w.base)
      end
      redis.call('DEL', w.k)
      redis.call('RPUSH', w.k, w.fp, int(w.epoch + shift), 0)
      for j = 1, #all, 4000 do
        redis.call('RPUSH', w.k, unpack(all, j, math.min(j + 3999, #all)))
      end
      w.epoch, w.base, w.now, w.lastAt = w.epoch + shift, 0, w.now - shift * G, w.lastAt - shift * G
    end
  end
  -- The key lives until the window is empty again, on the clock of now (not the clamped t).
  redis.call('PEXPIRE', w.k, int(math.ceil((w.lastAt + w.window - w.now) / 1000000) + slack))
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

-- swReply answers for the log as it is, for a cost c that the limit admits on its own or not.
local function swReply(reply, at, w, c, admitted)
  local resetAfter, retryAfter = 0, 0
  if w.used > 0 then
    resetAfter = w.lastAt + w.window - w.t
    if not admitted and c <= w.limit then
      -- The cost fits once the oldest entries holding used+c-limit units have left the window.
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

-- Phase 1: read every limit.
local limits, convert = {}, false
for i = 1, n do
  local algorithm = limitArg(i, L_ALGORITHM)
  if algorithm == ALGORITHM_TOKEN_BUCKET then
    limits[i] = tbLoad(i, KEYS[i])
    convert = convert or limits[i].raw ~= nil
  elseif algorithm == ALGORITHM_SLIDING_WINDOW then
    limits[i] = swLoad(i, KEYS[i])
  else
    return redis.error_reply('stack: limit ' .. i .. ' has algorithm ' .. tostring(algorithm))
  end
  limits[i].tb = algorithm == ALGORITHM_TOKEN_BUCKET
end
local reply = {}
reply[REPLY_NOW_S], reply[REPLY_NOW_N] = nows, nown
local function at(i) return REPLY_LIMITS + (i - 1) * LIMIT_REPLY - 1 end
if convert then -- Go converts the raw states first; nothing is written
  reply[REPLY_OUTCOME] = OUTCOME_CONVERT
  for i = 1, n do
    if limits[i].tb then tbReply(reply, at(i), limits[i]) else swReply(reply, at(i), limits[i], cost, false) end
  end
  return reply
end

if refund then
  reply[REPLY_OUTCOME] = OUTCOME_REFUNDED
  for i = 1, n do
    local l = limits[i]
    if l.tb then
      tbReply(reply, at(i), l) -- the state before the refund: Go refunds on it as Refund does
      tbRefund(l, i)
    else
      swRefund(l, cost)
      swReply(reply, at(i), l, 1, swAdmits(l, 1))
    end
  end
  return reply
end

if not decide then -- a peek: what one unit would get
  reply[REPLY_OUTCOME] = OUTCOME_PEEKED
  for i = 1, n do
    local l = limits[i]
    if l.tb then tbReply(reply, at(i), l) else swReply(reply, at(i), l, cost, swAdmits(l, cost)) end
  end
  return reply
end

-- Phase 2: decide on every limit; write them all only if every one admits.
local all = true
for i = 1, n do
  local l = limits[i]
  if l.tb then l.admits = tbAdmits(l, i) else l.admits = swAdmits(l, cost) end
  all = all and l.admits
end
reply[REPLY_OUTCOME] = all and OUTCOME_ADMITTED or OUTCOME_REJECTED
for i = 1, n do
  local l = limits[i]
  if l.tb then
    tbReply(reply, at(i), l) -- the state decided on
    if all then tbWrite(l, l.xs, l.xn, l.xf) end
  elseif all then
    local used = l.used
    swAdmit(l, cost)
    reply[at(i) + R_ADMITTED], reply[at(i) + R_REMAINING] = ADMITTED, math.max(0, l.limit - used - cost)
    reply[at(i) + R_RESET_AFTER], reply[at(i) + R_RETRY_AFTER] = l.window, 0
  else
    swReply(reply, at(i), l, cost, l.admits)
  end
end
return reply
