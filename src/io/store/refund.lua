-- Takes back one count, of one period only, at the subject and at each
-- level above it the scan was counted at: one fate for all of them.
--
-- ARGV[1] the scanId (empty: an unkeyed refund); ARGV[2] m, the number of
-- counters; then for each counter its period's expiry (unix s) and 1 if it
-- has a first-seen key. KEYS: for each counter its key, its grant key and
-- (when it has one) its first-seen key; then, for a keyed refund, the
-- record. The first counter is the subject's (or, in a cluster, the one
-- level this request takes back); the reply is its DECR's (-1: untouched).
-- A keyed refund is the claim's own: only if the record still names this
-- scan and was counted is anything taken back (a claim that found another
-- attempt's record counted nothing, at no level), and the record goes with
-- it; otherwise -2 and nothing changes.
-- A counter that is gone is not recreated (DECR would make a -1 that never
-- expires), and one whose expiry is later belongs to a new period (the
-- refund came after 00:00 UTC): neither is touched. A counter taken back to
-- 0 is removed with its first-seen key, so a refused scan leaves no key it
-- made; unless a grant is held in it (a network's grant is taken off its
-- counter, so 0 there is a grant used up, not an empty counter).
local m = tonumber(ARGV[2])
local counters = {}
local k = 1
for j = 1, m do
  local counter = {key = KEYS[k], grant = KEYS[k + 1], period = ARGV[1 + 2 * j]}
  k = k + 2
  if ARGV[2 + 2 * j] == '1' then
    counter.first_seen = KEYS[k]
    k = k + 1
  end
  counters[j] = counter
end
local record = KEYS[k]
if record then
  if redis.call('HGET', record, 'scanId') ~= ARGV[1] then
    return -2
  end
  local counted = tonumber(redis.call('HGET', record, 'count') or '0')
  redis.call('DEL', record)
  if counted == nil or counted <= 0 then
    return -2
  end
end
local function take(c)
  local expiry = redis.call('EXPIRETIME', c.key)
  if expiry == -2 or expiry > tonumber(c.period) then
    return -1
  end
  local left = redis.call('DECR', c.key)
  if left == 0 and redis.call('EXISTS', c.grant) == 0 then
    redis.call('DEL', c.key)
    if c.first_seen then
      redis.call('DEL', c.first_seen)
    end
  end
  return left
end
for j = 2, m do
  take(counters[j])
end
return take(counters[1])
