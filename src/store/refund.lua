-- Takes back one count, of one period only, at the subject and at each
-- level above it the scan was counted at: one fate for all of them.
--
-- KEYS[1] the subject's counter, KEYS[2..n+1] the levels' counters, and
-- KEYS[n+2] (optional) a keyed scan's record. ARGV[1] the expiry (unix s)
-- of the period the subject counted in; ARGV[2] the scanId; ARGV[3] n (0
-- when absent); ARGV[3+i] the period of level i.
-- A keyed refund is the claim's own: only if the record still names this
-- scan and was counted is anything taken back (a claim that found another
-- attempt's record counted nothing, at no level), and the record goes with
-- it; otherwise -2 and nothing changes.
-- A counter that is gone is not recreated (DECR would make a -1 that never
-- expires), and one whose expiry is later belongs to a new period (the
-- refund came after 00:00 UTC): neither is touched.
local n = tonumber(ARGV[3] or '0')
local record = KEYS[n + 2]
if record then
  if redis.call('HGET', record, 'scanId') ~= ARGV[2] then
    return -2
  end
  local counted = tonumber(redis.call('HGET', record, 'count') or '0')
  redis.call('DEL', record)
  if counted == nil or counted <= 0 then
    return -2
  end
end
local function take(key, period)
  local expiry = redis.call('EXPIRETIME', key)
  if expiry ~= -2 and expiry <= tonumber(period) then
    return redis.call('DECR', key)
  end
  return -1
end
for i = 1, n do
  take(KEYS[1 + i], ARGV[3 + i])
end
return take(KEYS[1], ARGV[1])
