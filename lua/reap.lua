-- reap.lua: list a bounded batch of holds in one shard whose deadline has passed.
-- Read-only: each listed hold is then ended through release.lua with reason
-- 'expired', which is idempotent, so several reapers may list the same hold and it
-- is still released exactly once.
--
-- KEYS[1]  shard due zset   hf:{hfN.j}:due
-- ARGV[1]  batch size (at most this many ids)
--
-- Returns {rid, ...}, the most overdue first; empty when nothing is due.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now), 'LIMIT', 0, string.format('%d', tonumber(ARGV[1])))
