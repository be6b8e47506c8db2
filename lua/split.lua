-- split.lua: the steps of changing how many parts a SKU's stock is split into
-- (Engine::set_parts, split.rs), each on one part's counter.
--
-- KEYS[1] the part's counters hash   hf:{hfN.j}:sku:<part>
-- KEYS[2] buyer_in, buyer_out: a buyer's counter on this part
--         hf:{hfN.j}:buyer:<part>:<buyer>
-- ARGV[1] mode
-- ARGV[2] fence: the fencing token of the lease of the change this step
--         belongs to (0: not a change's step). The part keeps the largest it
--         has seen (field `fence`) and refuses a step carrying a smaller one
--         with {'fenced', seen}: a change whose process stalled past its lease
--         cannot act on parts a newer change (which took the lease, and a
--         larger token, after it lapsed) has touched.
-- The mode's own arguments follow from ARGV[3]:
--   'mark' ARGV[3] parts: the counter now belongs to a split into `parts` (1:
--          not split); reserve.lua refuses any line naming another split, so
--          from here on no hold is made under the old count.
--          Returns {'marked', reserved, sold_pending, moving, available}, or
--          {'not_warmed'} when the counter is missing.
--   'make' ARGV[3] parts, ARGV[4] limit, ARGV[5] opens, ARGV[6] closes: a new
--          part with nothing in it (stock arrives by move.lua), unless one is
--          there. A part lost with its shard's data is made again with its
--          share: ARGV[7] available, ARGV[8] owed, ARGV[9] reserved (units in
--          its holds that survived), ARGV[10] settled (all 0 when absent).
--          Returns {'made'} or {'exists'}.
--   'owe'  ARGV[3] a signed change of the part's `owed` (never below 0); a
--          debt taken on is paid first with the part's available units (units
--          on sale pay a part's debt, as units arriving or coming back do).
--          Returns {'owed', owed} or {'not_warmed'}.
--   'hold_back' ARGV[3] token: units coming back to this part or arriving at
--          it are parked while another part may owe (release.lua); the
--          part keeps the larger token. {'held_back'} or {'not_warmed'}.
--   'let_go' ARGV[3] token: the mark cleared if it is still that token.
--          {'let_go'} or {'kept'}.
--   'drop' an old part, only if it is empty: no stock, no holds, nothing sold
--          pending, nothing moving, no debt (the engine hands a debt to part 0
--          first). Returns {'dropped', sold, settled} (what the part sold and
--          settled, which the engine adds to part 0's counts), {'gone'} or
--          {'busy', available, reserved, sold_pending, moving, owed}.
--   'buyer_in'  ARGV[3] units, ARGV[4] ms left (0: none): a buyer's count
--          moving to this part (KEYS[2]) from another, added before the other
--          forgets it (a step cut short between counts it twice: the buyer may
--          buy less, never more). {'moved'}, or {'gone'} when the part has no
--          counter (a newer change dropped it).
--   'buyer_out' the buyer's count on this part (KEYS[2]) forgotten, once its
--          new part has it. {'moved'} or {'gone'}.
local mode = ARGV[1]
local fence = tonumber(ARGV[2]) or 0
local exists = redis.call('EXISTS', KEYS[1]) == 1
if fence > 0 and exists then
  local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') or 0
  if seen > fence then return {'fenced', seen} end
  if seen < fence then redis.call('HSET', KEYS[1], 'fence', fence) end
end
if mode == 'mark' then
  if not exists then return {'not_warmed'} end
  redis.call('HSET', KEYS[1], 'parts', ARGV[3])
  local c = redis.call('HMGET', KEYS[1], 'reserved', 'sold_pending', 'moving', 'available')
  return {'marked', tonumber(c[1] or '0'), tonumber(c[2] or '0'), tonumber(c[3] or '0'),
    tonumber(c[4] or '0')}
elseif mode == 'make' then
  if exists then return {'exists'} end
  local t = redis.call('TIME')
  local n = function(i) return tonumber(ARGV[i] or '0') or 0 end
  redis.call('HSET', KEYS[1], 'available', math.max(n(7), 0), 'reserved', math.max(n(9), 0),
    'sold_pending', 0, 'sold', 0, 'settled', n(10), 'owed', math.max(n(8), 0), 'moving', 0,
    'gen', 0, 'parts', ARGV[3], 'limit', ARGV[4],
    'opens', ARGV[5], 'closes', ARGV[6], 'epoch', t[1] .. '.' .. t[2], 'fence', fence)
  return {'made'}
elseif mode == 'owe' then
  -- ARGV[3] units (signed) this part owes more: a feed's debt handed from part
  -- 0 to the parts whose holds will pay it back when they end.
  if not exists then return {'not_warmed'} end
  local change = tonumber(ARGV[3])
  if change > 0 then
    local c = redis.call('HMGET', KEYS[1], 'available', 'parked')
    local paid = math.min(math.max(tonumber(c[1] or '0'), 0), change)
    if paid > 0 then
      redis.call('HINCRBY', KEYS[1], 'available', -paid)
      change = change - paid
    end
    -- Units parked here (release.lua) pay it too: they wait for a debt.
    local parked = math.min(math.max(tonumber(c[2] or '0'), 0), change)
    if parked > 0 then
      redis.call('HINCRBY', KEYS[1], 'parked', -parked)
      redis.call('HINCRBY', KEYS[1], 'moving', -parked)
      change = change - parked
    end
  end
  local owed = redis.call('HINCRBY', KEYS[1], 'owed', change)
  if owed < 0 then
    redis.call('HSET', KEYS[1], 'owed', 0)
    owed = 0
  end
  return {'owed', owed}
elseif mode == 'drop' then
  if not exists then return {'gone'} end
  local c = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold_pending', 'moving',
    'sold', 'settled', 'owed')
  local a, r, p, m = tonumber(c[1] or '0'), tonumber(c[2] or '0'), tonumber(c[3] or '0'),
    tonumber(c[4] or '0')
  local o = tonumber(c[7] or '0')
  if a ~= 0 or r ~= 0 or p ~= 0 or m ~= 0 or o ~= 0 then return {'busy', a, r, p, m, o} end
  redis.call('DEL', KEYS[1])
  return {'dropped', tonumber(c[5] or '0'), tonumber(c[6] or '0')}
elseif mode == 'hold_back' then
  -- ARGV[3] a token (a deadline, ms): another part of the SKU may owe, so
  -- units coming back or arriving here are parked, not put on sale
  -- (release.lua). Kept as the larger of two tokens.
  if not exists then return {'not_warmed'} end
  local seen = tonumber(redis.call('HGET', KEYS[1], 'hold_back') or '0') or 0
  if tonumber(ARGV[3]) > seen then redis.call('HSET', KEYS[1], 'hold_back', ARGV[3]) end
  return {'held_back'}
elseif mode == 'let_go' then
  -- ARGV[3] the token read when no part owed: cleared only if it is still
  -- that one (a feed that marked the part since keeps its mark).
  if redis.call('HGET', KEYS[1], 'hold_back') == ARGV[3] then
    redis.call('HDEL', KEYS[1], 'hold_back')
    return {'let_go'}
  end
  return {'kept'}
elseif mode == 'buyer_in' then
  if not exists then return {'gone'} end
  redis.call('INCRBY', KEYS[2], ARGV[3])
  local ttl = tonumber(ARGV[4]) or 0
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
  return {'moved'}
elseif mode == 'buyer_out' then
  if not exists then return {'gone'} end
  redis.call('DEL', KEYS[2])
  return {'moved'}
end
return redis.error_reply('ERR split.lua: mode must be mark, make, owe, hold_back, let_go, drop, buyer_in or buyer_out')
