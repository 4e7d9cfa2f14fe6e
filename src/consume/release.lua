-- Releases a scanId's marker after a failed attempt, if that attempt still
-- holds it: 'free', so the next attempt claims it at once (a marker that is
-- simply gone is a lease run out, which claim.lua makes wait a lease more).
-- KEYS[1] the marker. ARGV[1] the attempt's token, ARGV[2] the TTL (s).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], 'free', 'EX', ARGV[2])
  return 1
end
return 0
