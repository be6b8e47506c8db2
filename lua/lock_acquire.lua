-- lock_acquire.lua: take a named lease if it is free, with a fencing token.
--
-- KEYS[1]  lock         hf:lock:{<name>}          value: the holder's random token
-- KEYS[2]  fence        hf:lock:{<name>}:fence    counter that only ever grows
--
-- ARGV[1] holder token   ARGV[2] lease ms
-- ARGV[3] floor: the newest token the system of record has seen (0 if unknown)
--
-- Returns {1, fencing_token} when acquired, {0, remaining_ms} when held by another.
-- The fence counter never expires, so a later holder always gets a larger token
-- and PostgreSQL can refuse writes carrying an older one. A Redis that lost its
-- data (a restart without persistence, a failover to a replica that missed
-- writes) restarts the counter; the floor makes the next token larger than any
-- PostgreSQL remembers, so fencing never goes backwards.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.call('INCR', KEYS[2])
  local floor = tonumber(ARGV[3] or '0') or 0
  if fence <= floor then
    fence = floor + 1
    redis.call('SET', KEYS[2], fence)
  end
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}
