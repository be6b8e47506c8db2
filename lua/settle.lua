-- settle.lua: after PostgreSQL committed a sale, take it out of sold_pending, once,
-- and count it in `settled` (compared with PostgreSQL's skus.sold_recorded by
-- reconciliation, so a sale between commit and settle is never taken for drift).
--
-- KEYS[1]  hold hash            hf:{hfN.j}:hold:<rid>   (remembers which lines are settled)
-- KEYS[2]  SKU counters hash    hf:{hfN.j}:sku:<sku>
-- KEYS[3]  shard event stream   hf:{hfN.j}:events
--
-- ARGV[1] reservation id   ARGV[2] sku   ARGV[3] qty
-- ARGV[4] the epoch of the counter the sale moved (its event's; '' for none)
--
-- Returns {'settled', sold_pending}, {'already'} (settled before: nothing moves),
-- {'rebuilt'} (the counter was built again after the sale, from PostgreSQL or
-- by late.lua: it already counts the sale as recorded and never had it pending,
-- so only the hold is marked), or {'no_hold'} (the hold's record has lapsed;
-- reconciliation will see the difference as stranded units and never oversell).
local rid, sku, qty = ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[1]) == 0 then return {'no_hold'} end
if redis.call('HSETNX', KEYS[1], 'settled:' .. sku, '1') == 0 then return {'already'} end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'settled', 0} end
if (redis.call('HGET', KEYS[2], 'epoch') or '') ~= ARGV[4] then return {'rebuilt'} end
redis.call('HINCRBY', KEYS[2], 'settled', qty)
local pending = redis.call('HINCRBY', KEYS[2], 'sold_pending', -qty)
if pending < 0 then
  redis.call('HSET', KEYS[2], 'sold_pending', 0)
  pending = 0
end
local c = redis.call('HMGET', KEYS[2], 'available', 'reserved')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[3], '*', 'kind', 'settled', 'sku', sku,
  'qty', qty, 'rid', rid, 'available', c[1], 'reserved', c[2], 'sold_pending', pending, 'ts', now)
return {'settled', pending}
