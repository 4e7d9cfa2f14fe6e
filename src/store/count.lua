-- The quota counting script: one atomic round trip per request.
--
-- KEYS[1] the counter, KEYS[2] its first-seen key (same hash tag, same slot).
-- ARGV[1] 'utc-day' (expire at the next 00:00 UTC) or 'rolling' (24 h).
-- Returns {count, reset_at, now}, both instants in unix seconds by the
-- server's clock, so every Lambda agrees on when a day ends.
--
-- INCR and EXPIREAT run in one script because a crash between two separate
-- calls would leave a counter that never expires. The expiry is set whenever
-- it is missing, so even a counter left without one by other means heals on
-- its next increment.

local function iso8601(s)
  -- Civil date from days since the epoch (Howard Hinnant's algorithm).
  local days = math.floor(s / 86400)
  local secs = s - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02dZ', y, m, d,
    math.floor(secs / 3600), math.floor((secs % 3600) / 60), secs % 60)
end

local count = redis.call('INCR', KEYS[1])
local now = tonumber(redis.call('TIME')[1])
local reset_at = redis.call('EXPIRETIME', KEYS[1])
if reset_at < 0 then
  if ARGV[1] == 'rolling' then
    reset_at = now + 86400
  else
    reset_at = now - (now % 86400) + 86400
  end
  redis.call('EXPIREAT', KEYS[1], reset_at)
  redis.call('SET', KEYS[2], iso8601(now), 'EXAT', reset_at, 'NX')
end
return {count, reset_at, now}
