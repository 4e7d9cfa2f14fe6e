-- The sleep leases every gate process shares, a counting semaphore
-- (crate::delay::take_sleep_lease is the same rule): `key` a sorted set of
-- leases, each scored by the instant (unix ms, a string) it ends. Leases
-- that ended by `now` are dropped first, so a sleeper that was killed frees
-- its lease by itself. A lease is taken when fewer than `cap` are held; the
-- set lives as long as its last lease.
-- Returns {taken (0/1), requests asleep (this one included)}.
local function take_sleep_lease(key, now, ends, cap, id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local held = redis.call('ZCARD', key)
  if held >= cap then
    return {0, held}
  end
  redis.call('ZADD', key, ends, id)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', key, last[2])
  return {1, held + 1}
end
