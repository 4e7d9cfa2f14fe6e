-- Claims a scanId's marker for one attempt (the rule of schedule::claim).
-- KEYS[1] the marker, KEYS[2] the scan's attempt counter (same hash tag),
-- and for a job read from a stream, KEYS[3] the stream (same slot).
-- ARGV[1] the attempt's token, ARGV[2] the lease (ms), ARGV[3] the attempt
-- number this claim renews (0: a new attempt), ARGV[4] the counter's TTL (s),
-- ARGV[5] the job's stream entry id (with KEYS[3]).
-- A new attempt of a stream's job runs only while the job's entry is in
-- the stream: one a failover lost (its landing never reached the replica
-- promoted since) is not run from a consumer's hands, for the gate's retry
-- of the same key, which finds no record either, queues it under a new
-- scanId (-2: gone).
-- The marker is an attempt's token (gone when its lease runs out), 'free'
-- (released after a failure), 'done', or 'orphan:<unix ms>': a new attempt
-- found the last one's lease run out unreleased, and waits until then
-- while that attempt may still renew (a failover can lose a live
-- attempt's renewals and its done marker).
-- A done marker read is written again, so that WAIT confirms the replicas
-- hold it before the job is acked on it.
-- Returns the attempt number (>= 1) when claimed or renewed, 0 done, -1 busy
-- (another live attempt, one more lease for a run-out one, or for a
-- renewal: another attempt was numbered since), -2 gone.
local v = redis.call('GET', KEYS[1])
if v == 'done' then
  redis.call('SET', KEYS[1], 'done', 'KEEPTTL')
  return 0
end
local mine = tonumber(ARGV[3])
if mine == 0 and KEYS[3] and #redis.call('XRANGE', KEYS[3], ARGV[5], ARGV[5]) == 0 then
  return -2
end
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local orphan = v and string.sub(v, 1, 7) == 'orphan:'
local held = v and v ~= 'free' and not orphan
if (held and v ~= ARGV[1]) or (mine > 0 and mine ~= n) then
  return -1
end
if mine == 0 then
  if orphan and tonumber(string.sub(v, 8)) > now then
    return -1
  end
  if not v and n > 0 then
    redis.call('SET', KEYS[1], 'orphan:' .. (now + tonumber(ARGV[2])), 'EX', ARGV[4])
    return -1
  end
  if v ~= ARGV[1] then
    n = n + 1
    redis.call('SET', KEYS[2], n, 'EX', ARGV[4])
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return n
