-- limiterd token bucket (GCRA), one client. See the package documentation for the design.
--
-- An instant or duration is three exact integers (s, n, f): s seconds + n ns + f/rate ns, with
-- 0 <= n < 1e9 and 0 <= f < rate <= 1e9. Every intermediate value stays far below 2^53, so the
-- doubles of Lua compute it exactly; Go precomputed every product and quotient.
--
-- KEYS[1]  the client's state: the string "<fingerprint> <s> <n> <f>" (its theoretical arrival
--          time, TAT), or absent (fresh). A list there is a sliding window's state.
-- ARGV     named by the ARG_ locals below: the mode (MODE_PEEK reads only; MODE_REFUND moves
--          the TAT back by the cost's interval, never before now), the strategy's
--          fingerprint, now (s, n; "" for s: the server's clock, TIME), the rate, tau (a full
--          refill: s, n, f), the cost's interval (s, n, f; "" for s: the cost exceeds the
--          capacity; a refund's is at most tau) and the milliseconds added to the key's expiry.
-- Returns  the OUTCOME, the instant decided at (NOW), and the STATE the decision was made on,
--          from which Go derives the Decision with the in-memory code: fresh, a TAT, or, with
--          OUTCOME_CONVERT, the raw state another strategy of the same algorithm wrote (Go
--          converts it and writes the result with cas.lua).

-- Protocol: mirrors protocol.go (Go indices are 0-based); TestScriptsMirrorProtocol compares.
local MODE_DECIDE = 'd'
local MODE_PEEK = 'p'
local MODE_REFUND = 'r'
local ARG_MODE = 1
local ARG_FINGERPRINT = 2
local ARG_NOW_S = 3
local ARG_NOW_N = 4
local ARG_RATE = 5
local ARG_TAU_S = 6
local ARG_TAU_N = 7
local ARG_TAU_F = 8
local ARG_COST_S = 9
local ARG_COST_N = 10
local ARG_COST_F = 11
local ARG_SLACK_MS = 12
local ARGS = 12
local REPLY_OUTCOME = 1
local REPLY_NOW_S = 2
local REPLY_NOW_N = 3
local REPLY_STATE = 4
local REPLY_TAT_S = 5
local REPLY_TAT_N = 6
local REPLY_TAT_F = 7
local REPLY_RAW = 5
local OUTCOME_REJECTED = 0
local OUTCOME_ADMITTED = 1
local OUTCOME_CONVERT = 2
local OUTCOME_REFUNDED = 3
local STATE_FRESH = 0
local STATE_TAT = 1
local STATE_RAW = 2
-- End of protocol.

local k = KEYS[1]
if #ARGV ~= ARGS then return redis.error_reply('token bucket: ' .. #ARGV .. ' arguments, want ' .. ARGS) end
local decide, refund, fp = ARGV[ARG_MODE] == MODE_DECIDE, ARGV[ARG_MODE] == MODE_REFUND, ARGV[ARG_FINGERPRINT]
local G = 1000000000
local nows, nown
if ARGV[ARG_NOW_S] == '' then
  local t = redis.call('TIME')
  nows, nown = tonumber(t[1]), tonumber(t[2]) * 1000
else
  nows, nown = tonumber(ARGV[ARG_NOW_S]), tonumber(ARGV[ARG_NOW_N])
end
local rate = tonumber(ARGV[ARG_RATE])

local function less(as, an, af, bs, bn, bf)
  if as ~= bs then return as < bs end
  if an ~= bn then return an < bn end
  return af < bf
end
local function add(as, an, af, bs, bn, bf)
  local s, n, f = as + bs, an + bn, af + bf
  if f >= rate then f, n = f - rate, n + 1 end
  if n >= G then n, s = n - G, s + 1 end
  return s, n, f
end
local function sub(as, an, af, bs, bn, bf) -- a >= b
  local s, n, f = as - bs, an - bn, af - bf
  if f < 0 then f, n = f + rate, n - 1 end
  if n < 0 then n, s = n + G, s - 1 end
  return s, n, f
end

local v = redis.pcall('GET', k)
if type(v) == 'table' then -- a sliding window's list: another algorithm starts fresh
  if decide then redis.call('DEL', k) end
  v = false
end
local ts, tn, tf
if v then
  local vfp, a, b, c = string.match(v, '^(%S+) (%-?%d+) (%d+) (%d+)$')
  if vfp ~= fp then
    return {[REPLY_OUTCOME] = OUTCOME_CONVERT, [REPLY_NOW_S] = nows, [REPLY_NOW_N] = nown,
      [REPLY_STATE] = STATE_RAW, [REPLY_RAW] = v}
  end
  ts, tn, tf = tonumber(a), tonumber(b), tonumber(c)
end
local function answer(outcome)
  if ts then
    return {[REPLY_OUTCOME] = outcome, [REPLY_NOW_S] = nows, [REPLY_NOW_N] = nown,
      [REPLY_STATE] = STATE_TAT, [REPLY_TAT_S] = ts, [REPLY_TAT_N] = tn, [REPLY_TAT_F] = tf}
  end
  return {[REPLY_OUTCOME] = outcome, [REPLY_NOW_S] = nows, [REPLY_NOW_N] = nown, [REPLY_STATE] = STATE_FRESH}
end
if not (decide or refund) or ARGV[ARG_COST_S] == '' then return answer(OUTCOME_REJECTED) end

-- debt: how far the TAT lies ahead of now, at most tau (a clock that jumped backwards).
local taus, taun, tauf = tonumber(ARGV[ARG_TAU_S]), tonumber(ARGV[ARG_TAU_N]), tonumber(ARGV[ARG_TAU_F])
local ds, dn, df = 0, 0, 0
if ts and less(nows, nown, 0, ts, tn, tf) then
  ds, dn, df = sub(ts, tn, tf, nows, nown, 0)
  if not less(ds, dn, df, taus, taun, tauf) then ds, dn, df = taus, taun, tauf end
end
local cs, cn, cf = tonumber(ARGV[ARG_COST_S]), tonumber(ARGV[ARG_COST_N]), tonumber(ARGV[ARG_COST_F])
if refund then
  -- The debt shrinks by the refund, never below 0. A bucket refunded full keeps its TAT at now
  -- (as limiter.Memory does): after a clock step backwards it still counts as used.
  if ds ~= 0 or dn ~= 0 or df ~= 0 then
    local rs, rn, rf = 0, 0, 0
    if less(cs, cn, cf, ds, dn, df) then rs, rn, rf = sub(ds, dn, df, cs, cn, cf) end
    local ns, nn, nf = add(nows, nown, 0, rs, rn, rf)
    local ttl = rs * 1000 + math.ceil((rn + (rf > 0 and 1 or 0)) / 1000000) + tonumber(ARGV[ARG_SLACK_MS])
    redis.call('SET', k, string.format('%s %d %d %d', fp, ns, nn, nf), 'PX', math.max(1, ttl))
  end
  return answer(OUTCOME_REFUNDED)
end
local xs, xn, xf = add(ds, dn, df, cs, cn, cf)
if less(taus, taun, tauf, xs, xn, xf) then return answer(OUTCOME_REJECTED) end
local ns, nn, nf = add(nows, nown, 0, xs, xn, xf)
-- The key lives until the bucket is full again: x from now, rounded up to milliseconds.
local ttl = xs * 1000 + math.ceil((xn + (xf > 0 and 1 or 0)) / 1000000) + tonumber(ARGV[ARG_SLACK_MS])
redis.call('SET', k, string.format('%s %d %d %d', fp, ns, nn, nf), 'PX', ttl)
return answer(OUTCOME_ADMITTED)
