-- delta.lua: apply a stock movement from a feed ("+50 received", "-3 damaged"), once.
--
-- KEYS[1]  SKU counters hash    hf:{hfN.j}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN.j}:events
-- KEYS[3]  event guard          hf:{hfN.j}:seen:<source>:<event id>
--
-- ARGV[1] sku   ARGV[2] delta (signed whole number)   ARGV[3] source   ARGV[4] event id
-- ARGV[5] guard ttl ms (how long a delivered event id is remembered)
-- ARGV[6] 'gathered' when the SKU is split and its other parts' available units
--         were just moved here (split.rs); '' otherwise
--
-- The whole movement is applied and recorded: on hand follows the feed. Units in
-- open holds cannot be taken back, so a decrease larger than `available` takes
-- `available` to 0 and the rest becomes `owed`: held units that no longer exist.
-- Units coming back (a release, an expiry) pay the debt before they are available
-- again; a receipt pays it first too. `available - owed` is what the equation
-- counts (see docs/stock-rules.md).
--
-- A decrease of a split SKU is applied only once its other parts' units are
-- here (else units the feed removed could still be sold there): without
-- 'gathered' it answers {'split', parts} and changes nothing.
--
-- A part of a split SKU marked `hold_back` (another part may owe) parks what
-- would be on sale (`parked`, counted in `moving`), as release.lua does.
--
-- Returns {'applied', available, owed, parts}, {'duplicate'}, {'split', parts}
-- (parts 0: being changed) or {'not_warmed'}.
local function whole(v)
  local n = tonumber(v)
  -- Exact in Lua's doubles: |n| < 2^53.
  if n and n == math.floor(n) and n > -9007199254740992 and n < 9007199254740992 then return n end
  return nil
end
local sku, delta = ARGV[1], whole(ARGV[2])
if not delta then return redis.error_reply('ERR delta.lua: the delta must be a whole number') end
if redis.call('EXISTS', KEYS[3]) == 1 then return {'duplicate'} end
local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'owed', 'epoch', 'parts', 'hold_back')
if not c[1] then return {'not_warmed'} end
local parts = tonumber(c[6] or '1')
-- 0: its parts are being changed: wait (the engine tries again shortly).
if parts == 0 or (delta < 0 and parts > 1 and ARGV[6] ~= 'gathered') then return {'split', parts} end
local effective = tonumber(c[1]) - tonumber(c[4] or '0') + delta
local available, owed = effective, 0
if effective < 0 then available, owed = 0, -effective end
-- `gen` counts changes of `available` that may raise it (the split sold-out check, split.rs).
redis.call('HSET', KEYS[1], 'available', available, 'owed', owed)
-- While another part of a split SKU may owe, this part's units are parked
-- for the engine to route (as release.lua's are), not put on sale.
if parts > 1 and c[7] and available > 0 then
  redis.call('HINCRBY', KEYS[1], 'moving', available)
  redis.call('HINCRBY', KEYS[1], 'parked', available)
  redis.call('HSET', KEYS[1], 'available', 0)
  available = 0
end
redis.call('HINCRBY', KEYS[1], 'gen', 1)
-- `fed` sums what feeds applied; PostgreSQL's fed_recorded catches up through the
-- write-behind, and reconciliation counts the difference as in flight.
redis.call('HINCRBY', KEYS[1], 'fed', delta)
redis.call('SET', KEYS[3], '1', 'PX', ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], '*', 'kind', 'delta', 'sku', sku,
  'qty', delta, 'rid', '', 'available', available, 'reserved', c[2] or '0',
  'sold_pending', c[3] or '0', 'owed', owed, 'source', ARGV[3], 'event_id', ARGV[4], 'epoch', c[5] or '', 'ts', now)
return {'applied', available, owed, parts}
