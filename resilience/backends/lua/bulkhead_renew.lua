-- Distributed bulkhead: extend a held lease by lease_ms from now (Redis TIME).
--
-- KEYS[1]  the leases sorted set (see bulkhead_acquire.lua)
-- ARGV     token lease_ms
-- returns  1 if the lease was still held (now extended), 0 if it was lost (expired and
--          reaped, or removed): the holder no longer counts against the limit.
local leases = KEYS[1]
local token = ARGV[1]
local lease = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
if not redis.call('ZSCORE', leases, token) then
  return 0
end
redis.call('ZADD', leases, 'XX', now + lease, token)
local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', leases, tonumber(last[2]))
return 1
