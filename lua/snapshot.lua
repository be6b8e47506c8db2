-- snapshot.lua: apply an absolute stock count from a feed, if it is newer than the last.
--
-- KEYS[1]  SKU counters hash    hf:{hfN}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN}:events
-- KEYS[3]  event guard          hf:{hfN}:seen:<source>:<event id>
--
-- ARGV[1] sku   ARGV[2] on_hand per the feed   ARGV[3] version (monotonic per SKU)
-- ARGV[4] source   ARGV[5] event id   ARGV[6] guard ttl ms   ARGV[7] stream MAXLEN
--
-- The feed cannot know about open holds or sales not yet in its books, so the new
-- `available` is on_hand - reserved - sold_pending, and never below 0.
--
-- Returns {'applied', available, previous_available}, {'stale', current_version},
-- {'duplicate'} or {'not_warmed'}.
local sku, on_hand, version = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[3]) == 1 then return {'duplicate'} end
local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'version')
if not c[1] then return {'not_warmed'} end
local current = tonumber(c[4] or '-1')
if version <= current then return {'stale', current} end
local reserved, pending = tonumber(c[2] or '0'), tonumber(c[3] or '0')
local available = on_hand - reserved - pending
if available < 0 then available = 0 end
redis.call('HSET', KEYS[1], 'available', available, 'version', version)
redis.call('SET', KEYS[3], '1', 'PX', ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[7], '*', 'kind', 'snapshot', 'sku', sku,
  'qty', available - tonumber(c[1]), 'rid', '', 'available', available, 'reserved', reserved,
  'sold_pending', pending, 'source', ARGV[4], 'event_id', ARGV[5], 'version', version, 'ts', now)
return {'applied', available, tonumber(c[1])}
