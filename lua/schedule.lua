-- schedule.lua: set a warmed SKU's drop schedule, which reserve.lua checks
-- against Redis' clock. A missing counter is left missing (warm.lua writes the
-- schedule when it creates one): never a half-made counter.
--
-- KEYS[1]  SKU counters hash    hf:{hfN}:sku:<sku>
-- ARGV[1] opens, ARGV[2] closes: Unix ms, 0 for none
--
-- Returns 1 when set, 0 when the counter is missing.
local opens, closes = tonumber(ARGV[1]), tonumber(ARGV[2])
if not opens or not closes or opens < 0 or closes < 0 or opens ~= math.floor(opens)
  or closes ~= math.floor(closes) then
  return redis.error_reply('ERR schedule.lua: opens and closes must be whole milliseconds, 0 for none')
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'opens', opens, 'closes', closes)
return 1
