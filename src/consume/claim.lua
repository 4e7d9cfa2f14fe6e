-- Claims a scanId's marker for one attempt (the rule of schedule::claim).
-- KEYS[1] the marker, KEYS[2] the scan's attempt counter (same hash tag).
-- ARGV[1] the attempt's token, ARGV[2] the lease (ms), ARGV[3] the attempt
-- number this claim renews (0: a new attempt), ARGV[4] the counter's TTL (s).
-- Returns the attempt number (>= 1) when claimed or renewed, 0 done, -1 busy
-- (another live attempt, or for a renewal: another attempt was numbered since).
local v = redis.call('GET', KEYS[1])
if v == 'done' then
  return 0
end
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
local mine = tonumber(ARGV[3])
if (v and v ~= ARGV[1]) or (mine > 0 and mine ~= n) then
  return -1
end
if mine == 0 and v ~= ARGV[1] then
  n = n + 1
  redis.call('SET', KEYS[2], n, 'EX', ARGV[4])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return n
