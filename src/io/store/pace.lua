-- One pacing step over one or more lines (the subject's, and each level's
-- above it that is over its limit): start = the latest of
-- max(arrival, previous slot) + delay, and every line's slot moves to it
-- (crate::pace::next_start is the same rule); and, when asked, a sleep
-- lease (take_sleep_lease, prepended from sleep_lease.lua).
--
-- KEYS[1..n] the lines' slot keys, then a keyed scan's record (when
-- ARGV[4+2n] is 1), then the sleep leases (when one is asked). ARGV: n, arrival
-- (unix ms), the backlog cap (ms), then for each line its tier delay (ms)
-- and its counter's expiry (unix s, 0: none known); then the record flag,
-- and the sleep budget (ms, 0: no sleep lease asked), cap, lease name and
-- grace (ms).
-- Returns {1, delay, the first line's previous slot, sleep lease taken (0/1, -1:
-- none asked), requests asleep} and moves the slots on (the previous slot
-- lets a cluster give a line back); or, when the delay would exceed the
-- cap, {0, ms until it would fit, then each line's own ms past the cap
-- (crate::pace::line_excess)} and changes nothing. The refusal's refund
-- is the gate's next command, never this script's: a gate that timed out
-- waiting for this reply has already accepted the scan with its tier's
-- delay, so a late run of this script must leave its count and record alone.
local n = tonumber(ARGV[1])
local arrival = tonumber(ARGV[2])
local backlog = tonumber(ARGV[3])
local start = arrival
local longest = 0
local first = tonumber(redis.call('GET', KEYS[1]) or '0')
local excess = {}
-- A line with no delay (within its limit) holds nothing back; its slot stays.
for i = 1, n do
  local delay = tonumber(ARGV[2 + 2 * i])
  excess[i] = 0
  if delay > 0 then
    local previous = tonumber(redis.call('GET', KEYS[i]) or '0')
    local own = math.max(previous, arrival) + delay
    start = math.max(start, own)
    longest = math.max(longest, delay)
    excess[i] = math.max(0, own - arrival - math.max(backlog, delay))
  end
end
local wait = start - arrival
-- A scan with nothing queued ahead is never refused (pace::next_start).
local cap = math.max(backlog, longest)
if wait > cap then
  local refused = {0, wait - cap}
  for i = 1, n do
    refused[2 + i] = excess[i]
  end
  return refused
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
local extra = 4 + 2 * n
local keyed = ARGV[extra] == '1'
if keyed then
  redis.call('HSET', KEYS[n + 1], 'delayMs', string.format('%.0f', wait))
end
local budget = tonumber(ARGV[extra + 1])
if budget > 0 then
  local ends = arrival + math.min(wait, budget) + tonumber(ARGV[extra + 4])
  local sleep_leases = KEYS[keyed and n + 2 or n + 1]
  local sleep_lease = take_sleep_lease(sleep_leases, ARGV[2], string.format('%.0f', ends),
    tonumber(ARGV[extra + 2]), ARGV[extra + 3])
  return {1, wait, first, sleep_lease[1], sleep_lease[2]}
end
return {1, wait, first, -1, 0}
