-- lock_acquire.lua: take a named lease if it is free, with a fencing token.
--
-- KEYS[1]  lock         hf:lock:{<name>}          value: the holder's random token
-- KEYS[2]  fence        hf:lock:{<name>}:fence    counter that only ever grows
--
-- ARGV[1] holder token   ARGV[2] lease ms
--
-- Returns {1, fencing_token} when acquired, {0, remaining_ms} when held by another.
-- The fence counter never expires, so a later holder always gets a larger token
-- and PostgreSQL can refuse writes carrying an older one.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
