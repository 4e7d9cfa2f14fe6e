-- Frees a pending record's lease, if the record exists and still names the
-- attempt's scan, so a retry may take over at once: its attempt gave up
-- without knowing the outcome. A claim that found another attempt's record
-- frees nothing: that attempt may still be running.
-- KEYS[1] the record. ARGV[1] the scanId.
if redis.call('HGET', KEYS[1], 'state') == 'pending'
  and redis.call('HGET', KEYS[1], 'scanId') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'until', '0')
end
return 0
