-- reserve.lua: hold units of one SKU, or of every line of a cart, all or nothing.
--
-- All keys share the hash tag of one shard, so the script is valid on Redis Cluster.
-- KEYS[1]  hold hash            hf:{hfN.j}:hold:<rid>
-- KEYS[2]  shard due zset       hf:{hfN.j}:due            member rid, score deadline (ms)
-- KEYS[3]  shard event stream   hf:{hfN.j}:events
-- then, for line i = 1..n, at b = 3 + 3 * (i - 1):
-- KEYS[b+1] SKU counters hash   hf:{hfN.j}:sku:<sku>      available, reserved, sold_pending, sold, limit,
--                               opens, closes (the drop's schedule, Unix ms; 0 or absent: none)
-- KEYS[b+2] SKU holds zset      hf:{hfN.j}:holds:<sku>    member rid, score deadline (ms)
-- KEYS[b+3] buyer counter       hf:{hfN.j}:buyer:<sku>:<buyer>  (untouched when buyer is '')
--
-- ARGV[1] reservation id   ARGV[2] ttl ms        ARGV[3] buyer ('' for none)
-- ARGV[4] fingerprint of the request (same id + same request = a retry)
-- ARGV[5] buyer counter ttl ms
-- ARGV[6] deadline, Unix ms: 0 for now + ttl; a cart's later parts pass the first
--         part's deadline so every part of a cart ends at the same moment
-- ARGV[7] the cart's parts: '' for a hold in one shard; otherwise the shards of
--         every part, comma-separated, the first being the home part (see
--         docs/stock-rules.md, "Carts across shards")
-- ARGV[8] how long a refusal is remembered, ms (the tombstone lifetime)
-- ARGV[9..] sku, qty pairs, one per line, in KEYS order
--
-- The hold hash is also the request's idempotency record, so a checkout call is
-- one round trip: a retry (same id, same fingerprint) gets the first answer back,
-- whether it held units (the deadline and each line's `available` right after
-- are kept in the hold) or was refused for stock or the buyer's limit (kept as a
-- 'refused' record for ARGV[8] ms, which no other script treats as a hold).
-- Answers that depend on the moment or on warm-up (not_started, ended,
-- not_warmed) and invalid numbers are not kept: a retry asks again.
--
-- Every number is checked here too, before anything is written: a caller that
-- skipped validation cannot raise `available` with a qty of 0 or less, nor write
-- half a cart.
--
-- Returns one of:
--   {'reserved', deadline_ms, available_after_1, ..., available_after_n}
--   {'retry', state, deadline_ms, after, lines}  same id, same request: nothing
--                                     moves; `after` is the first answer's available
--                                     counts, comma-separated, in the order of the
--                                     hold's `lines` (sku=qty,...)
--   {'replayed', refusal...}          same id, same request, refused before: that
--                                     refusal again (e.g. {'replayed', 'sold_out', sku, 3})
--   {'conflict'}                      same id, different request: nothing moves
--   {'not_warmed', sku}               a counter is missing (never "sold out")
--   {'sold_out', sku, available}      (kept for a retry, as are the next two)
--   {'limit', sku, limit, already}    the per-buyer limit would be exceeded
--   {'buyer_required', sku, limit}    the SKU has a per-buyer limit and no buyer was named
--   {'not_started', sku, opens_ms}    Redis' clock is before the drop's start
--   {'ended', sku, closes_ms}         Redis' clock is at or after the drop's end
--   {'invalid', field, message}       a number is not a whole number in range
--   {'split', sku, parts}             the line names another split of the SKU than
--                                     its counter's (`parts`, 1: not split): nothing moves
--   {'changing', sku}                 the SKU's parts are being changed: nothing moves
--   {'short', sku, available}         a part of a split SKU has too few units: nothing
--                                     moves or is remembered (the engine gathers, see split.rs)
--   {'lapsed', deadline_ms}           ARGV[6] is a deadline already past: nothing moves
--                                     or is remembered
local function whole(v)
  local x = tonumber(v)
  if x and x == math.floor(x) and x >= 1 and x < 1e15 then return x end
  return nil
end
-- Numbers go to Redis as strings made here, each once, with the integer
-- format: Redis and Lua would otherwise turn every number into text with the
-- floating-point one ('%.17g'), about a tenth of this script's time.
local function int(x) return string.format('%d', x) end
local rid, ttl, buyer, fp = ARGV[1], whole(ARGV[2]), ARGV[3], ARGV[4]
local buyer_ttl = whole(ARGV[5])
if not ttl then return {'invalid', 'ttl_ms', 'the hold time must be a whole number of milliseconds, at least 1'} end
if not buyer_ttl then return {'invalid', 'ttl_ms', 'the buyer counter lifetime must be a whole number of milliseconds'} end
local fixed_deadline, parts = tonumber(ARGV[6]) or 0, ARGV[7] or ''
local remember = whole(ARGV[8])
if not remember then return {'invalid', 'ttl_ms', 'the refusal lifetime must be a whole number of milliseconds'} end
if (#ARGV - 8) % 2 ~= 0 or #ARGV < 10 or #KEYS ~= 3 + 3 * (#ARGV - 8) / 2 then
  return {'invalid', 'lines', 'every line needs a sku and a qty, with its keys'}
end
local n = (#ARGV - 8) / 2
local seen, seen_counter = {}, {}
for i = 1, n do
  if not whole(ARGV[8 + 2 * i]) then
    return {'invalid', 'qty', ARGV[7 + 2 * i] .. ': qty must be a whole number of at least 1'}
  end
  -- Each line is checked against `available` alone: a SKU twice would pass twice.
  if seen[ARGV[7 + 2 * i]] then
    return {'invalid', 'sku', ARGV[7 + 2 * i] .. ' appears twice; combine the lines'}
  end
  seen[ARGV[7 + 2 * i]] = true
  -- Nor may two lines share a counter (a split SKU's part 0 is the SKU's own
  -- counter): each counter is read once below and written from that read.
  local counter = KEYS[4 + 3 * (i - 1)]
  if seen_counter[counter] then
    return {'invalid', 'sku', ARGV[7 + 2 * i] .. ' counts against the same stock as another line; combine the lines'}
  end
  seen_counter[counter] = true
end

local existing = redis.call('HMGET', KEYS[1], 'fp', 'state', 'deadline', 'after',
  'refusal', 'r1', 'r2', 'r3')
if existing[1] then
  if existing[1] ~= fp then return {'conflict'} end
  if existing[2] == 'refused' then
    local answer = {'replayed', existing[5], existing[6], tonumber(existing[7])}
    if existing[8] then answer[5] = tonumber(existing[8]) end
    return answer
  end
  local first = redis.call('HGET', KEYS[1], 'lines')
  return {'retry', existing[2], tonumber(existing[3]), existing[4] or '', first or ''}
end

-- A refusal is the request's answer for as long as a retry may come.
local function refuse(tag, sku, a, b)
  redis.call('HSET', KEYS[1], 'state', 'refused', 'fp', fp, 'refusal', tag, 'r1', sku, 'r2', int(a))
  if b then redis.call('HSET', KEYS[1], 'r3', int(b)) end
  redis.call('PEXPIRE', KEYS[1], int(remember))
  return {tag, sku, a, b}
end

-- Redis' clock, not the caller's: every server flips at the same instant of a
-- drop's schedule, whatever its own clock says.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A cart's later part whose deadline has already passed would be a hold
-- that ended before it was made: nothing is written (the engine undoes the
-- cart's other parts and the caller retries).
if fixed_deadline > 0 and fixed_deadline <= now then return {'lapsed', fixed_deadline} end

-- Check every line before changing anything: all or nothing. Each counter is
-- read once, here: the writes below set what this read and the line's qty give
-- (nothing else runs in between), one command per counter instead of three.
local counters = {}
for i = 1, n do
  local b, sku, qty = 3 + 3 * (i - 1), ARGV[7 + 2 * i], tonumber(ARGV[8 + 2 * i])
  local c = redis.call('HMGET', KEYS[b + 1], 'available', 'limit', 'opens', 'closes', 'parts',
    'reserved', 'sold_pending')
  counters[i] = c
  -- A split SKU is reserved part by part, each line naming its part as
  -- `sku~j/k`: a caller that names another split than the counter's (it has
  -- not seen the SKU split, or merged) is told the count and tries again.
  if not c[1] then return {'not_warmed', sku} end
  local parts = tonumber(c[5] or '1')
  -- 0: its parts are being changed (Engine::set_parts): busy, retry shortly.
  if parts == 0 then return {'changing', sku} end
  if parts ~= tonumber(string.match(sku, '~%d+/(%d+)$') or '1') then
    return {'split', sku, parts}
  end
  local opens, closes = tonumber(c[3] or '0') or 0, tonumber(c[4] or '0') or 0
  if opens > now then return {'not_started', sku, opens} end
  if closes > 0 and now >= closes then return {'ended', sku, closes} end
  local available = tonumber(c[1])
  local limit = tonumber(c[2] or '0')
  if limit > 0 and buyer == '' then
    -- Without a buyer the limit could not be counted: anyone could skip it.
    return refuse('buyer_required', sku, limit)
  end
  if limit > 0 then
    local already = tonumber(redis.call('GET', KEYS[b + 3]) or '0')
    if already + qty > limit then return refuse('limit', sku, limit, already) end
  end
  if available < qty then
    -- One part short is not the SKU sold out: the engine gathers units from
    -- the other parts, and only it can tell (nothing is remembered here).
    if parts > 1 then return {'short', sku, available} end
    return refuse('sold_out', sku, available)
  end
end

local deadline = now + ttl
if fixed_deadline > 0 then deadline = fixed_deadline end
local deadline_s, now_s = int(deadline), int(now)
local reply = {'reserved', deadline}
local lines, after = {}, {}
for i = 1, n do
  local b, sku, qty = 3 + 3 * (i - 1), ARGV[7 + 2 * i], tonumber(ARGV[8 + 2 * i])
  local c = counters[i]
  local available = tonumber(c[1]) - qty
  local qty_s, available_s = int(qty), int(available)
  local reserved_s = int(tonumber(c[6] or '0') + qty)
  local pending = c[7] or '0'
  redis.call('HSET', KEYS[b + 1], 'available', available_s, 'reserved', reserved_s)
  redis.call('ZADD', KEYS[b + 2], deadline_s, rid)
  if buyer ~= '' then
    redis.call('INCRBY', KEYS[b + 3], qty_s)
    redis.call('PEXPIRE', KEYS[b + 3], int(buyer_ttl))
  end
  lines[#lines + 1] = sku .. '=' .. qty_s
  reply[#reply + 1] = available
  after[#after + 1] = available_s
  redis.call('XADD', KEYS[3], '*', 'kind', 'reserved', 'sku', sku,
    'qty', qty_s, 'rid', rid, 'available', available_s, 'reserved', reserved_s,
    'sold_pending', pending, 'buyer', buyer, 'ts', now_s)
end
redis.call('HSET', KEYS[1], 'state', 'held', 'fp', fp, 'buyer', buyer, 'deadline', deadline_s,
  'created', now_s, 'lines', table.concat(lines, ','), 'after', table.concat(after, ','))
if parts ~= '' then redis.call('HSET', KEYS[1], 'parts', parts) end
redis.call('ZADD', KEYS[2], deadline_s, rid)
return reply
