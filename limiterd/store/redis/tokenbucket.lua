-- limiterd token bucket (GCRA), one client. See the package documentation for the design.
--
-- An instant or duration is three exact integers (s, n, f): s seconds + n ns + f/rate ns, with
-- 0 <= n < 1e9 and 0 <= f < rate <= 1e9. Every intermediate value stays far below 2^53, so the
-- doubles of Lua compute it exactly; Go precomputed every product and quotient.
--
-- KEYS[1]  the client's state: the string "<fingerprint> <s> <n> <f>" (its theoretical arrival
--          time, TAT), or absent (fresh). A list there is a sliding window's state.
-- ARGV     1 mode: "d" decide, "p" peek (read only)
--          2 fingerprint of the strategy
--          3, 4 now (s, n); "" for 3: the server's clock (TIME)
--          5 rate
--          6, 7, 8 tau: a full refill (s, n, f)
--          9, 10, 11 the cost's interval (s, n, f); "" for 9: the cost exceeds the capacity
--          12 milliseconds added to the key's expiry
-- Returns  {admitted (0|1), now s, now n[, tat s, tat n, tat f]}: the state the decision was
--          made on (absent: fresh), from which Go derives the Decision with the in-memory code;
--          or {2, now s, now n, raw state} when another strategy of the same algorithm wrote the
--          state: Go converts it and writes the result with cas.lua.
local k = KEYS[1]
local mode, fp = ARGV[1], ARGV[2]
local G = 1000000000
local nows, nown
if ARGV[3] == '' then
  local t = redis.call('TIME')
  nows, nown = tonumber(t[1]), tonumber(t[2]) * 1000
else
  nows, nown = tonumber(ARGV[3]), tonumber(ARGV[4])
end
local rate = tonumber(ARGV[5])

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
  if mode == 'd' then redis.call('DEL', k) end
  v = false
end
local ts, tn, tf
if v then
  local vfp, a, b, c = string.match(v, '^(%S+) (%-?%d+) (%d+) (%d+)$')
  if vfp ~= fp then return {2, nows, nown, v} end
  ts, tn, tf = tonumber(a), tonumber(b), tonumber(c)
end
local function answer(admitted)
  if ts then return {admitted, nows, nown, ts, tn, tf} end
  return {admitted, nows, nown}
end
if mode ~= 'd' or ARGV[9] == '' then return answer(0) end

-- debt: how far the TAT lies ahead of now, at most tau (a clock that jumped backwards).
local taus, taun, tauf = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local ds, dn, df = 0, 0, 0
if ts and less(nows, nown, 0, ts, tn, tf) then
  ds, dn, df = sub(ts, tn, tf, nows, nown, 0)
  if not less(ds, dn, df, taus, taun, tauf) then ds, dn, df = taus, taun, tauf end
end
local xs, xn, xf = add(ds, dn, df, tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]))
if less(taus, taun, tauf, xs, xn, xf) then return answer(0) end
local ns, nn, nf = add(nows, nown, 0, xs, xn, xf)
-- The key lives until the bucket is full again: x from now, rounded up to milliseconds.
local ttl = xs * 1000 + math.ceil((xn + (xf > 0 and 1 or 0)) / 1000000) + tonumber(ARGV[12])
redis.call('SET', k, string.format('%s %d %d %d', fp, ns, nn, nf), 'PX', ttl)
return answer(1)
