-- Gives back one attempt of a lane payload whose work stopped for a pause, an
-- outage or a shutdown rather than a failure. Only a counter that still exists
-- is lowered: the payload may have been finished (and its counter deleted) by
-- another consumer meanwhile, and a plain DECR would then leave a counter of -1
-- behind, kept for ever.
--
-- KEYS[1]  the payload's attempt counter
--
-- Returns the counter after, or 0 when there was none.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('DECR', KEYS[1])
end
return 0
