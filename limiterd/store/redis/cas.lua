-- limiterd: replace a token bucket's state if it is still the one read (compare and set).
-- Used once per client after a parameter change, when Go converted the state (see
-- tokenbucket.lua).
--
-- KEYS[1]  the client's state
-- ARGV     1 the state read; 2 the state to write ("": delete); 3 its expiry in milliseconds
-- Returns  1 when written, 0 when the state changed meanwhile (the caller decides again)
local v = redis.pcall('GET', KEYS[1])
if v ~= ARGV[1] then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
