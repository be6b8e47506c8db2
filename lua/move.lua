-- move.lua: move units of a split SKU from one of its parts to another. The
-- parts sit in different slots (on a cluster, on different masters), so a move
-- is three steps, each atomic on its own part and each safe to repeat:
--   'out'   on the source: take up to `qty` of its available units (never more
--           than it has) into `moving`, and record the transfer
--   'in'    on the target: add the units to `available`, once per transfer id
--           (paying the part's `owed` first; the rest of a debt's transfer
--           parked while another part may owe, as release.lua's units are)
--   'done'  on the source: forget the transfer; `moving` falls
--   'back'  on the source, when the target could not take them (its counter is
--           missing): the units return to the source as units arriving do
--   'aim'   on a part with `parked` units (units that came back while another
--           part may owe; release.lua): up to `qty` of them become a transfer
--           to the target (then 'in' and 'done' as for 'out'); aimed at the
--           part itself, they pay its own debt
--   'unpark' on a part with `parked` units, when no part owes: up to `qty` of
--           them go on sale (paying the part's own debt first)
--   'owe_out' on a part taking on up to `qty` units of the target's debt
--           (no more than its holds not already owed): it owes them, and as
--           many units set out for the target (recorded as 'out'
--           does), which pay the target's debt when they arrive ('in'); a
--           debt handed on this way is never counted twice, however many
--           hand it at once
-- Between 'out' and 'done' the units are in `moving`: neither available nor
-- held, counted in the SKU's figures as on their way (see docs/stock-rules.md,
-- "Split SKUs"). A transfer left half done (a crash) is finished by
-- `Engine::finish_moves`, which repeats 'in' (guarded) and 'done'.
--
-- KEYS[1] the part's counters hash     hf:{hfN.j}:sku:<part>
-- KEYS[2] out, aim, owe_out, done, back: the source's transfers hash   hf:{hfN.j}:moves:<part>
--         (unpark: any key of the part's slot; it is not touched)
--         in: the transfer's guard on the target         hf:{hfN.j}:moved:<part>:<tid>
-- KEYS[3] the part's shard event stream
--
-- ARGV[1] mode   ARGV[2] transfer id   ARGV[3] qty (out: most to take; in: units)
-- ARGV[4] this part's name (the event's sku)
-- ARGV[5] out, aim, owe_out: the target part's name; in: the guard's lifetime, ms
-- ARGV[6] out: 'force' lets the change of a SKU's parts move units out of a
--         part marked as changing (`parts` 0); nothing else may. in, back:
--         'park' for a debt's transfer (see arrive below)
-- ARGV[7] out with 'force': the change's fencing token; refused with
--         {'fenced', seen} when the part has seen a newer change's (as
--         split.lua's steps are)
--
-- Returns: out {'out', taken} (0 when it has none; {'not_warmed'} without a counter);
-- aim {'aimed', taken}; unpark {'unparked', taken}; owe_out {'owing', taken};
-- in {'in', available} | {'already'} | {'not_warmed'};
-- done and back {'done', qty} | {'none'} (no such transfer: finished before).
local mode, tid, qty, name = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if redis.call('EXISTS', KEYS[1]) == 0 then
  if mode ~= 'done' and mode ~= 'back' then return {'not_warmed'} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function event(change)
  local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'moving')
  redis.call('XADD', KEYS[3], '*', 'kind', 'moved', 'sku', name, 'qty', change, 'rid', tid,
    'available', c[1] or '', 'reserved', c[2] or '', 'sold_pending', c[3] or '',
    'moving', c[4] or '0', 'ts', now)
end

-- Units arriving on this part (a transfer's 'in', or its 'back'): they pay
-- the part's debt first, as units coming back do; the rest of a debt's
-- transfer (ARGV[6] 'park') is parked while another part may owe
-- (`hold_back`, as in release.lua), any other transfer's goes on sale (units
-- a gathering or rebalancing moves were on sale where they came from). The
-- part's `available` after.
local function arrive(n)
  local c = redis.call('HMGET', KEYS[1], 'owed', 'hold_back')
  local paid = math.min(tonumber(c[1] or '0'), n)
  if paid > 0 then redis.call('HINCRBY', KEYS[1], 'owed', -paid) end
  local rest = n - paid
  if c[2] and rest > 0 and ARGV[6] == 'park' then
    redis.call('HINCRBY', KEYS[1], 'moving', rest)
    redis.call('HINCRBY', KEYS[1], 'parked', rest)
    rest = 0
  end
  redis.call('HINCRBY', KEYS[1], 'gen', 1)
  return redis.call('HINCRBY', KEYS[1], 'available', rest)
end

if mode == 'out' then
  if not qty or qty < 1 then return {'out', 0} end
  local c = redis.call('HMGET', KEYS[1], 'available', 'parts')
  if ARGV[6] == 'force' then
    local fence = tonumber(ARGV[7] or '0') or 0
    local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') or 0
    if seen > fence then return {'fenced', seen} end
    if seen < fence then redis.call('HSET', KEYS[1], 'fence', fence) end
  elseif c[2] == '0' then
    return {'out', 0}
  end
  local available = tonumber(c[1] or '0')
  local taken = math.min(available, qty)
  if taken < 1 then return {'out', 0} end
  redis.call('HINCRBY', KEYS[1], 'available', -taken)
  redis.call('HINCRBY', KEYS[1], 'moving', taken)
  redis.call('HSET', KEYS[2], tid, taken .. '|' .. ARGV[5] .. '|' .. now)
  event(-taken)
  return {'out', taken}
elseif mode == 'in' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return {'already'} end
  -- Units arriving pay the part's debt first, as units coming back do, and
  -- the rest of a debt's transfer is parked while another part may owe.
  local available = arrive(qty)
  -- Transfers received: with `moving` and the part's units, what a reading of
  -- every part at one moment compares (split.rs, PartFull::mark).
  redis.call('HINCRBY', KEYS[1], 'ins', 1)
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
  event(qty)
  return {'in', available}
elseif mode == 'aim' then
  local c = redis.call('HMGET', KEYS[1], 'parked', 'owed')
  local parked, owed = tonumber(c[1] or '0'), tonumber(c[2] or '0')
  if ARGV[5] == name then
    -- Parked units pay this part's own debt (handed to it since they parked).
    local paid = math.min(parked, owed, qty or 0)
    if paid < 1 then return {'aimed', 0} end
    redis.call('HINCRBY', KEYS[1], 'owed', -paid)
    redis.call('HINCRBY', KEYS[1], 'parked', -paid)
    redis.call('HINCRBY', KEYS[1], 'moving', -paid)
    event(0)
    return {'aimed', paid}
  end
  local taken = math.min(parked, qty or 0)
  if taken < 1 then return {'aimed', 0} end
  -- Still in `moving`: now a transfer like any other, finished the same way.
  redis.call('HINCRBY', KEYS[1], 'parked', -taken)
  redis.call('HSET', KEYS[2], tid, taken .. '|' .. ARGV[5] .. '|' .. now)
  return {'aimed', taken}
elseif mode == 'unpark' then
  local c = redis.call('HMGET', KEYS[1], 'parked', 'owed')
  local taken = math.min(tonumber(c[1] or '0'), qty or 0)
  if taken < 1 then return {'unparked', 0} end
  local paid = math.min(tonumber(c[2] or '0'), taken)
  if paid > 0 then redis.call('HINCRBY', KEYS[1], 'owed', -paid) end
  redis.call('HINCRBY', KEYS[1], 'parked', -taken)
  redis.call('HINCRBY', KEYS[1], 'moving', -taken)
  redis.call('HINCRBY', KEYS[1], 'available', taken - paid)
  redis.call('HINCRBY', KEYS[1], 'gen', 1)
  event(taken - paid)
  return {'unparked', taken}
elseif mode == 'owe_out' then
  -- This part takes on `qty` units of the debt of part ARGV[5]: it owes
  -- them, and the same number of units set out to that part, where they pay
  -- its debt on arrival ('in'). Whatever the other part owes by then, no
  -- unit of debt is counted twice or lost (what it no longer owes arrives as
  -- units, parked or on sale there). Its own units on sale, then parked,
  -- pay the debt at once, as units arriving would.
  -- Never beyond what its own holds can pay back (`reserved - owed`, now):
  -- a debt beyond a part's holds is an oversell nobody's payment reports.
  local r = redis.call('HMGET', KEYS[1], 'reserved', 'owed')
  qty = math.min(qty or 0, tonumber(r[1] or '0') - tonumber(r[2] or '0'))
  if qty < 1 then return {'owing', 0} end
  redis.call('HINCRBY', KEYS[1], 'owed', qty)
  redis.call('HINCRBY', KEYS[1], 'moving', qty)
  redis.call('HSET', KEYS[2], tid, qty .. '|' .. ARGV[5] .. '|' .. now)
  local c = redis.call('HMGET', KEYS[1], 'available', 'parked', 'owed')
  local owed = tonumber(c[3])
  local from_available = math.min(tonumber(c[1] or '0'), owed)
  if from_available > 0 then
    redis.call('HINCRBY', KEYS[1], 'available', -from_available)
    owed = owed - from_available
  end
  local from_parked = math.min(tonumber(c[2] or '0'), owed)
  if from_parked > 0 then
    redis.call('HINCRBY', KEYS[1], 'parked', -from_parked)
    redis.call('HINCRBY', KEYS[1], 'moving', -from_parked)
  end
  if from_available + from_parked > 0 then
    redis.call('HINCRBY', KEYS[1], 'owed', -(from_available + from_parked))
  end
  event(-from_available)
  return {'owing', qty}
else
  local record = redis.call('HGET', KEYS[2], tid)
  if not record then return {'none'} end
  local m = tonumber(string.match(record, '^(%d+)|'))
  redis.call('HDEL', KEYS[2], tid)
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'moving', -m)
    if mode == 'back' then
      arrive(m)
      event(m)
    else
      -- Nothing on sale changed, but `moving` fell: the figures say so.
      event(0)
    end
  end
  return {'done', m}
end
