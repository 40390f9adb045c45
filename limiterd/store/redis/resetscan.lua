-- limiterd: one step of a reset's search for the keys of a client's limits (Store.limitKeys).
-- Sent with the client's key, so that it runs on the node that holds the client's slot, where
-- every key of the client's limits is; it only reads.
--
-- KEYS     the client's state (not read: it routes the call)
-- ARGV     1 SCAN's cursor; 2 the MATCH pattern; 3 the COUNT
-- Returns  SCAN's answer: the next cursor ("0": done) and the keys found
return redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
