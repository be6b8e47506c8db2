-- release.lua: end a hold and return its units, exactly once however often called.
-- Used by shoppers, checkout and support (reason 'released') and by the reaper
-- (reason 'expired', which only ends holds whose deadline has passed).
--
-- KEYS[1]  hold hash            hf:{hfN.j}:hold:<rid>
-- KEYS[2]  shard due zset       hf:{hfN.j}:due
-- KEYS[3]  shard event stream   hf:{hfN.j}:events
-- then, for line i = 1..n (the hold's lines, in its order), at b = 3 + 3 * (i - 1):
-- KEYS[b+1] SKU counters hash, KEYS[b+2] SKU holds zset, KEYS[b+3] buyer counter
--
-- ARGV[1] reservation id   ARGV[2] reason: 'released' | 'expired' | 'undo'
--          ('undo': a request that does not own the id, or a cart's failed
--          attempt, takes back what it made; ended as 'released' and its record,
--          a refused one or an ended one too, deleted in the same step, so no
--          other attempt's hold made meanwhile under the id is ever deleted)
-- ARGV[3] tombstone ttl ms (how long the ended hold is remembered)
-- ARGV[4..] sku of each line, in KEYS order (checked against the hold), then
--          optionally 'key:<field> <fingerprint>' (the release's
--          Idempotency-Key, kept in the hold as in confirm.lua), then
--          optionally 'fp:' and the fingerprint of the request that made the
--          hold (as in confirm.lua)
--
-- Units coming back pay the SKU's `owed` debt first (units a feed removed while
-- they were held); only the rest becomes available again, unless the line is a
-- part of a split SKU marked `hold_back` (another part may owe): then the rest
-- is parked (`parked`, counted in `moving`) for the engine to route to a part
-- that owes, or back on sale once none does (split.rs, route_parked), as an
-- unsplit SKU's returning units pay its debt before any goes on sale.
--
-- Returns one of:
--   {'released', reason, parked}   units returned now (`parked` of them parked)
--   {'gone', state}        already ended ('confirmed', 'released', 'expired'): nothing moves
--   {'not_due', deadline}  reason 'expired' but the deadline has not passed
--   {'unknown'}            no such hold (never existed, or its tombstone has lapsed)
--   {'mismatch'}           the keys given do not match the hold's lines
--   {'busy'}               a cart's confirmation is deciding this part: nothing moves
--   {'key_reused'}         the Idempotency-Key was kept for another request: nothing moves
-- Numbers go to Redis as text made here with the integer format (see reserve.lua).
local function text(x)
  if type(x) == 'number' then return string.format('%d', x) end
  return x
end
local rid, reason, tomb = ARGV[1], ARGV[2], tonumber(ARGV[3])
local undo = reason == 'undo'
if undo then reason = 'released' end
local h = redis.call('HMGET', KEYS[1], 'state', 'deadline', 'lines', 'buyer', 'fp')
if not h[1] then return {'unknown'} end
-- A caller that knew the hold from memory named the request that made it
-- ('fp:<fingerprint>' last; no SKU has a ':'): any other hold under the id is
-- a mismatch, whatever its state.
local last = #ARGV
local named = string.sub(ARGV[last], 1, 3) == 'fp:'
if named then
  if string.sub(ARGV[last], 4) ~= h[5] then return {'mismatch'} end
  last = last - 1
end
-- A refused request's record (reserve.lua) is no hold.
if h[1] == 'refused' then
  if undo then redis.call('DEL', KEYS[1]) end
  return {'unknown'}
end
-- The release's Idempotency-Key, kept in the hold (as in confirm.lua).
local kfield, kfp = string.match(ARGV[last], '^key:(%S+) (%S+)$')
if kfield then
  last = last - 1
  local prior = redis.call('HGET', KEYS[1], kfield)
  if prior and prior ~= kfp then return {'key_reused'} end
end
local skus = last - 3
if h[1] == 'confirming' then return {'busy'} end
if h[1] ~= 'held' then
  if undo and h[1] ~= 'confirmed' then
    redis.call('DEL', KEYS[1])
  elseif kfield then
    -- Kept at least a tombstone's lifetime from now (as in confirm.lua).
    redis.call('HSET', KEYS[1], kfield, kfp)
    local left = redis.call('PTTL', KEYS[1])
    if left >= 0 and left < tomb then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  end
  return {'gone', h[1]}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if reason == 'expired' and tonumber(h[2]) > now then return {'not_due', tonumber(h[2])} end

local i = 0
local parsed = {}
for sku, qty in string.gmatch(h[3], '([^,=]+)=(%d+)') do
  i = i + 1
  if ARGV[3 + i] ~= sku then return {'mismatch'} end
  parsed[i] = {sku, tonumber(qty)}
end
if skus ~= i then return {'mismatch'} end

local parked = 0
for j = 1, i do
  local b, sku, qty = 3 + 3 * (j - 1), parsed[j][1], parsed[j][2]
  -- A missing counter is never recreated here: that would fabricate a "warmed"
  -- SKU holding only these units. Warm-up rebuilds it from PostgreSQL instead.
  local available, reserved, pending, owed = '', '', '', ''
  if redis.call('EXISTS', KEYS[b + 1]) == 1 then
    local o = redis.call('HMGET', KEYS[b + 1], 'owed', 'hold_back')
    owed = tonumber(o[1] or '0')
    local paid = math.min(owed, qty)
    if paid > 0 then owed = redis.call('HINCRBY', KEYS[b + 1], 'owed', -paid) end
    -- A part of a split SKU that may owe elsewhere (`hold_back`) parks the
    -- rest: no unit goes on sale while another part owes (split.rs routes it).
    local rest = qty - paid
    if o[2] and rest > 0 then
      redis.call('HINCRBY', KEYS[b + 1], 'moving', rest)
      redis.call('HINCRBY', KEYS[b + 1], 'parked', rest)
      parked = parked + rest
      rest = 0
    end
    available = redis.call('HINCRBY', KEYS[b + 1], 'available', rest)
    -- A rise of a split SKU's part: the sold-out check (split.rs) sees it.
    if string.find(sku, '~', 1, true) then redis.call('HINCRBY', KEYS[b + 1], 'gen', 1) end
    reserved = redis.call('HINCRBY', KEYS[b + 1], 'reserved', -qty)
    pending = redis.call('HGET', KEYS[b + 1], 'sold_pending') or '0'
  end
  redis.call('ZREM', KEYS[b + 2], rid)
  if h[4] ~= '' then
    local left = redis.call('DECRBY', KEYS[b + 3], qty)
    if left <= 0 then redis.call('DEL', KEYS[b + 3]) end
  end
  redis.call('XADD', KEYS[3], '*', 'kind', reason, 'sku', sku,
    'qty', text(qty), 'rid', rid, 'available', text(available), 'reserved', text(reserved),
    'sold_pending', text(pending), 'owed', text(owed), 'ts', text(now))
end
redis.call('ZREM', KEYS[2], rid)
if undo then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'state', reason, 'ended', text(now))
  if kfield then redis.call('HSET', KEYS[1], kfield, kfp) end
  redis.call('PEXPIRE', KEYS[1], text(tomb))
end
return {'released', reason, parked}
