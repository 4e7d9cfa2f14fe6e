-- Claims a scanId's marker for one attempt (the rule of schedule::claim).
-- KEYS[1] the marker. ARGV[1] the attempt's token, ARGV[2] the lease (ms).
-- Returns 1 claimed (or renewed: same token), 0 done, -1 busy (another live attempt).
local v = redis.call('GET', KEYS[1])
if v == 'done' then
  return 0
end
if v and v ~= ARGV[1] then
  return -1
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
