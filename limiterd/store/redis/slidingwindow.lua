-- limiterd sliding window, one client. See the package documentation for the design.
--
-- KEYS[1]  the client's log: the list [fingerprint, epoch, base, at_1, cum_1, ..., at_n, cum_n],
--          oldest first. epoch is Unix seconds; at_i is an admitted instant in ns since epoch;
--          cum_i the running total of units admitted up to it; base the total just before
--          at_1. Absent: fresh. A string there is a token bucket's state.
-- ARGV     named by the ARG_ locals below: the mode (MODE_PEEK reads only; MODE_REFUND forgets
--          the newest cost units in the window and answers as a peek after it), the strategy's
--          fingerprint, now (s, n; "" for s: the server's clock, TIME), the limit, the window
--          (ns), the cost, the milliseconds added to the key's expiry, and the rebase
--          threshold: past it, instants and totals are rewritten relative to the oldest entry,
--          so that they stay exact integers (below 2^53) in Lua's doubles.
-- Returns  the decision, named by the REPLY_ locals: admitted (ADMITTED or REJECTED),
--          remaining, reset after (ns), retry after (ns).
--
-- This mirrors limiter.SlidingWindow (Decide, Peek, carryFrom) step by step; every value it
-- computes is an integer below 2^53: instants are kept relative to the epoch, and durations are
-- at most a window (24h < 2^47 ns).

-- Protocol: mirrors protocol.go (Go indices are 0-based); TestScriptsMirrorProtocol compares.
local MODE_DECIDE = 'd'
local MODE_PEEK = 'p'
local MODE_REFUND = 'r'
local ARG_MODE = 1
local ARG_FINGERPRINT = 2
local ARG_NOW_S = 3
local ARG_NOW_N = 4
local ARG_LIMIT = 5
local ARG_WINDOW = 6
local ARG_COST = 7
local ARG_SLACK_MS = 8
local ARG_REBASE = 9
local ARGS = 9
local REPLY_ADMITTED = 1
local REPLY_REMAINING = 2
local REPLY_RESET_AFTER = 3
local REPLY_RETRY_AFTER = 4
local REPLY_LEN = 4
local REJECTED = 0
local ADMITTED = 1
-- End of protocol.

if #ARGV ~= ARGS then return redis.error_reply('sliding window: ' .. #ARGV .. ' arguments, want ' .. ARGS) end
local k = KEYS[1]
local decide, refund, fp = ARGV[ARG_MODE] == MODE_DECIDE, ARGV[ARG_MODE] == MODE_REFUND, ARGV[ARG_FINGERPRINT]
local G = 1000000000
local nows, nown
if ARGV[ARG_NOW_S] == '' then
  local tm = redis.call('TIME')
  nows, nown = tonumber(tm[1]), tonumber(tm[2]) * 1000
else
  nows, nown = tonumber(ARGV[ARG_NOW_S]), tonumber(ARGV[ARG_NOW_N])
end
local limit, window, cost = tonumber(ARGV[ARG_LIMIT]), tonumber(ARGV[ARG_WINDOW]), tonumber(ARGV[ARG_COST])
local slack, rebase = tonumber(ARGV[ARG_SLACK_MS]), tonumber(ARGV[ARG_REBASE])
local function reply(admitted, remaining, resetAfter, retryAfter)
  return {[REPLY_ADMITTED] = admitted and ADMITTED or REJECTED, [REPLY_REMAINING] = remaining,
    [REPLY_RESET_AFTER] = resetAfter, [REPLY_RETRY_AFTER] = retryAfter}
end
local function int(x) return string.format('%d', x) end

local h = redis.pcall('LRANGE', k, 0, 2)
local epoch, base, n, convert = nows, 0, 0, false
if h.err then -- a token bucket's state: another algorithm starts fresh
  if decide then redis.call('DEL', k) end
elseif #h == 3 then
  epoch, base = tonumber(h[2]), tonumber(h[3])
  n = (redis.call('LLEN', k) - 3) / 2
  convert = h[1] ~= fp -- written by other parameters: carry the usage over (carryFrom)
end
local function at(i) return tonumber(redis.call('LINDEX', k, 3 + 2 * i)) end
local function cum(i) return tonumber(redis.call('LINDEX', k, 4 + 2 * i)) end

-- now relative to the epoch. It is exact within 104 days of the epoch; further away every
-- entry is far outside any window, and comparisons with the inexact value still say so.
local now = (nows - epoch) * G + nown
local t = now -- the decision's instant: never before the newest entry (clamp)
local lastAt, lastCum
if n > 0 then
  lastAt = tonumber(redis.call('LINDEX', k, -2))
  lastCum = tonumber(redis.call('LINDEX', k, -1))
  if lastAt > t then t = lastAt end
end
-- Expire: entries [0, first) left the window. Instants and running totals never decrease
-- along the log, so binary searches find first in O(log n) reads, never walking the expired
-- entries a peek leaves in place.
local function search(lo, hi, past) -- the first i in [lo, hi) where past(i) is false, else hi
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if past(mid) then lo = mid + 1 else hi = mid end
  end
  return lo
end
local first = search(0, n, function(i) return at(i) + window <= t end)
if first > 0 then base = cum(first - 1) end
if convert and first < n then -- keep at most limit units, dropping the oldest
  local excess = lastCum - base - limit
  if excess > 0 then
    base = base + excess
    first = search(first, n, function(i) return cum(i) <= base end)
  end
end
local live = n - first
local used = 0
if live > 0 then used = lastCum - base end
if refund then -- forget the newest cost units (unpush); then answer for one unit
  local back = cost
  while back > 0 and live > 0 do
    local prev = base
    if live > 1 then prev = cum(n - 2) end
    if lastCum - prev > back then
      lastCum = lastCum - back
      redis.call('LSET', k, -1, int(lastCum))
      back = 0
    else
      back = back - (lastCum - prev)
      redis.call('RPOP', k, 2)
      n, live = n - 1, live - 1
      if live > 0 then lastAt, lastCum = at(n - 1), cum(n - 1) end
    end
  end
  used, cost = 0, 1
  if live > 0 then used = lastCum - base end
end

local admitted = cost <= limit and used + cost <= limit
local remaining, resetAfter, retryAfter = math.max(0, limit - used), 0, 0
if admitted and decide then
  remaining = math.max(0, limit - used - cost)
  if live == 0 then
    if n > 0 then redis.call('DEL', k) end
    epoch, base, now, t = nows, 0, nown, nown
    redis.call('RPUSH', k, fp, int(epoch), 0, int(t), int(cost))
    lastAt, lastCum = t, cost
  else
    if first > 0 or convert then
      redis.call('LPOP', k, 3 + 2 * first)
      redis.call('LPUSH', k, int(base), int(epoch), fp)
    end
    lastCum = lastCum + cost
    if lastAt == t then
      redis.call('LSET', k, -1, int(lastCum))
    else
      redis.call('RPUSH', k, int(t), int(lastCum))
      lastAt = t
    end
    if lastAt > rebase or lastCum > rebase then
      -- Rewrite the log relative to the oldest entry's second, with base 0.
      local all = redis.call('LRANGE', k, 3, -1)
      local shift = math.floor(tonumber(all[1]) / G)
      for i = 1, #all, 2 do
        all[i] = int(tonumber(all[i]) - shift * G)
        all[i + 1] = int(tonumber(all[i + 1]) - base)
      end
      redis.call('DEL', k)
      redis.call('RPUSH', k, fp, int(epoch + shift), 0)
      for i = 1, #all, 4000 do
        redis.call('RPUSH', k, unpack(all, i, math.min(i + 3999, #all)))
      end
      epoch, base, now, lastAt = epoch + shift, 0, now - shift * G, lastAt - shift * G
    end
  end
  -- The key lives until the window is empty again, on the clock of now (not the clamped t).
  redis.call('PEXPIRE', k, int(math.ceil((lastAt + window - now) / 1000000) + slack))
  return reply(true, remaining, window, 0)
end

if used > 0 then
  resetAfter = lastAt + window - t
  if not admitted then
    if cost > limit then
      retryAfter = 0 -- never admitted: no retry time
    else
      -- The cost fits once the oldest entries holding used+cost-limit units have left the
      -- window: the first entry whose running total reaches that.
      local need = base + used + cost - limit
      local lo, hi = first, n - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        if cum(mid) >= need then hi = mid else lo = mid + 1 end
      end
      retryAfter = at(lo) + window - t
    end
  end
end
if (decide or refund) and #h == 3 and (first > 0 or convert or live == 0) then -- keep the expiry, the conversion, the refund
  if live == 0 then
    redis.call('DEL', k)
  else
    redis.call('LPOP', k, 3 + 2 * first)
    redis.call('LPUSH', k, int(base), int(epoch), fp)
  end
end
return reply(admitted, remaining, resetAfter, retryAfter)
