-- lock_extend.lua: renew a lease, only by its holder.
--
-- KEYS[1]  lock   hf:lock:{<name>}
-- ARGV[1]  holder token   ARGV[2] new lease ms
--
-- Returns 1 when extended, 0 when the lock is not held with that token (it
-- expired or another holder has it: the caller must stop its work).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
