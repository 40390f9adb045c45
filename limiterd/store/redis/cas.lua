-- limiterd: replace a token bucket's state if it is still the one read (compare and set).
-- Used once per client after a parameter change, when Go converted the state (see
-- tokenbucket.lua).
--
-- KEYS[1]  the client's state
-- ARGV     named by the ARG_ locals below: the state read, the state to write ("": delete),
--          its expiry in milliseconds
-- Returns  WRITTEN, or CHANGED when the state changed meanwhile (the caller decides again)

-- Protocol: mirrors protocol.go (Go indices are 0-based); TestScriptsMirrorProtocol compares.
local ARG_READ = 1
local ARG_WRITE = 2
local ARG_TTL_MS = 3
local ARGS = 3
local CHANGED = 0
local WRITTEN = 1
-- End of protocol.

if #ARGV ~= ARGS then return redis.error_reply('cas: ' .. #ARGV .. ' arguments, want ' .. ARGS) end
local v = redis.pcall('GET', KEYS[1])
if v ~= ARGV[ARG_READ] then return CHANGED end
if ARGV[ARG_WRITE] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[ARG_WRITE], 'PX', ARGV[ARG_TTL_MS])
end
return WRITTEN
