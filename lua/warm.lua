-- warm.lua: set a SKU's counters from the system of record.
-- Only where the counter is missing, unless forced: a live counter is the truth
-- for open holds, so a plain warm-up never overwrites it.
--
-- KEYS[1]  SKU counters hash    hf:{hfN}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN}:events
--
-- ARGV[1] sku   ARGV[2] available (floored at 0)   ARGV[3] reserved (units in holds
-- that survived the counter)   ARGV[4] settled (PostgreSQL's sold_recorded)
-- ARGV[5] per-buyer limit (0 = none)   ARGV[6] force ('1': the counter exists and
-- only available and the limit are rewritten; reserved, sold_pending and settled
-- are live figures and stay)   ARGV[7] stream MAXLEN
--
-- Returns {'warmed', available} or {'exists', available}.
local sku, available = ARGV[1], tonumber(ARGV[2])
local current = redis.call('HGET', KEYS[1], 'available')
if current and ARGV[6] ~= '1' then return {'exists', tonumber(current)} end
if available < 0 then available = 0 end
if current then
  redis.call('HSET', KEYS[1], 'available', available, 'limit', ARGV[5])
else
  redis.call('HSET', KEYS[1], 'available', available, 'reserved', ARGV[3], 'sold_pending', 0,
    'settled', ARGV[4], 'limit', ARGV[5])
end
local c = redis.call('HMGET', KEYS[1], 'reserved', 'sold_pending')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', 'kind', 'warmed', 'sku', sku,
  'qty', 0, 'rid', '', 'available', available, 'reserved', c[1], 'sold_pending', c[2], 'ts', now)
return {'warmed', available}
