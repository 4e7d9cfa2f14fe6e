-- `quota-gate grant`: N extra scans for the subject's current period.
--
-- KEYS[1] the counter, KEYS[2] its grant (one hash tag). ARGV[1]: the scans,
-- ARGV[2]: the period's end (unix s) when it is known without a counter
-- (QUOTA_RESET=utc-day), else 0.
-- The grant expires with the counter. Before the period's first scan there
-- is no counter: under utc-day the period ends at ARGV[2] all the same (and
-- a counter without an expiry, which its next count heals to that end,
-- stands for it too: under utc-day the count does not give a grant an
-- expiry); under rolling there is no knowing when it will end, and the
-- grant has no expiry until the count that opens the period gives it the
-- counter's (EXPIREAT ... NX, in the count's round trip).
-- Returns the grant's expiry (unix s), or -2 when it waits for the first
-- scan (-1: the counter itself never expires, nor does the grant).
local at = redis.call('EXPIRETIME', KEYS[1])
local known = tonumber(ARGV[2])
if known > 0 and at < 0 then
  at = known
end
if at >= 0 then
  redis.call('SET', KEYS[2], ARGV[1], 'EXAT', at)
else
  redis.call('SET', KEYS[2], ARGV[1])
end
return at
