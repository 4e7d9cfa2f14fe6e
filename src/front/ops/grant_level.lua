-- `quota-gate grant --network`: N extra scans for a network level's current
-- period, replacing any earlier grant (N = 0 takes the grant back).
--
-- The request path counts a level with two plain commands (INCR, EXPIREAT
-- ... NX) and reads no grant key, so a level's grant is held in its counter:
-- the grant is taken off the count (the counter holds used - granted, below
-- zero while the grant is not used up), and every gate compares what it
-- reads with the level's limit as it is. KEYS[2] says how much was granted
-- (inspect and GET /quota add it back: used = counter + grant) and expires
-- with the counter.
--
-- KEYS[1] the level's counter, KEYS[2] its grant. ARGV[1] the scans (0:
-- revoke); ARGV[2] the end (unix s) of a period opened now, for a counter
-- that has no expiry (or none at all: the grant opens the period).
-- Returns {expiry (unix s), the grant replaced (0: none)}; {-2, 0} when a
-- revoke found no counter.
local scans = tonumber(ARGV[1])
local at = redis.call('EXPIRETIME', KEYS[1])
if at == -2 then
  -- No counter: a grant key left without one held nothing.
  redis.call('DEL', KEYS[2])
  if scans == 0 then
    return {-2, 0}
  end
end
local earlier = 0
if at ~= -2 then
  earlier = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
end
if at < 0 then
  at = tonumber(ARGV[2])
end
redis.call('INCRBY', KEYS[1], earlier - scans)
redis.call('EXPIREAT', KEYS[1], at)
if scans > 0 then
  redis.call('SET', KEYS[2], scans, 'EXAT', at)
else
  redis.call('DEL', KEYS[2])
end
return {at, earlier}
