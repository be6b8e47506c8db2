-- settle.lua: after PostgreSQL committed sales, take each out of sold_pending, once,
-- and count it in `settled` (compared with PostgreSQL's skus.sold_recorded by
-- reconciliation, so a sale between commit and settle is never taken for drift).
-- Many lines of one shard per call (the write-behind sends a batch's lines in
-- chunks): one call instead of one per sale, and one `settled` event per SKU
-- instead of one per sale, which the write-behind and the live views read back.
--
-- KEYS[1]                 shard event stream   hf:{hfN.j}:events
-- KEYS[2i], KEYS[2i+1]    line i's hold hash   hf:{hfN.j}:hold:<rid> (remembers which lines are settled)
--                         and its SKU's counters hash hf:{hfN.j}:sku:<sku>
-- ARGV[4i-3 .. 4i]        line i's reservation id, sku, qty, and the epoch of the
--                         counter the sale moved (its event's; '' for none)
--
-- Returns one tag per line: 'settled', 'already' (settled before: nothing moves),
-- 'rebuilt' (the counter was built again after the sale, from PostgreSQL or by
-- late.lua: it already counts the sale as recorded and never had it pending, so
-- only the hold is marked), or 'no_hold' (the hold's record has lapsed;
-- reconciliation will see the difference as stranded units and never oversell).
-- Each SKU whose sold_pending fell gets one `settled` event after its last line:
-- qty the units settled in this call, the figures as they then are, and the
-- reservation id when it was one line.
-- Numbers go to Redis as text made here with the integer format (see reserve.lua).
local function int(x) return string.format('%d', x) end
local lines = #ARGV / 4
local tags, fell, order = {}, {}, {}
for i = 1, lines do
  local hold, counter = KEYS[2 * i], KEYS[2 * i + 1]
  local rid, sku = ARGV[4 * i - 3], ARGV[4 * i - 2]
  local qty, epoch = tonumber(ARGV[4 * i - 1]), ARGV[4 * i]
  local tag = 'settled'
  if redis.call('EXISTS', hold) == 0 then
    tag = 'no_hold'
  elseif redis.call('HSETNX', hold, 'settled:' .. sku, '1') == 0 then
    tag = 'already'
  elseif redis.call('EXISTS', counter) == 0 then
    tag = 'settled'
  elseif (redis.call('HGET', counter, 'epoch') or '') ~= epoch then
    tag = 'rebuilt'
  else
    redis.call('HINCRBY', counter, 'settled', int(qty))
    if redis.call('HINCRBY', counter, 'sold_pending', int(-qty)) < 0 then
      redis.call('HSET', counter, 'sold_pending', '0')
    end
    local f = fell[counter]
    if f then
      f.qty, f.rid = f.qty + qty, ''
    else
      fell[counter] = {sku = sku, qty = qty, rid = rid}
      order[#order + 1] = counter
    end
  end
  tags[i] = tag
end
if #order > 0 then
  local t = redis.call('TIME')
  local now = int(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  for _, counter in ipairs(order) do
    local f = fell[counter]
    local c = redis.call('HMGET', counter, 'available', 'reserved', 'sold_pending')
    redis.call('XADD', KEYS[1], '*', 'kind', 'settled', 'sku', f.sku,
      'qty', int(f.qty), 'rid', f.rid, 'available', c[1], 'reserved', c[2], 'sold_pending', c[3], 'ts', now)
  end
end
return tags
