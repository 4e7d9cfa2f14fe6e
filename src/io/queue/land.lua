-- Adds a keyed scan's job to the stream at most once per scanId.
-- KEYS[1] the stream, KEYS[2] the scanId's marker (same slot).
-- ARGV[1] the job (JSON), ARGV[2] the scanId, ARGV[3] the marker's TTL (s).
-- Returns 1 when the job was added, 0 when it had landed before.
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[3]) then
  redis.call('XADD', KEYS[1], '*', 'job', ARGV[1], 'scanId', ARGV[2])
  return 1
end
-- Landed before: write all the same (the marker's TTL again), so the WAIT
-- behind this script waits for the replication offset of now, which covers
-- the earlier landing. A script that writes nothing leaves the connection's
-- offset where its last write was, and a WAIT would vouch for a job the
-- replica may not hold.
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 0
