-- Takes over a pending record whose lease ran out, unless another request
-- did first. KEYS[1] the record; ARGV[1] the lease end read, ARGV[2] the new one.
if redis.call('HGET', KEYS[1], 'state') == 'pending'
  and redis.call('HGET', KEYS[1], 'until') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'until', ARGV[2])
  return 1
end
return 0
