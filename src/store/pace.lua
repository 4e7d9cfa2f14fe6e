-- One pacing step over one or more lines (the subject's, and each level's
-- above it that is over its limit): start = the latest of
-- max(arrival, previous slot) + delay, and every line's slot moves to it
-- (crate::pace::next_start is the same rule).
--
-- KEYS[1..n] the lines' slot keys, KEYS[n+1] (optional) a keyed scan's
-- record. ARGV: n, arrival (unix ms), the backlog cap (ms), then for each
-- line its tier delay (ms) and its counter's expiry (unix s, 0: none known).
-- Returns {1, delay, the first line's previous slot} and moves the slots
-- on (the previous slot lets a cluster give a line back); or, when the delay would
-- exceed the cap, {0, ms until it would fit} and changes nothing. The
-- refusal's refund is the gate's next command, never this script's: a gate
-- that timed out waiting for this reply has already accepted the scan with
-- its tier's delay, so a late run of this script must leave its count and
-- record alone.
local n = tonumber(ARGV[1])
local arrival = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local start = arrival
local longest = 0
local first = tonumber(redis.call('GET', KEYS[1]) or '0')
-- A line with no delay (within its limit) holds nothing back; its slot stays.
for i = 1, n do
  local delay = tonumber(ARGV[2 + 2 * i])
  if delay > 0 then
    local previous = tonumber(redis.call('GET', KEYS[i]) or '0')
    start = math.max(start, math.max(previous, arrival) + delay)
    longest = math.max(longest, delay)
  end
end
local wait = start - arrival
-- A scan with nothing queued ahead is never refused (pace::next_start).
cap = math.max(cap, longest)
if wait > cap then
  return {0, wait - cap}
end
for i = 1, n do
  local reset_at = tonumber(ARGV[3 + 2 * i])
  if tonumber(ARGV[2 + 2 * i]) == 0 then
    -- within its limit: not a line this scan waits in
  elseif reset_at > 0 then
    redis.call('SET', KEYS[i], string.format('%.0f', start), 'EXAT', reset_at)
  else
    redis.call('SET', KEYS[i], string.format('%.0f', start), 'EX', 86400)
  end
end
if KEYS[n + 1] then
  redis.call('HSET', KEYS[n + 1], 'delayMs', string.format('%.0f', wait))
end
return {1, wait, first}
