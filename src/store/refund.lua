-- Takes back one count after a failed enqueue. DECR on a key that expired in
-- the meantime would create a counter of -1 with no expiry, so only an
-- existing counter is decremented (DECR keeps its expiry).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('DECR', KEYS[1])
end
return -1
