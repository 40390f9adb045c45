-- limiterd: reset one client, and tell every replica to forget its cached rejection.
-- The DEL and the PUBLISH are one atomic step on the node that holds the client, so a replica
-- that gets the message can no longer read the old state there.
--
-- KEYS     the client's state, then the states of its stacked limits (all on the client's slot)
-- ARGV     1 the reset channel; 2 the message: "<policy ID>\0<client key>"
-- Returns  the number of keys deleted
local n = redis.call('DEL', unpack(KEYS))
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
