-- limiterd's decision on one client: a stack of 1 to MAX_LIMITS limits (a single limit is the
-- stack of its one limit), decided all or nothing in one atomic step, by the functions of
-- algorithms.lua. See the package documentation for the design.
--
-- KEYS     one per limit, in the stack's order: its state (all on the client's slot); then, for
--          a stack with a concurrency limit, the client's lease counter (ending LEASE_SUFFIX)
-- ARGV     named by the ARG_ locals: the mode (MODE_DECIDE, MODE_PEEK reads
--          only, MODE_REFUND returns the cost to every limit, clamped, and answers as a peek
--          after it, MODE_RELEASE and MODE_EXTEND end or extend the lease that the cost argument
--          names, "<seq> <s> <ns>", its seq and issued instant, on the concurrency limits), now (s, n; "" for s: the server's clock, TIME), the cost (a peek's is 1),
--          the milliseconds added to a key's expiry and the sliding windows' rebase threshold;
--          then one block a limit: its algorithm (L_ALGORITHM) and fingerprint, then its
--          parameters, named by the TB_ locals (TB_ARGS in all), the SW_ locals (SW_ARGS), the
--          QT_ locals (QT_ARGS: a quota's limit and the bounds of its expected period) or the CC_
--          locals (CC_ARGS: a concurrency limit's places and lease timeout in ns);
--          then, for limits whose state other parameters or another algorithm wrote, one block
--          of CONVERT_ARGS each, named by the C_ locals: the limit (1-based), the state read (as
--          the script answered it) and what Go converted it to, used only if the key still holds
--          that state: a token bucket's TAT (s "": fresh), a sliding window's charge (its
--          instant s, n and C_UNITS units: a log of that one entry), or a quota's count (C_END,
--          "": fresh, and C_USED).
-- Returns  the OUTCOME, the instant decided at (NOW) and, from REPLY_LIMITS on, one block of
--          LIMIT_REPLY elements a limit, named by the R_ locals: a token bucket's state the
--          decision was made on (tbReply; with OUTCOME_CONVERT, the raw states Go must convert
--          first, and nothing is written), a sliding window's decision (swReply: whether it
--          admits the cost on its own; with the stack rejected, the state as it is; with
--          OUTCOME_CONVERT, STATE_RAW and a token bucket's state Go must convert first), a
--          quota's count decided on (qtReply, as a token bucket's). OUTCOME_PERIOD, with nothing
--          written: a decision would start a quota's period at a now outside the bounds passed;
--          Go passes those of the period that holds NOW, and calls again. OUTCOME_REFUNDED
--          adds one element a limit after the blocks: what a sliding window's refund added to
--          its remaining units (0 for the other algorithms); OUTCOME_RELEASED one element a limit:
--          the places a concurrency limit freed or moved (0 for the others). With the lease
--          counter, every answer but OUTCOME_CONVERT and OUTCOME_PERIOD ends with one element
--          more: the seq of the lease an admission or an extension took (0: none).
--
-- A decision reads every limit, then writes every limit's new state if every limit admits the
-- cost (replacing a state that another algorithm left under a limit's key, whose used units it
-- was charged: a conversion never gives usage back).
-- Otherwise it writes nothing, for one limit as for several: no conversion, no expired entry
-- dropped, no other algorithm's state deleted (a rejected request charges no limit, as
-- limiter.Memory.Decide).

-- The client's lease counter, after the limits' keys of a stack with a concurrency limit (no
-- limit's key ends with LEASE_SUFFIX).
local LEASE_KEY = KEYS[#KEYS]
if LEASE_KEY and string.sub(LEASE_KEY, -#LEASE_SUFFIX) == LEASE_SUFFIX then
  table.remove(KEYS)
else
  LEASE_KEY = false
end
local n = #KEYS
if #ARGV < ARGS or n < 1 or n > MAX_LIMITS then
  return redis.error_reply('decide: ' .. #ARGV .. ' arguments and ' .. n .. ' keys')
end
local mode = ARGV[ARG_MODE]
if ARGV[ARG_NOW_S] == '' then
  local t = redis.call('TIME')
  nows, nown = tonumber(t[1]), tonumber(t[2]) * 1000
  -- A server clock past the ends of limiter.ClampInstant decides at that end, as Go does with
  -- the caller's clock: the instants Go derives from NOW must fit an int64 of nanoseconds.
  if nows > LATEST_S or (nows == LATEST_S and nown > LATEST_N) then
    nows, nown = LATEST_S, LATEST_N
  elseif nows < EARLIEST_S or (nows == EARLIEST_S and nown < EARLIEST_N) then
    nows, nown = EARLIEST_S, EARLIEST_N
  end
else
  nows, nown = tonumber(ARGV[ARG_NOW_S]), tonumber(ARGV[ARG_NOW_N])
end
local cost -- parsed where a sliding window or a quota needs it: a token bucket's is in its block

-- A decision on one token bucket, the most common call, goes its own way: its state read into
-- locals, decided and written by the token bucket's decision (tbDebt, tbSet: the only functions
-- the script made so far), and answered, before the script makes the rest of the library (Go
-- joins it after this part: script.go) or any table but the reply. A state that Go must
-- convert, or another algorithm's, goes the general way.
if n == 1 and mode == MODE_DECIDE and ARGV[ARGS + L_ALGORITHM] == ALGORITHM_TOKEN_BUCKET and #ARGV == ARGS + TB_ARGS then
  local k, fp = KEYS[1], ARGV[ARGS + L_FINGERPRINT]
  local v, ts, tn, tf = redis.pcall('GET', k), false, 0, 0
  local own = not v -- fresh
  if type(v) == 'string' then
    local vfp, s, m, f = string.match(v, tbState)
    own = vfp == fp
    if own then ts, tn, tf = tonumber(s), tonumber(m), tonumber(f) end
  end
  if own then
    local admits, xs, xn, xf = tbDebt(ARGS, ts, tn, tf)
    if admits then tbSet(k, fp, xs, xn, xf) end
    local reply = {0, 0, 0, 0, 0, 0, 0}
    reply[REPLY_OUTCOME], reply[REPLY_NOW_S], reply[REPLY_NOW_N] = admits and OUTCOME_ADMITTED or OUTCOME_REJECTED, nows, nown
    reply[REPLY_LIMITS - 1 + R_STATE] = ts and STATE_TAT or STATE_FRESH
    reply[REPLY_LIMITS - 1 + R_TAT_S], reply[REPLY_LIMITS - 1 + R_TAT_N], reply[REPLY_LIMITS - 1 + R_TAT_F] = ts or 0, tn, tf
    return reply
  end
end

-- The general way, after the rest of the library (Go joins it here: script.go).

-- decided writes limit l's new state (a token bucket's if tb) if the stack admits the cost
-- (all), deleting first a state that another algorithm left under its key (converted: its used
-- units are charged to l), and answers its block after at.
local function decided(reply, at, l, tb, all, seq)
  if l.other and all then redis.call('DEL', l.k) end
  if l.qt then
    qtReply(reply, at, l) -- the state decided on
    if all then qtAdmit(l, cost) end
  elseif tb then
    tbReply(reply, at, l) -- the state decided on
    if all then tbSet(l.k, l.fp, l.xs, l.xn, l.xf) end
  elseif l.cc then
    ccDecision(reply, at, l, l.held + cost, cost, true, true)
    ccAdmit(l, cost, seq)
  elseif all then
    local used = l.used
    swAdmit(l, cost)
    reply[at + R_ADMITTED], reply[at + R_REMAINING] = ADMITTED, math.max(0, l.limit - used - cost)
    reply[at + R_RESET_AFTER], reply[at + R_RETRY_AFTER] = l.window, 0
  else
    swReply(reply, at, l, cost, false)
  end
end

-- A decision on one sliding window or quota, and no conversion, goes the general way below
-- without its tables and loops: the same functions on the one limit. A limit whose state Go must
-- convert goes the general way.
if n == 1 and mode == MODE_DECIDE then
  local algorithm, l = ARGV[ARGS + L_ALGORITHM], nil
  cost = tonumber(ARGV[ARG_COST])
  if algorithm == ALGORITHM_SLIDING_WINDOW and #ARGV == ARGS + SW_ARGS then
    l = swLoad(KEYS[1], ARGS)
    if l.raw then l = nil end
  elseif algorithm == ALGORITHM_QUOTA and #ARGV == ARGS + QT_ARGS then
    l = qtLoad(KEYS[1], ARGS)
    if l.raw then l = nil end
  end
  if l then
    local admits
    local reply = {0, 0, 0, 0, 0, 0, 0}
    if l.qt then
      if qtNeedsPeriod(l, cost) then
        reply[REPLY_OUTCOME], reply[REPLY_NOW_S], reply[REPLY_NOW_N] = OUTCOME_PERIOD, nows, nown
        return reply
      end
      admits = qtAdmits(l, cost)
    else
      admits = swAdmits(l, cost)
    end
    reply[REPLY_OUTCOME] = admits and OUTCOME_ADMITTED or OUTCOME_REJECTED
    reply[REPLY_NOW_S], reply[REPLY_NOW_N] = nows, nown
    decided(reply, REPLY_LIMITS - 1, l, false, admits)
    return reply
  end
end

-- Read every limit. A release or an extension answers the other limits as a peek, of one unit.
cost = tonumber(ARGV[ARG_COST])
if mode == MODE_RELEASE or mode == MODE_EXTEND then cost = 1 end
local limits, o = {}, ARGS
for i = 1, n do
  local algorithm = ARGV[o + L_ALGORITHM]
  if algorithm == ALGORITHM_TOKEN_BUCKET then
    limits[i] = tbLoad(KEYS[i], o)
    limits[i].tb = true
    o = o + TB_ARGS
  elseif algorithm == ALGORITHM_SLIDING_WINDOW then
    limits[i] = swLoad(KEYS[i], o)
    o = o + SW_ARGS
  elseif algorithm == ALGORITHM_QUOTA then
    limits[i] = qtLoad(KEYS[i], o)
    o = o + QT_ARGS
  elseif algorithm == ALGORITHM_CONCURRENCY then
    limits[i] = ccLoad(KEYS[i], o)
    o = o + CC_ARGS
  else
    return redis.error_reply('decide: limit ' .. i .. ' has algorithm ' .. tostring(algorithm))
  end
end
if (#ARGV - o) % CONVERT_ARGS ~= 0 then
  return redis.error_reply('decide: ' .. #ARGV .. ' arguments for ' .. n .. ' limits')
end
for c = o, #ARGV - 1, CONVERT_ARGS do
  local l = limits[tonumber(ARGV[c + C_LIMIT])]
  if not l then return redis.error_reply('decide: conversion of limit ' .. ARGV[c + C_LIMIT]) end
  if l.tb then
    tbConvert(l, ARGV[c + C_FROM], ARGV[c + C_S], ARGV[c + C_N], ARGV[c + C_F])
  elseif l.qt then
    qtConvert(l, ARGV[c + C_FROM], ARGV[c + C_END], ARGV[c + C_USED])
  elseif l.cc then
    ccConvert(l, ARGV[c + C_FROM], ARGV[c + C_UNITS])
  else
    swConvert(l, ARGV[c + C_FROM], ARGV[c + C_S], ARGV[c + C_N], ARGV[c + C_UNITS])
  end
end

-- The reply, made at its size for MAX_LIMITS limits (growing a table costs more than making it),
-- then cut after the last limit's block: Redis answers a table's elements up to the first nil.
-- Limit i's block follows at[i].
local reply = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
reply[REPLY_LIMITS + n * LIMIT_REPLY] = nil
reply[REPLY_NOW_S], reply[REPLY_NOW_N] = nows, nown
local at = {REPLY_LIMITS - 1, REPLY_LIMITS - 1 + LIMIT_REPLY, REPLY_LIMITS - 1 + 2 * LIMIT_REPLY, REPLY_LIMITS - 1 + 3 * LIMIT_REPLY}
local convert = false
for i = 1, n do convert = convert or limits[i].raw end
-- ended puts the seq of the lease taken (0: none) after the element at, when the stack has a
-- concurrency limit, and returns the reply.
local function ended(last, seq)
  if LEASE_KEY then reply[last + 1], reply[last + 2] = seq, nil end
  return reply
end
-- leaseSeq takes the next seq of the client's lease counter, which lives as long as the longest
-- lease it names, and the slack.
local function leaseSeq()
  local ms = 0
  for i = 1, n do if limits[i].cc then ms = math.max(ms, limits[i].timeout) end end
  ms = math.ceil(ms / 1e6) + tonumber(ARGV[ARG_SLACK_MS])
  local seq = redis.call('INCR', LEASE_KEY)
  if redis.call('PTTL', LEASE_KEY) < ms then redis.call('PEXPIRE', LEASE_KEY, ms) end
  return seq
end
local size = REPLY_LIMITS - 1 + n * LIMIT_REPLY
-- A conversion (Go converts the raw states first; nothing is written) and a peek (what one unit
-- would get) answer each limit's state as it is.
if convert or mode == MODE_PEEK then
  reply[REPLY_OUTCOME] = convert and OUTCOME_CONVERT or OUTCOME_PEEKED
  for i = 1, n do
    local l = limits[i]
    if l.tb then
      tbReply(reply, at[i], l)
    elseif l.qt then
      qtReply(reply, at[i], l)
    elseif l.raw then
      reply[at[i] + R_STATE], reply[at[i] + R_RAW] = STATE_RAW, l.raw
    elseif l.cc then
      ccPeek(reply, at[i], l)
    else
      swReply(reply, at[i], l, cost, not convert and swAdmits(l, cost))
    end
  end
  if convert then return reply end
  return ended(size, 0)
end

if mode == MODE_REFUND then
  -- Another algorithm's state, converted, has nothing to refund: answered as a peek, unwritten
  -- (as limiter.Memory). After the limits' blocks, one element a limit: the units a sliding
  -- window's refund added to its remaining ones (0 for the others: Go refunds those on the
  -- state before, and counts them).
  reply[REPLY_OUTCOME] = OUTCOME_REFUNDED
  local gained = REPLY_LIMITS - 1 + n * LIMIT_REPLY
  reply[gained + n + 1] = nil
  for i = 1, n do
    local l = limits[i]
    reply[gained + i] = 0
    if l.tb then
      tbReply(reply, at[i], l) -- the state before the refund: Go refunds on it as Refund does
      if not l.other then tbRefund(l) end
    elseif l.qt then
      qtReply(reply, at[i], l) -- the state before the refund: Go refunds on it as Refund does
      qtRefund(l, cost)
    elseif l.cc then
      ccPeek(reply, at[i], l) -- a refund gives no place back
    elseif l.other then
      swReply(reply, at[i], l, 1, swAdmits(l, 1))
    else
      local before = math.max(0, l.limit - l.used)
      swRefund(l, cost)
      swReply(reply, at[i], l, 1, swAdmits(l, 1))
      reply[gained + i] = reply[at[i] + R_REMAINING] - before
    end
  end
  return ended(gained + n, 0)
end

if mode == MODE_RELEASE or mode == MODE_EXTEND then
  -- The lease named by the cost argument ("<seq> <s> <ns>": its seq and the instant it was
  -- issued) is ended or moved on each concurrency limit that holds it, under one new seq; the
  -- other limits answer a peek. After the limits' blocks, one element a limit: the places freed
  -- or moved. Nothing is written when no limit holds it.
  reply[REPLY_OUTCOME] = OUTCOME_RELEASED
  local seq, is, isn = string.match(ARGV[ARG_COST], '^(%d+) (%-?%d+) (%d+)$')
  if not seq then return redis.error_reply('decide: lease ' .. ARGV[ARG_COST]) end
  local exact, found, next = ARGV[ARG_NOW_S] ~= '', {}, 0
  for i = 1, n do
    local l = limits[i]
    if l.cc then found[i] = ccFind(l, seq, tonumber(is), tonumber(isn), exact) end
    if found[i] and next == 0 and mode == MODE_EXTEND then next = leaseSeq() end
  end
  for i = 1, n do
    local l = limits[i]
    reply[size + i] = 0
    if l.tb then
      tbReply(reply, at[i], l)
    elseif l.qt then
      qtReply(reply, at[i], l)
    elseif l.cc then
      if found[i] then
        local places = ccRemove(l, found[i])
        if next ~= 0 then ccInsert(l, l.timeout, next, places) end
        ccExpire(l)
        reply[size + i] = places
      elseif not l.other then
        ccTrim(l) -- as limiter.Concurrency's release, which drops the expired leases first
      end
      ccPeek(reply, at[i], l)
    else
      swReply(reply, at[i], l, 1, swAdmits(l, 1))
    end
  end
  return ended(size + n, next)
end

-- Decide on every limit; write them all only if every one admits.
if mode ~= MODE_DECIDE then return redis.error_reply('decide: mode ' .. mode) end
for i = 1, n do
  if limits[i].qt and qtNeedsPeriod(limits[i], cost) then -- Go computes the periods at now first
    reply[REPLY_OUTCOME] = OUTCOME_PERIOD
    return reply
  end
end
local all = true
for i = 1, n do
  local l = limits[i]
  if l.tb then
    l.admits = tbAdmits(l)
  elseif l.qt then
    l.admits = qtAdmits(l, cost)
  elseif l.cc then
    l.admits = ccAdmits(l, cost)
    -- The expired leases are dropped, admitted or not, as limiter.Concurrency's check drops
    -- them: a clock stepping back later finds them gone in both stores.
    if not l.other then ccTrim(l) end
  else
    l.admits = swAdmits(l, cost)
  end
  all = all and l.admits
end
reply[REPLY_OUTCOME] = all and OUTCOME_ADMITTED or OUTCOME_REJECTED
local seq = 0
if all and LEASE_KEY then seq = leaseSeq() end
for i = 1, n do
  local l = limits[i]
  if l.tb or l.qt or all then
    decided(reply, at[i], l, l.tb, all, seq)
  elseif l.cc and l.admits then
    ccDecision(reply, at[i], l, l.held, 1, true, false) -- as it is: nothing taken
  elseif l.cc then
    ccDecision(reply, at[i], l, l.held, cost, false, false)
  else
    swReply(reply, at[i], l, cost, l.admits) -- whether it admits the cost on its own
  end
end
return ended(size, seq)
