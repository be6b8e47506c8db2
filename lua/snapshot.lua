-- snapshot.lua: apply an absolute stock count from a feed, if it is newer than the last.
--
-- KEYS[1]  SKU counters hash    hf:{hfN.j}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN.j}:events
-- KEYS[3]  event guard          hf:{hfN.j}:seen:<source>:<event id>
--
-- ARGV[1] sku   ARGV[2] on_hand per the feed (whole, >= 0)   ARGV[3] version
-- (monotonic per SKU)   ARGV[4] source   ARGV[5] event id   ARGV[6] guard ttl ms
-- ARGV[7] for a split SKU (split.rs), after its other parts' available units were
--         moved here: what those parts keep (their reserved + sold_pending +
--         available - owed + moving); absent otherwise. This part's own units
--         moving out are counted here, when it runs
-- ARGV[8] with ARGV[7]: what only a transfer changes of this part, when the
--         other parts were read (`units:in_flight:ins`, in_flight being
--         moving - parked, units being available +
--         reserved + sold_pending - owed + moving + settled - fed; split.rs,
--         PartFull::mark); if it changed since, the count is not applied
--         ({'moved'}) and the caller reads again: units that moved between this
--         part and another meanwhile would be counted twice or not at all
--
-- The feed cannot know about open holds or sales not yet in its books, so what is
-- sellable is on_hand - reserved - sold_pending. When that is negative (the feed
-- lowered stock under open holds), `available` is 0 and the rest is `owed`: held
-- units that no longer exist, paid back first by units that return. The event's
-- qty is the whole change of `available - owed`, so PostgreSQL follows the feed.
--
-- A split SKU without ARGV[7] answers {'split', parts} and changes nothing.
-- A part marked `hold_back` (another part may owe) parks what would be on
-- sale, as delta.lua does.
--
-- Returns {'applied', available, previous_available, owed}, {'stale', current_version},
-- {'duplicate'}, {'split', parts}, {'moved'} or {'not_warmed'}.
local function whole(v)
  local n = tonumber(v)
  -- Exact in Lua's doubles: |n| < 2^53.
  if n and n == math.floor(n) and n > -9007199254740992 and n < 9007199254740992 then return n end
  return nil
end
local sku, on_hand, version = ARGV[1], whole(ARGV[2]), whole(ARGV[3])
if not on_hand or on_hand < 0 then
  return redis.error_reply('ERR snapshot.lua: on_hand must be a whole number of at least 0')
end
if not version then return redis.error_reply('ERR snapshot.lua: the version must be a whole number') end
if redis.call('EXISTS', KEYS[3]) == 1 then return {'duplicate'} end
local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'version', 'owed', 'epoch', 'parts', 'moving', 'ins', 'settled', 'fed', 'hold_back', 'parked')
if not c[1] then return {'not_warmed'} end
local others = whole(ARGV[7] or '0')
if not others then return redis.error_reply('ERR snapshot.lua: the other parts\' units must be a whole number') end
local parts = tonumber(c[7] or '1')
if parts == 0 or (parts > 1 and not ARGV[7]) then return {'split', parts} end
local current = tonumber(c[4] or '-1')
if version <= current then return {'stale', current} end
if ARGV[8] then
  local n = function(i) return tonumber(c[i] or '0') end
  local units = n(1) + n(2) + n(3) - n(5) + n(8) + n(10) - n(11)
  -- Units on their way out: `moving` less the units parked here (release.lua).
  if ARGV[8] ~= string.format('%d:%d:%d', units, n(8) - n(13), n(9)) then return {'moved'} end
end
local reserved, pending = tonumber(c[2] or '0'), tonumber(c[3] or '0')
local before = tonumber(c[1]) - tonumber(c[5] or '0')
-- Units on their way out of this part land in another part: not on sale here.
local effective = on_hand - reserved - pending - others - tonumber(c[8] or '0')
local available, owed = effective, 0
if effective < 0 then available, owed = 0, -effective end
-- `gen` counts changes of `available` that may raise it (the split sold-out check, split.rs).
redis.call('HSET', KEYS[1], 'available', available, 'owed', owed, 'version', version)
-- While another part may owe, what would be on sale is parked (as in delta.lua).
if parts > 1 and c[12] and available > 0 then
  redis.call('HINCRBY', KEYS[1], 'moving', available)
  redis.call('HINCRBY', KEYS[1], 'parked', available)
  redis.call('HSET', KEYS[1], 'available', 0)
  available = 0
end
redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('HINCRBY', KEYS[1], 'fed', effective - before)
redis.call('SET', KEYS[3], '1', 'PX', ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], '*', 'kind', 'snapshot', 'sku', sku,
  'qty', effective - before, 'rid', '', 'available', available, 'reserved', reserved,
  'sold_pending', pending, 'owed', owed, 'source', ARGV[4], 'event_id', ARGV[5],
  'version', version, 'epoch', c[6] or '', 'ts', now)
return {'applied', available, tonumber(c[1]), owed}
