-- warm.lua: set a SKU's counters from the system of record.
-- Only where the counter is missing, unless forced: a live counter is the truth
-- for open holds, so a plain warm-up never overwrites it.
--
-- KEYS[1]  SKU counters hash    hf:{hfN}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN}:events
--
-- ARGV[1] sku   ARGV[2] available   ARGV[3] sold_pending   ARGV[4] per-buyer limit (0 = none)
-- ARGV[5] force ('1' overwrites available, sold_pending and limit, keeping reserved)
-- ARGV[6] stream MAXLEN
--
-- Returns {'warmed', available} or {'exists', available}.
local sku, available, pending, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local current = redis.call('HGET', KEYS[1], 'available')
if current and ARGV[5] ~= '1' then return {'exists', tonumber(current)} end
if available < 0 then available = 0 end
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0')
redis.call('HSET', KEYS[1], 'available', available, 'reserved', reserved,
  'sold_pending', pending, 'limit', limit)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'kind', 'warmed', 'sku', sku,
  'qty', 0, 'rid', '', 'available', available, 'reserved', reserved,
  'sold_pending', pending, 'ts', now)
return {'warmed', available}
