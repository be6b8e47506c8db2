-- correct.lua: reconciliation's fix of a drifted counter.
--
-- The drift the reconciler measured is the counter's conserved sum
-- (`available + moving + reserved + sold_pending - owed + settled - fed`) less
-- PostgreSQL's. A reservation, payment, release, expiry, settle, feed or late
-- event moves units between the sum's terms and keeps it, so the drift still
-- holds while the sum is what the reconciler read: the change is applied to
-- `available - owed` as it is now, however busy the shoppers are. Otherwise
-- (a warm-up rebuilt the counter meanwhile) nothing is written and the SKU is
-- left for the next run.
--
-- KEYS[1]  SKU counters hash    hf:{hfN.j}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN.j}:events
--
-- ARGV[1] sku   ARGV[2] the conserved sum as measured
-- ARGV[3] the change of `available - owed` (the drift, negated)
-- ARGV[4] for part 0 of a split SKU (split.rs): `in_flight:ins` as read with
--         the other parts at rest (in_flight being moving - parked; PartFull::mark);
--         a transfer to or from another part since changes it, and the
--         correction is not applied ({'moved'}); absent otherwise
--
-- A negative result becomes `owed`, never a negative `available`. A part of a
-- split SKU marked `hold_back` parks what would be on sale (as delta.lua does).
--
-- Returns {'corrected', available, owed}, {'moved'} or {'not_warmed'}.
local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'owed', 'parts',
  'hold_back', 'moving', 'settled', 'fed', 'parked', 'ins')
if not c[1] then return {'not_warmed'} end
local n = function(i) return tonumber(c[i] or '0') end
local conserved = n(1) + n(7) + n(2) + n(3) - n(4) + n(8) - n(9)
if conserved ~= tonumber(ARGV[2]) then return {'moved'} end
if ARGV[4] and ARGV[4] ~= string.format('%d:%d', n(7) - n(10), n(11)) then return {'moved'} end
local change = tonumber(ARGV[3])
local target = n(1) - n(4) + change
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
  'qty', change, 'rid', '', 'available', available,
  'reserved', n(2), 'sold_pending', n(3), 'owed', owed, 'ts', now)
return {'corrected', available, owed}
