-- One sleep lease, asked alone (pacing off, or a cluster, where the sleep leases live in
-- a slot of their own): KEYS[1] the sleep leases; ARGV: now (unix ms), the lease's
-- end (unix ms), the cap, the lease's name.
return take_sleep_lease(KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4])
