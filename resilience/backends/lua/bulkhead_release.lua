-- Distributed bulkhead: give a lease back and wake waiters of other processes.
--
-- KEYS[1]  the leases sorted set (see bulkhead_acquire.lua)
-- KEYS[2]  the "someone waits" flag
-- ARGV     token channel message
-- returns  1 if the lease was held until now, 0 if it had already been lost (expired)
-- A release that frees a slot while somebody waits publishes ``message`` (the key's
-- id) on ``channel``: waiting processes retry at once instead of polling.
local leases = KEYS[1]
local removed = redis.call('ZREM', leases, ARGV[1])
if removed == 1 then
  if redis.call('ZCARD', leases) == 0 then
    redis.call('DEL', leases)
  end
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('PUBLISH', ARGV[2], ARGV[3])
  end
end
return removed
