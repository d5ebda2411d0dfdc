-- Distributed bulkhead: take a lease (one slot) of a key, time from Redis TIME.
--
-- KEYS[1]  the leases: a sorted set token -> expiry (ms since the epoch, Redis time)
-- KEYS[2]  the "someone waits" flag (same hash tag): release publishes only if it exists
-- ARGV     token limit lease_ms
-- returns  {acquired (0|1), leases held now (this one included if acquired), wait_ms}
--          wait_ms: when refused, milliseconds until the earliest lease expires (the
--          latest a waiter must retry without a release notification); else the lease.
-- Idempotent by token: a token that already holds a live lease renews it and is
-- admitted again without taking a second slot (a retried, lost reply is harmless).
-- Expired leases (crashed holders) are reaped first. The sorted set expires with its
-- last lease, so an abandoned key disappears by itself.
local leases = KEYS[1]
local token = ARGV[1]
local limit = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
local held = redis.call('ZSCORE', leases, token)
local count = redis.call('ZCARD', leases)
if held or count < limit then
  redis.call('ZADD', leases, now + lease, token)
  if not held then
    count = count + 1
  end
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', leases, tonumber(last[2]))
  return {1, count, lease}
end
-- No lease to wait for (the limit is spent by slots not in Redis yet): retry after a
-- lease's length at the latest, as if one had just been taken.
local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
local wait = lease
if first[2] then
  wait = tonumber(first[2]) - now
end
if wait < 1 then
  wait = 1
end
redis.call('SET', KEYS[2], '1', 'PX', lease)
return {0, count, wait}
