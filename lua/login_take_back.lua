-- Takes back one counted sign-in attempt (the password was right, or it was
-- never checked), only while the count still exists: a count whose window
-- ended meanwhile is not turned into a negative one without an expiry.
--
-- KEYS  the counters
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('DECR', key)
  end
end
return 0
