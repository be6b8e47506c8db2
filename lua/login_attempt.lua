-- Counts one sign-in attempt against a limit, in one step: a burst of attempts
-- cannot all pass a check made before any of them was counted. The attempt is
-- counted as a failure up front; the caller takes it back if the password was
-- right.
--
-- KEYS[1]  the counter
-- ARGV[1]  the limit (attempts per window)
-- ARGV[2]  the window, in milliseconds
--
-- Returns {'ok', count} or {'full', ms until the window ends} (nothing counted).
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[1]) then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then ttl = tonumber(ARGV[2]) end
  return {'full', ttl}
end
n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2], 'NX')
return {'ok', n}
