-- move.lua: move units of a split SKU from one of its parts to another. The
-- parts sit in different slots (on a cluster, on different masters), so a move
-- is three steps, each atomic on its own part and each safe to repeat:
--   'out'   on the source: take up to `qty` of its available units (never more
--           than it has) into `moving`, and record the transfer
--   'in'    on the target: add the units to `available`, once per transfer id
--           (paying the part's `owed` first)
--   'done'  on the source: forget the transfer; `moving` falls
--   'back'  on the source, when the target could not take them (its counter is
--           missing): the units return to the source's `available`
-- Between 'out' and 'done' the units are in `moving`: neither available nor
-- held, counted in the SKU's figures as on their way (see docs/stock-rules.md,
-- "Split SKUs"). A transfer left half done (a crash) is finished by
-- `Engine::finish_moves`, which repeats 'in' (guarded) and 'done'.
--
-- KEYS[1] the part's counters hash     hf:{hfN.j}:sku:<part>
-- KEYS[2] out, done, back: the source's transfers hash   hf:{hfN.j}:moves:<part>
--         in: the transfer's guard on the target         hf:{hfN.j}:moved:<part>:<tid>
-- KEYS[3] the part's shard event stream
--
-- ARGV[1] mode   ARGV[2] transfer id   ARGV[3] qty (out: most to take; in: units)
-- ARGV[4] this part's name (the event's sku)
-- ARGV[5] out: the target part's name; in: the guard's lifetime, ms
-- ARGV[6] out: 'force' lets the change of a SKU's parts move units out of a
--         part marked as changing (`parts` 0); nothing else may
-- ARGV[7] out with 'force': the change's fencing token; refused with
--         {'fenced', seen} when the part has seen a newer change's (as
--         split.lua's steps are)
--
-- Returns: out {'out', taken} (0 when it has none; {'not_warmed'} without a counter);
-- in {'in', available} | {'already'} | {'not_warmed'};
-- done and back {'done', qty} | {'none'} (no such transfer: finished before).
local mode, tid, qty, name = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if redis.call('EXISTS', KEYS[1]) == 0 then
  if mode == 'out' or mode == 'in' then return {'not_warmed'} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function event(change)
  local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'moving')
  redis.call('XADD', KEYS[3], '*', 'kind', 'moved', 'sku', name, 'qty', change, 'rid', tid,
    'available', c[1] or '', 'reserved', c[2] or '', 'sold_pending', c[3] or '',
    'moving', c[4] or '0', 'ts', now)
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
  -- Units arriving pay the part's debt first, as units coming back do.
  local owed = tonumber(redis.call('HGET', KEYS[1], 'owed') or '0')
  local paid = math.min(owed, qty)
  if paid > 0 then redis.call('HINCRBY', KEYS[1], 'owed', -paid) end
  local available = redis.call('HINCRBY', KEYS[1], 'available', qty - paid)
  redis.call('HINCRBY', KEYS[1], 'gen', 1)
  -- Transfers received: with `moving` and the part's units, what a reading of
  -- every part at one moment compares (split.rs, PartFull::mark).
  redis.call('HINCRBY', KEYS[1], 'ins', 1)
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
  event(qty)
  return {'in', available}
else
  local record = redis.call('HGET', KEYS[2], tid)
  if not record then return {'none'} end
  local m = tonumber(string.match(record, '^(%d+)|'))
  redis.call('HDEL', KEYS[2], tid)
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'moving', -m)
    if mode == 'back' then
      redis.call('HINCRBY', KEYS[1], 'available', m)
      redis.call('HINCRBY', KEYS[1], 'gen', 1)
      event(m)
    else
      -- Nothing on sale changed, but `moving` fell: the figures say so.
      event(0)
    end
  end
  return {'done', m}
end
