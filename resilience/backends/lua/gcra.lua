-- GCRA token bucket: one atomic decision per call, time from Redis TIME.
--
-- KEYS[1]  the bucket; its value is the theoretical arrival time (TAT, when the bucket
--          is full again) in microseconds: a number, or "us:frac" when the emission
--          interval is not a whole number of microseconds (frac/d of a microsecond).
--          An absent key is a full bucket; the key expires (PX) when the bucket is full.
-- ARGV     eq tq cost max_wait_us [er d tr]
--          emission interval E = eq (+ er/d) us per token, exact (d = the rate's amount),
--          tolerance T = tq (+ tr/d) us (burst * E), cost tokens, reservation budget.
--          er d tr are passed only when E is not a whole number of microseconds.
-- returns  "wait_us reset_us" (one short string: the cheapest reply to build and parse;
--          formatted with %d: Lua's own number format turns 1e14 and more into 1e+14)
--          wait_us >= 0: admitted; a reservation must wait that long (0: none).
--          wait_us < 0: refused; -wait_us is how long until it could be admitted.
--          reset_us: time until the bucket is full again (the client derives the
--          remaining tokens from it: floor((T - reset) / E)).
--          The fractional path appends the remaining tokens as a third field.
local key = KEYS[1]
local eq = tonumber(ARGV[1])
local tq = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local floor = math.floor

if ARGV[5] == nil then
  -- Whole-microsecond emission interval: the state is one exact integer (< 2^53).
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  local new = tat + cost * eq
  local wait = new - tq - now
  if wait > max_wait then
    return string.format('%d %d', -wait, tat - now)
  end
  if cost > 0 then
    redis.call('SET', key, new, 'PX', math.ceil((new - now) / 1000))
  end
  if wait < 0 then wait = 0 end
  return string.format('%d %d', wait, new - now)
end

-- Fractional emission interval: TAT = us + frac/d, kept exact in two integers.
local er = tonumber(ARGV[5])
local d = tonumber(ARGV[6])
local tr = tonumber(ARGV[7])
local tat, frac = now, 0
local raw = redis.call('GET', key)
if raw then
  local sep = string.find(raw, ':', 1, true)
  local us, f
  if sep then
    us, f = tonumber(string.sub(raw, 1, sep - 1)), tonumber(string.sub(raw, sep + 1))
  else
    us, f = tonumber(raw), 0
  end
  if us and (us > now or (us == now and f > 0)) then
    tat, frac = us, f
  end
end
local e_ticks = eq * d + er
local nf = frac + cost * er
local new_us = tat + cost * eq + floor(nf / d)
local new_frac = nf % d
-- wait in ticks (1/d us) = new - T - now, relative to now so it stays small
local wait = (new_us - tq - now) * d + (new_frac - tr)

if wait > max_wait * d then
  local remaining = floor(((now - tat + tq) * d + tr - frac) / e_ticks)
  if remaining < 0 then remaining = 0 end
  local reset = tat - now
  if frac > 0 then reset = reset + 1 end
  return string.format('%d %d %d', -math.ceil(wait / d), reset, remaining)
end

local reset = new_us - now
if new_frac > 0 then reset = reset + 1 end
if cost > 0 then
  redis.call('SET', key, string.format('%d:%d', new_us, new_frac), 'PX', math.ceil(reset / 1000))
end
local remaining = floor(((now - new_us + tq) * d + tr - new_frac) / e_ticks)
if remaining < 0 then remaining = 0 end
if wait < 0 then wait = 0 end
return string.format('%d %d %d', math.ceil(wait / d), reset, remaining)
