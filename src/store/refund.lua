-- Takes back one count, of one period only.
--
-- KEYS[1] the counter, KEYS[2] (optional) a keyed scan's record.
-- ARGV[1] the expiry (unix s) of the period counted in; ARGV[2] the scanId.
-- A counter that is gone is not recreated (DECR would make a -1 that never
-- expires), and one whose expiry is later belongs to a new period (the
-- refund came after 00:00 UTC): neither is touched. The record goes only if
-- it still names this scan.
local decremented = -1
local expiry = redis.call('EXPIRETIME', KEYS[1])
if expiry ~= -2 and expiry <= tonumber(ARGV[1]) then
  decremented = redis.call('DECR', KEYS[1])
end
if KEYS[2] and redis.call('HGET', KEYS[2], 'scanId') == ARGV[2] then
  redis.call('DEL', KEYS[2])
end
return decremented
