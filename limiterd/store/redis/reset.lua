-- limiterd: reset one client, and tell every replica to forget its cached rejection.
-- The DEL and the PUBLISH are one atomic step on the node that holds the client, so a replica
-- that gets the message can no longer read the old state there.
--
-- KEYS[1]  the client's state
-- ARGV     1 the reset channel; 2 the message: "<policy ID>\0<client key>"
-- Returns  the number of keys deleted (0 or 1)
local n = redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
