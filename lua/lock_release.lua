-- lock_release.lua: give a lease back, only by its holder.
--
-- KEYS[1]  lock   hf:lock:{<name>}
-- ARGV[1]  holder token ('' with ARGV[2] = '1' forces release, for audited admin use)
-- ARGV[2]  force ('1' / '0')
--
-- Returns 1 when released, 0 when the lock is not held with that token.
if ARGV[2] == '1' then return redis.call('DEL', KEYS[1]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
