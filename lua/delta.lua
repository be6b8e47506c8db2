-- delta.lua: apply a stock movement from a feed ("+50 received", "-3 damaged"), once.
--
-- KEYS[1]  SKU counters hash    hf:{hfN}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN}:events
-- KEYS[3]  event guard          hf:{hfN}:seen:<source>:<event id>
--
-- ARGV[1] sku   ARGV[2] delta (signed integer)   ARGV[3] source   ARGV[4] event id
-- ARGV[5] guard ttl ms (how long a delivered event id is remembered)   ARGV[6] stream MAXLEN
--
-- A negative delta larger than what is available takes `available` to 0, never
-- below: units in open holds cannot be taken back. The part not applied is
-- returned as the shortfall for the operator.
--
-- Returns {'applied', available, shortfall}, {'duplicate'} or {'not_warmed'}.
local sku, delta = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 1 then return {'duplicate'} end
local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending')
if not c[1] then return {'not_warmed'} end
local available = tonumber(c[1])
local applied = delta
local shortfall = 0
if available + delta < 0 then
  applied = -available
  shortfall = -(available + delta)
end
available = redis.call('HINCRBY', KEYS[1], 'available', applied)
redis.call('SET', KEYS[3], '1', 'PX', ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'kind', 'delta', 'sku', sku,
  'qty', applied, 'rid', '', 'available', available, 'reserved', c[2] or '0',
  'sold_pending', c[3] or '0', 'source', ARGV[3], 'event_id', ARGV[4], 'ts', now)
return {'applied', available, shortfall}
