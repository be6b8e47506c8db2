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
-- A negative target becomes `owed`, never a negative `available`.
--
-- Returns {'corrected', available}, {'moved'} or {'not_warmed'}.
local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'owed')
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
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], '*', 'kind', 'corrected', 'sku', ARGV[1],
  'qty', target - (tonumber(c[1]) - tonumber(c[4] or '0')), 'rid', '', 'available', available,
  'reserved', ARGV[3], 'sold_pending', ARGV[4], 'owed', owed, 'ts', now)
return {'corrected', available}
