-- late.lua: apply to a counter a stock movement PostgreSQL is recording now that
-- happened before the counter was built: Redis lost its data (and the counter
-- with it) while the write-behind carried the event, and warm-up rebuilt the
-- counter from rows that did not have it yet. Without this the counter would
-- sell the units of a sale twice, or keep units a feed took away.
--
-- The write-behind calls it for each movement it records for the first time,
-- before its commit and while it holds the SKU's row: a warm-up reads rows
-- under a share lock, so it saw the movement (and the counter's epoch is not
-- older than it) or built the counter before it (and the epochs differ).
--
-- KEYS[1]  SKU counters hash    hf:{hfN.j}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN.j}:events
-- KEYS[3]  event guard          hf:{hfN.j}:seen:<source>:<event id> (the feed's
--          own guard, or the sale line's): applied once, and not at all when a
--          redelivered feed event was applied to the new counter already
--
-- ARGV[1] sku   ARGV[2] change of on hand (signed: a sale is negative)
-- ARGV[3] 'sale' | 'feed'   ARGV[4] the epoch the event carried ('' for none)
-- ARGV[5] guard ttl ms   ARGV[6] a snapshot's version (-1: not a snapshot),
-- which the counter's version is raised to, so an older snapshot stays refused
--
-- Returns {'applied', available, owed}, {'current'} (the counter is the event's
-- own: nothing to do), {'already'} or {'not_warmed'}.
local c = redis.call('HMGET', KEYS[1], 'available', 'owed', 'epoch', 'reserved', 'sold_pending', 'version')
if not c[1] then return {'not_warmed'} end
if (c[3] or '') == ARGV[4] then return {'current'} end
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[5]) then return {'already'} end
local change = tonumber(ARGV[2])
local effective = tonumber(c[1]) - tonumber(c[2] or '0') + change
local available, owed = effective, 0
if effective < 0 then available, owed = 0, -effective end
-- `gen` counts changes of `available` that may raise it (the split sold-out check, split.rs).
redis.call('HSET', KEYS[1], 'available', available, 'owed', owed)
redis.call('HINCRBY', KEYS[1], 'gen', 1)
local version = tonumber(ARGV[6])
if version >= 0 and version > tonumber(c[6] or '-1') then
  redis.call('HSET', KEYS[1], 'version', version)
end
-- What PostgreSQL records now, the counter counts as recorded too.
if ARGV[3] == 'sale' then
  redis.call('HINCRBY', KEYS[1], 'settled', -change)
else
  redis.call('HINCRBY', KEYS[1], 'fed', change)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], '*', 'kind', 'corrected', 'sku', ARGV[1],
  'qty', change, 'rid', '', 'available', available, 'reserved', c[4] or '0',
  'sold_pending', c[5] or '0', 'owed', owed, 'ts', now)
return {'applied', available, owed}
