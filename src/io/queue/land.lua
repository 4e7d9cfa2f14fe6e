-- Adds a keyed scan's job to the stream at most once per idempotency
-- record. KEYS[1] the stream, KEYS[2] the record's marker, KEYS[3] the
-- scanId's marker of earlier versions (all in one slot). ARGV[1] the job
-- (JSON), ARGV[2] its scanId, ARGV[3] when the record expires (unix s):
-- the marker expires with it.
-- Returns the scanId the record's job is in the stream under: ARGV[2] when
-- added now or before, another when an earlier attempt's job landed (one
-- whose claim a failover lost, say).
local landed = redis.call('GET', KEYS[2])
if not landed and redis.call('EXISTS', KEYS[3]) == 1 then
  -- Landed by a version that marked each scanId (for a day after an upgrade).
  landed = ARGV[2]
end
if not landed then
  redis.call('SET', KEYS[2], ARGV[2], 'EXAT', ARGV[3])
  redis.call('XADD', KEYS[1], '*', 'job', ARGV[1], 'scanId', ARGV[2])
  return ARGV[2]
end
-- Landed before: write all the same (the marker again, kept to the later
-- of its expiry and this record's), so the WAIT behind this script waits
-- for the replication offset of now, which covers the earlier landing. A
-- script that writes nothing leaves the connection's offset where its last
-- write was, and a WAIT would vouch for a job the replica may not hold.
local at = math.max(redis.call('EXPIRETIME', KEYS[2]), tonumber(ARGV[3]))
redis.call('SET', KEYS[2], landed, 'EXAT', at)
return landed
