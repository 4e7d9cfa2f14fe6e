-- One bed, asked alone (pacing off, or a cluster, where the beds live in
-- a slot of their own): KEYS[1] the beds; ARGV: now (unix ms), the lease's
-- end (unix ms), the cap, the lease's name.
return take_bed(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4])
