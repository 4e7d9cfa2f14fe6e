-- `quota-gate grant`: N extra scans for the subject's current period.
--
-- KEYS[1] the counter, KEYS[2] its grant (one hash tag). ARGV[1]: the scans,
-- ARGV[2]: the period's end (unix s) when it is known without a counter
-- (QUOTA_RESET=utc-day), else 0; ARGV[3]: '1' when the grant must expire
-- whatever the counter's state (a network level's: its count never gives
-- the grant an expiry), so ARGV[2] stands in for a missing counter expiry.
-- The grant expires with the counter. Before the period's first scan there
-- is no counter: under utc-day the period ends at ARGV[2] all the same;
-- under rolling there is no knowing when it will end, and the grant has no
-- expiry until the count that opens the period gives it the counter's
-- (EXPIREAT ... NX, in the count's round trip).
-- Returns the grant's expiry (unix s), or -2 when it waits for the first
-- scan (-1: the counter itself never expires, nor does the grant).
local at = redis.call('EXPIRETIME', KEYS[1])
local known = tonumber(ARGV[2])
if known > 0 and (at == -2 or (at == -1 and ARGV[3] == '1')) then
  at = known
end
if at >= 0 then
  redis.call('SET', KEYS[2], ARGV[1], 'EXAT', at)
else
  redis.call('SET', KEYS[2], ARGV[1])
end
return at
