-- Gives back a pacing slot a refused scan took on one line (cluster mode,
-- where a scan's lines live in different slots and are paced apart).
--
-- KEYS[1] the line's slot key. ARGV[1] the slot the scan set, ARGV[2] the
-- slot before it (0: none). Only if nobody has taken a later slot since is
-- the line put back; otherwise the later scan's slot stands (the line is
-- one delay longer, never shorter).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if ARGV[2] == '0' then
    return redis.call('DEL', KEYS[1])
  end
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0
