-- confirm.lua: turn a live hold into a sale: reserved -> sold_pending.
-- A hold whose deadline has passed is expired here and now (its units return) and
-- the answer is 'expired': a late payment moves no stock and must be remediated.
--
-- A cart whose lines fall in several shards is confirmed in two phases, so that it
-- is sold whole or not at all (docs/stock-rules.md, "Carts across shards"): every
-- part is prepared ('held' -> 'confirming', refused once overdue), then committed,
-- the home part first; a failed prepare rolls the prepared parts back. The reaper
-- and release leave a 'confirming' part alone.
--
-- KEYS[1]  hold hash            hf:{hfN.j}:hold:<rid>
-- KEYS[2]  shard due zset       hf:{hfN.j}:due
-- KEYS[3]  shard event stream   hf:{hfN.j}:events
-- then, for line i = 1..n (the hold's lines, in its order), at b = 3 + 3 * (i - 1):
-- KEYS[b+1] SKU counters hash, KEYS[b+2] SKU holds zset, KEYS[b+3] buyer counter
--
-- ARGV[1] reservation id   ARGV[2] tombstone ttl ms
-- ARGV[3] mode: 'direct' (a one-shard hold) | 'direct_judged' | 'prepare' |
--          'commit' | 'rollback'. In 'direct' mode a line on a part of a split
--          SKU (`parts` above 1) whose debt the payment would leave beyond the
--          part's own holds answers {'indebted'} and changes nothing: the
--          engine first hands the excess to parts whose holds can still pay
--          it (split.rs, before_paying), then confirms with 'direct_judged',
--          which reports what is still unbacked as oversold. So an oversell
--          is judged for the whole SKU, in one call when there is no debt.
-- ARGV[4..] sku of each line, in KEYS order (checked against the hold), then
--          optionally 'key:<field> <fingerprint>': the Idempotency-Key this
--          payment was sent with (its hash field, `k:<token>:<key>`) and the
--          fingerprint of the request; the hold keeps it, so the same key
--          with another request on this hold (its release) is refused
--          ({'key_reused'}, nothing moves) and the same request again is
--          answered as the first was (a repeat confirms nothing twice); the
--          record then lasts at least ARGV[2] from the key's last use; then
--          optionally 'fp:' and the fingerprint of the request that made the
--          hold: a caller that knows the hold from memory (not from reading it)
--          names it, so a hold made since under the id by another request is
--          never touched
--
-- A SKU whose `owed` exceeds its other open holds has fewer real units than this
-- hold: confirming sells units a feed removed. The sale stands (the shopper
-- paid) and the units sold that do not exist are reported as `oversold`, in the
-- reply and on the event, for a remediation.
--
-- Returns one of:
--   {'confirmed', sku1, oversold1, ...}  units moved from reserved to sold_pending;
--                               each line whose sale oversold, with how many units
--   {'already_confirmed'}       a repeat: nothing moves
--   {'prepared'}                (prepare) the part now waits in 'confirming'
--   {'prepared_before'}         (prepare) it already did (another confirmer's, or
--                               this one's earlier attempt): not this call's to undo
--   {'rolled_back'}             (rollback) the part is 'held' again
--   {'not_confirming', state}   (rollback) it was not 'confirming': nothing moves
--   {'expired', state[, parked]} the hold had ended ('released' / 'expired') or is
--                               overdue (its units came back: `parked` of them
--                               parked, as release.lua's are)
--   {'indebted'}                (direct) see ARGV[3]: nothing moved
--   {'unknown'}                 no such hold
--   {'mismatch'}                the keys given do not match the hold's lines
--   {'key_reused'}              the Idempotency-Key was kept for another request
-- Numbers go to Redis as text made here with the integer format: Redis would
-- otherwise format each with the floating-point one ('%.17g'), a tenth of a
-- script's time (see reserve.lua).
local function text(x)
  if type(x) == 'number' then return string.format('%d', x) end
  return x
end
local rid, tomb, mode = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local judged = mode ~= 'direct'
if mode == 'direct_judged' then mode = 'direct' end
local h = redis.call('HMGET', KEYS[1], 'state', 'deadline', 'lines', 'buyer', 'fp')
-- A refused request's record (reserve.lua) is no hold.
if not h[1] or h[1] == 'refused' then return {'unknown'} end
-- A caller that knew the hold from memory named the request that made it
-- ('fp:<fingerprint>' last; no SKU has a ':'): any other hold under the id is
-- a mismatch, whatever its state.
local last = #ARGV
local named = string.sub(ARGV[last], 1, 3) == 'fp:'
if named then
  if string.sub(ARGV[last], 4) ~= h[5] then return {'mismatch'} end
  last = last - 1
end
-- The payment's Idempotency-Key, kept in the hold: another request under it
-- is refused before anything moves; kept by every answer that ends here.
local kfield, kfp = string.match(ARGV[last], '^key:(%S+) (%S+)$')
if kfield then
  last = last - 1
  local prior = redis.call('HGET', KEYS[1], kfield)
  if prior and prior ~= kfp then return {'key_reused'} end
end
-- The record lasts at least a tombstone's lifetime from the key's last use
-- (a key sent long after the hold ended must not lapse with it sooner).
local function kept(reply)
  if kfield then
    redis.call('HSET', KEYS[1], kfield, kfp)
    local left = redis.call('PTTL', KEYS[1])
    if left >= 0 and left < tomb then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  end
  return reply
end
local skus = last - 3
if h[1] == 'confirmed' then return kept({'already_confirmed'}) end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = text(now)
local overdue = tonumber(h[2]) <= now

if mode == 'prepare' then
  if h[1] == 'confirming' then return {'prepared_before'} end
  if h[1] ~= 'held' then return {'expired', h[1]} end
  -- Overdue: the cart expires whole (the engine ends every part together).
  if overdue then return {'expired', 'expired'} end
  redis.call('HSET', KEYS[1], 'state', 'confirming', 'preparing', now_s)
  return {'prepared'}
end
if mode == 'rollback' then
  if h[1] ~= 'confirming' then return {'not_confirming', h[1]} end
  redis.call('HSET', KEYS[1], 'state', 'held')
  redis.call('HDEL', KEYS[1], 'preparing')
  return {'rolled_back'}
end
if mode == 'commit' then
  -- Only a prepared part is committed, whatever the time: the cart was decided.
  if h[1] ~= 'confirming' then return {'expired', h[1]} end
  overdue = false
else
  if h[1] ~= 'held' then return kept({'expired', h[1]}) end
end
local kind = overdue and 'expired' or 'confirmed'

local i = 0
local parsed = {}
for sku, qty in string.gmatch(h[3], '([^,=]+)=(%d+)') do
  i = i + 1
  if ARGV[3 + i] ~= sku then return {'mismatch'} end
  parsed[i] = {sku, tonumber(qty)}
end
if skus ~= i then return {'mismatch'} end
if not judged and not overdue then
  for j = 1, i do
    local c = redis.call('HMGET', KEYS[3 + 3 * (j - 1) + 1], 'parts', 'owed', 'reserved')
    local owed, reserved, qty = tonumber(c[2] or '0'), tonumber(c[3] or '0'), parsed[j][2]
    if tonumber(c[1] or '1') > 1 and owed > 0 and reserved >= qty and owed > reserved - qty then
      return {'indebted'}
    end
  end
end
local reply = {'confirmed'}
local parked = 0

for j = 1, i do
  local b, sku, qty = 3 + 3 * (j - 1), parsed[j][1], parsed[j][2]
  local available, reserved, pending, owed, oversold, epoch = '', '', '', '', 0, ''
  if redis.call('EXISTS', KEYS[b + 1]) == 1 then
    local o = redis.call('HMGET', KEYS[b + 1], 'owed', 'epoch', 'hold_back')
    owed, epoch = tonumber(o[1] or '0'), o[2] or ''
    if overdue then
      local paid = math.min(owed, qty)
      if paid > 0 then owed = redis.call('HINCRBY', KEYS[b + 1], 'owed', -paid) end
      -- Parked while another part of a split SKU may owe (as in release.lua).
      local rest = qty - paid
      if o[3] and rest > 0 then
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
    else
      local before = tonumber(redis.call('HGET', KEYS[b + 1], 'reserved') or '0')
      reserved = redis.call('HINCRBY', KEYS[b + 1], 'reserved', -qty)
      -- Units owed beyond the other open holds cannot be backed by anything.
      oversold = math.max(0, owed - reserved) - math.max(0, owed - before)
      pending = redis.call('HINCRBY', KEYS[b + 1], 'sold_pending', qty)
      redis.call('HINCRBY', KEYS[b + 1], 'sold', qty)
      available = redis.call('HGET', KEYS[b + 1], 'available')
      if oversold > 0 then
        reply[#reply + 1] = sku
        reply[#reply + 1] = oversold
      end
    end
  end
  redis.call('ZREM', KEYS[b + 2], rid)
  if overdue and h[4] ~= '' then
    local left = redis.call('DECRBY', KEYS[b + 3], qty)
    if left <= 0 then redis.call('DEL', KEYS[b + 3]) end
  end
  redis.call('XADD', KEYS[3], '*', 'kind', kind, 'sku', sku,
    'qty', text(qty), 'rid', rid, 'available', text(available), 'reserved', text(reserved),
    'sold_pending', text(pending), 'owed', text(owed), 'oversold', text(oversold),
    'epoch', epoch, 'ts', now_s)
end
redis.call('ZREM', KEYS[2], rid)
redis.call('HSET', KEYS[1], 'state', kind, 'ended', now_s)
redis.call('PEXPIRE', KEYS[1], text(tomb))
if overdue then return kept({'expired', 'expired', parked}) end
return kept(reply)
