-- One pacing step: slot = max(arrival, previous slot) + delay.
--
-- KEYS[1] the subject's slot key, KEYS[2] (optional) a keyed scan's record.
-- ARGV: arrival (unix ms), the tier's delay (ms), the backlog cap (ms), the
-- counter's expiry (unix s).
-- Returns {1, delay} and moves the slot on; or, when the delay would exceed
-- the cap, {0, ms until it would fit} and changes nothing. The refusal's
-- refund is the gate's next command, never this script's: a gate that timed
-- out waiting for this reply has already accepted the scan with its tier's
-- delay, so a late run of this script must leave its count and record alone.
local arrival = tonumber(ARGV[1])
local delay = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local reset_at = tonumber(ARGV[4])
local previous = tonumber(redis.call('GET', KEYS[1]) or '0')
local start = math.max(previous, arrival) + delay
local wait = start - arrival
-- A scan with nothing queued ahead is never refused (store::next_slot).
cap = math.max(cap, delay)
if wait > cap then
  return {0, wait - cap}
end
if reset_at > 0 then
  redis.call('SET', KEYS[1], string.format('%.0f', start), 'EXAT', reset_at)
else
  redis.call('SET', KEYS[1], string.format('%.0f', start), 'EX', 86400)
end
if KEYS[2] then
  redis.call('HSET', KEYS[2], 'delayMs', string.format('%.0f', wait))
end
return {1, wait}
