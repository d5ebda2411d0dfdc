-- Distributed bulkhead: how many live (unexpired) leases a key has, by Redis TIME.
--
-- KEYS[1]  the leases sorted set (see bulkhead_acquire.lua)
-- returns  the number of leases whose expiry is in the future
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
