-- warm.lua: set a SKU's counters from the system of record, computed here so that
-- nothing can move between reading the live figures and writing `available`.
-- Only where the counter is missing, unless forced: a live counter is the truth
-- for open holds, so a plain warm-up never overwrites it.
--
-- KEYS[1]  SKU counters hash    hf:{hfN.j}:sku:<sku>
-- KEYS[2]  shard event stream   hf:{hfN.j}:events
--
-- ARGV[1] sku   ARGV[2] on_hand (PostgreSQL's)   ARGV[3] reserved (units in holds
-- that survived a lost counter; a new counter only)   ARGV[4] sold_recorded
-- (PostgreSQL's)   ARGV[5] per-buyer limit (0 = none)   ARGV[6] force ('1')
-- ARGV[7] snapshot version PostgreSQL last recorded (-1: none)
-- ARGV[8] fed_recorded (PostgreSQL's sum of recorded feed movements)
-- ARGV[9] opens, ARGV[10] closes: the drop's schedule, Unix ms (0: none), written
-- on every warm that writes (reserve.lua decides against them by Redis' clock)
--
-- A new counter gets available - owed = on_hand - reserved, settled =
-- sold_recorded, fed = fed_recorded, and a new `epoch` (Redis' clock, to the
-- microsecond): events carry the epoch of the counter they moved, so the
-- write-behind can tell an event older than the counter (Redis lost its data
-- while the event was on its way to PostgreSQL) and apply it (late.lua). A forced one keeps its live reserved,
-- sold_pending, settled and fed and gets available - owed = on_hand - reserved -
-- sold_pending + (sold_recorded - settled) + (fed - fed_recorded), the
-- conservation equation with events in flight. A negative result is `owed` (held units
-- that do not exist), never a negative `available`. The snapshot version only
-- ever rises, so a late, older snapshot stays refused after a Redis loss.
--
-- Returns {'warmed', available, owed} or {'exists', available}.
local function whole(v)
  local n = tonumber(v)
  -- Exact in Lua's doubles: |n| < 2^53.
  if n and n == math.floor(n) and n > -9007199254740992 and n < 9007199254740992 then return n end
  return nil
end
local sku = ARGV[1]
local on_hand, held, recorded = whole(ARGV[2]), whole(ARGV[3]), whole(ARGV[4])
local limit, version, fed_recorded = whole(ARGV[5]), whole(ARGV[7]), whole(ARGV[8] or '0')
local opens, closes = whole(ARGV[9] or '0'), whole(ARGV[10] or '0')
if not (on_hand and held and recorded and limit and version and fed_recorded and opens and closes)
  or held < 0 or limit < 0 or opens < 0 or closes < 0 then
  return redis.error_reply('ERR warm.lua: on_hand, reserved, sold_recorded, limit and version must be whole numbers')
end
local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'settled', 'version', 'fed')
if c[1] and ARGV[6] ~= '1' then return {'exists', tonumber(c[1])} end
local effective
if c[1] then
  effective = on_hand - tonumber(c[2] or '0') - tonumber(c[3] or '0')
    + (recorded - tonumber(c[4] or '0')) + (tonumber(c[6] or '0') - fed_recorded)
else
  effective = on_hand - held
  local e = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'reserved', held, 'sold_pending', 0, 'settled', recorded,
    'fed', fed_recorded, 'epoch', e[1] .. '.' .. e[2])
end
local available, owed = effective, 0
if effective < 0 then available, owed = 0, -effective end
redis.call('HSET', KEYS[1], 'available', available, 'owed', owed, 'limit', limit,
  'opens', opens, 'closes', closes)
if version >= tonumber(c[5] or '-1') and version >= 0 then
  redis.call('HSET', KEYS[1], 'version', version)
end
local f = redis.call('HMGET', KEYS[1], 'reserved', 'sold_pending')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[2], '*', 'kind', 'warmed', 'sku', sku,
  'qty', 0, 'rid', '', 'available', available, 'reserved', f[1], 'sold_pending', f[2],
  'owed', owed, 'ts', now)
return {'warmed', available, owed}
