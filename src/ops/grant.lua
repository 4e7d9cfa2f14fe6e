-- `quota-gate grant`: N extra scans for the subject's current period.
--
-- KEYS[1] the counter, KEYS[2] its grant (one hash tag). ARGV: the scans
-- (0 takes the grant back), the period end a new counter would get (unix s).
-- The grant expires with the counter, or, before the first scan of the
-- period, when that counter will. Returns the grant's expiry (0: revoked).
local scans = tonumber(ARGV[1])
if scans == 0 then
  redis.call('DEL', KEYS[2])
  return 0
end
local at = redis.call('EXPIRETIME', KEYS[1])
if at < 0 then
  at = tonumber(ARGV[2])
end
redis.call('SET', KEYS[2], scans, 'EXAT', at)
return at
