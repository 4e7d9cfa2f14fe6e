-- A keyed scan's count: the idempotency record and the count, atomically.
--
-- KEYS[1] the counter, KEYS[2] its first-seen key, KEYS[3] the record,
-- KEYS[4] the subject's grant (all under the subject's hash tag); then the
-- counter of each level above the subject (standalone only: a level has a
-- slot of its own). ARGV: period end (unix s), now (ISO 8601), scanId, body
-- fingerprint, received (unix ms), lease end (unix ms), record TTL (s).
-- Returns {0, {field, value, ...}} when the record exists (nothing counted),
-- else {count, reset_at, grant} after counting exactly as the plain pipeline
-- does (grant: the extra scans granted this period, 0 when none), followed by
-- {held, reset_at} for each level, counted as the pipeline counts a level
-- (a level's grant is held in its counter: held = used - granted).
local existing = redis.call('HGETALL', KEYS[3])
if #existing > 0 then
  return {0, existing}
end
local count = redis.call('INCR', KEYS[1])
redis.call('EXPIREAT', KEYS[1], ARGV[1], 'NX')
redis.call('SET', KEYS[2], ARGV[2], 'EXAT', ARGV[1], 'NX')
local reset_at = redis.call('EXPIRETIME', KEYS[1])
-- A grant made before the period's first scan has no expiry: it ends with
-- the counter (as the plain pipeline's EXPIREAT ... NX does).
redis.call('EXPIREAT', KEYS[4], reset_at, 'NX')
redis.call('HSET', KEYS[3], 'state', 'pending', 'scanId', ARGV[3], 'fp', ARGV[4],
  'received', ARGV[5], 'until', ARGV[6], 'count', count, 'resetAt', reset_at)
redis.call('EXPIRE', KEYS[3], ARGV[7])
local reply = {count, reset_at, tonumber(redis.call('GET', KEYS[4]) or 0) or 0}
for i = 5, #KEYS do
  local held = redis.call('INCR', KEYS[i])
  redis.call('EXPIREAT', KEYS[i], ARGV[1], 'NX')
  table.insert(reply, held)
  table.insert(reply, redis.call('EXPIRETIME', KEYS[i]))
end
return reply
