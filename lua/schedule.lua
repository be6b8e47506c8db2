-- schedule.lua: set a warmed SKU's drop schedule, which reserve.lua checks
-- against Redis' clock, and its per-buyer limit. A missing counter is left
-- missing (warm.lua writes both when it creates one): never a half-made counter.
--
-- KEYS[1]  SKU counters hash    hf:{hfN.j}:sku:<sku>
-- ARGV[1] opens, ARGV[2] closes: Unix ms, 0 for none
-- ARGV[3] per-buyer limit (0 = none; absent: left as it is)
--
-- Returns 1 when set, 0 when the counter is missing.
local opens, closes = tonumber(ARGV[1]), tonumber(ARGV[2])
if not opens or not closes or opens < 0 or closes < 0 or opens ~= math.floor(opens)
  or closes ~= math.floor(closes) then
  return redis.error_reply('ERR schedule.lua: opens and closes must be whole milliseconds, 0 for none')
end
local limit = ARGV[3] and tonumber(ARGV[3])
if ARGV[3] and (not limit or limit < 0 or limit ~= math.floor(limit)) then
  return redis.error_reply('ERR schedule.lua: the limit must be a whole number, 0 for none')
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'opens', opens, 'closes', closes)
if limit then redis.call('HSET', KEYS[1], 'limit', limit) end
return 1
