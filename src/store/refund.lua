-- Takes back one count, of one period only.
--
-- KEYS[1] the counter, KEYS[2] (optional) a keyed scan's record.
-- ARGV[1] the expiry (unix s) of the period counted in; ARGV[2] the scanId.
-- A keyed refund is the claim's own: only if the record still names this
-- scan and was counted is the count taken back (a claim that found another
-- attempt's record counted nothing), and the record goes with it.
-- A counter that is gone is not recreated (DECR would make a -1 that never
-- expires), and one whose expiry is later belongs to a new period (the
-- refund came after 00:00 UTC): neither is touched.
if KEYS[2] then
  if redis.call('HGET', KEYS[2], 'scanId') ~= ARGV[2] then
    return -1
  end
  local counted = tonumber(redis.call('HGET', KEYS[2], 'count') or '0')
  redis.call('DEL', KEYS[2])
  if counted == nil or counted <= 0 then
    return -1
  end
end
local expiry = redis.call('EXPIRETIME', KEYS[1])
if expiry ~= -2 and expiry <= tonumber(ARGV[1]) then
  return redis.call('DECR', KEYS[1])
end
return -1
