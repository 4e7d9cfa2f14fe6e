-- Frees a pending record's lease, if the record exists, so a retry may take
-- over at once: its attempt gave up without knowing the outcome.
-- KEYS[1] the record.
if redis.call('HGET', KEYS[1], 'state') == 'pending' then
  redis.call('HSET', KEYS[1], 'until', '0')
end
return 0
