-- limiterd: reset one client, and tell every replica to forget its cached rejection.
-- The DEL and the PUBLISH are one atomic step on the node that holds the client, so a replica
-- that gets the message can no longer read the old state there. In the same step, when a state
-- deleted had time to live left (units to refill), the client's reset mark records the reset's
-- instant for as long as the longest of them, and ARGV[5] more: a refund of a charge made at or
-- before that instant (the once script) is void, since the charge was deleted with the state.
-- A mark already there keeps the later instant and the longer life.
--
-- KEYS     the client's reset mark, then the client's state, then the states of its stacked
--          limits (all on the client's slot)
-- ARGV     1 the reset channel; 2 the message: "<policy ID>\0<client key>"; 3, 4 the reset's
--          instant (s, n); 5 the milliseconds the mark outlives the states it replaces
-- Returns  the number of keys deleted
local mark = table.remove(KEYS, 1)
local ttl = -1
for _, k in ipairs(KEYS) do ttl = math.max(ttl, redis.call('PTTL', k)) end
local n = redis.call('DEL', unpack(KEYS))
if ttl > 0 then
  local s, ns = tonumber(ARGV[3]), tonumber(ARGV[4])
  ttl = ttl + tonumber(ARGV[5])
  local old = redis.call('GET', mark)
  if old then
    local os, on = string.match(old, '^(-?%d+) (%d+)$')
    os, on = tonumber(os), tonumber(on)
    if os and (os > s or os == s and on > ns) then s, ns = os, on end
    ttl = math.max(ttl, redis.call('PTTL', mark))
  end
  redis.call('SET', mark, string.format('%d %d', s, ns), 'PX', ttl)
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
