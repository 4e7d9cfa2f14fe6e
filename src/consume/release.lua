-- Releases a scanId's marker after a failed attempt, if that attempt still holds it.
-- KEYS[1] the marker. ARGV[1] the attempt's token.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
