-- correct.lua: reconciliation's fix of a drifted counter, as a compare-and-set.
-- It only writes if available, reserved, sold_pending and owed are exactly what
-- the reconciler read when it computed the drift; otherwise stock moved meanwhile
-- and the SKU is left for the next run.
--
-- KEYS[1]  SKU counters hash    hf:{hfN.j}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN.j}:events
--
-- ARGV[1] sku   ARGV[2] observed available   ARGV[3] observed reserved
-- ARGV[4] observed sold_pending   ARGV[5] observed owed
-- ARGV[6] target available - owed (what the conservation equation expects)
--
-- A negative target becomes `owed`, never a negative `available`. A part of a
-- split SKU marked `hold_back` parks what would be on sale (as delta.lua does).
--
-- Returns {'corrected', available}, {'moved'} or {'not_warmed'}.
local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'owed', 'parts', 'hold_back')
if not c[1] then return {'not_warmed'} end
if c[1] ~= ARGV[2] or (c[2] or '0') ~= ARGV[3] or (c[3] or '0') ~= ARGV[4]
  or (c[4] or '0') ~= ARGV[5] then
  return {'moved'}
end
local target = tonumber(ARGV[6])
local available, owed = target, 0
if target < 0 then available, owed = 0, -target end
-- `gen` counts changes of `available` that may raise it (the split sold-out check, split.rs).
redis.call('HSET', KEYS[1], 'available', available, 'owed', owed)
redis.call('HINCRBY', KEYS[1], 'gen', 1)
-- While another part of a split SKU may owe, what would be on sale is parked
-- (as in delta.lua) for the engine to route.
if tonumber(c[5] or '1') > 1 and c[6] and available > 0 then
  redis.call('HINCRBY', KEYS[1], 'moving', available)
  redis.call('HINCRBY', KEYS[1], 'parked', available)
  redis.call('HSET', KEYS[1], 'available', 0)
  available = 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], '*', 'kind', 'corrected', 'sku', ARGV[1],
  'qty', target - (tonumber(c[1]) - tonumber(c[4] or '0')), 'rid', '', 'available', available,
  'reserved', ARGV[3], 'sold_pending', ARGV[4], 'owed', owed, 'ts', now)
return {'corrected', available}
