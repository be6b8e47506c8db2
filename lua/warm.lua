-- warm.lua: set SKUs' counters from the system of record, each computed here so
-- that nothing can move between reading the live figures and writing `available`.
-- Only where the counter is missing, unless forced: a live counter is the truth
-- for open holds, so a plain warm-up never overwrites it. Several SKUs of one
-- shard per call (warm-up sends a page's SKUs shard by shard: one call each
-- instead of one per SKU).
--
-- KEYS[1]  shard event stream   hf:{hfN.j}:events
-- KEYS[1+i] SKU i's counters    hf:{hfN.j}:sku:<sku>         (i = 1..n)
--
-- ARGV: ten per SKU, in KEYS order; SKU i's at b = 10 * (i - 1):
-- ARGV[b+1] sku   ARGV[b+2] on_hand (PostgreSQL's)   ARGV[b+3] reserved (units in
-- holds that survived a lost counter; a new counter only)   ARGV[b+4] sold_recorded
-- (PostgreSQL's)   ARGV[b+5] per-buyer limit (0 = none)   ARGV[b+6] force ('1')
-- ARGV[b+7] snapshot version PostgreSQL last recorded (-1: none)
-- ARGV[b+8] fed_recorded (PostgreSQL's sum of recorded feed movements)
-- ARGV[b+9] opens, ARGV[b+10] closes: the drop's schedule, Unix ms (0: none),
-- written on every warm that writes (reserve.lua decides against them by Redis' clock)
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
-- Every SKU's numbers are checked before any is written (a bad number in any of
-- them writes none).
-- Returns one answer per SKU, in order: {'warmed', available, owed} or
-- {'exists', available}.
local function whole(v)
  local n = tonumber(v)
  -- Exact in Lua's doubles: |n| < 2^53.
  if n and n == math.floor(n) and n > -9007199254740992 and n < 9007199254740992 then return n end
  return nil
end
local n = #KEYS - 1
if n < 1 or #ARGV ~= 10 * n then
  return redis.error_reply('ERR warm.lua: ten arguments per SKU, one key per SKU after the stream')
end
local specs = {}
for i = 1, n do
  local b = 10 * (i - 1)
  local spec = {
    sku = ARGV[b + 1], on_hand = whole(ARGV[b + 2]), held = whole(ARGV[b + 3]),
    recorded = whole(ARGV[b + 4]), limit = whole(ARGV[b + 5]), force = ARGV[b + 6] == '1',
    version = whole(ARGV[b + 7]), fed_recorded = whole(ARGV[b + 8]),
    opens = whole(ARGV[b + 9]), closes = whole(ARGV[b + 10]),
  }
  if not (spec.on_hand and spec.held and spec.recorded and spec.limit and spec.version
      and spec.fed_recorded and spec.opens and spec.closes)
    or spec.held < 0 or spec.limit < 0 or spec.opens < 0 or spec.closes < 0 then
    return redis.error_reply('ERR warm.lua: on_hand, reserved, sold_recorded, limit and version must be whole numbers')
  end
  specs[i] = spec
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = t[1] .. '.' .. t[2]
local answers = {}
for i = 1, n do
  local key, w = KEYS[1 + i], specs[i]
  local c = redis.call('HMGET', key, 'available', 'reserved', 'sold_pending', 'settled', 'version', 'fed')
  if c[1] and not w.force then
    answers[i] = {'exists', tonumber(c[1])}
  else
    local effective, reserved, pending
    if c[1] then
      reserved, pending = tonumber(c[2] or '0'), tonumber(c[3] or '0')
      effective = w.on_hand - reserved - pending
        + (w.recorded - tonumber(c[4] or '0')) + (tonumber(c[6] or '0') - w.fed_recorded)
    else
      reserved, pending = w.held, 0
      effective = w.on_hand - w.held
      redis.call('HSET', key, 'reserved', w.held, 'sold_pending', 0, 'settled', w.recorded,
        'fed', w.fed_recorded, 'epoch', epoch)
    end
    local available, owed = effective, 0
    if effective < 0 then available, owed = 0, -effective end
    redis.call('HSET', key, 'available', available, 'owed', owed, 'limit', w.limit,
      'opens', w.opens, 'closes', w.closes)
    -- `gen` counts changes that may raise `available` (the split sold-out check, split.rs).
    redis.call('HINCRBY', key, 'gen', 1)
    if w.version >= tonumber(c[5] or '-1') and w.version >= 0 then
      redis.call('HSET', key, 'version', w.version)
    end
    redis.call('XADD', KEYS[1], '*', 'kind', 'warmed', 'sku', w.sku,
      'qty', 0, 'rid', '', 'available', available, 'reserved', reserved, 'sold_pending', pending,
      'owed', owed, 'ts', now)
    answers[i] = {'warmed', available, owed}
  end
end
return answers
