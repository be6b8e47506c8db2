-- Appends a webhook payload to its lane, unless the lane already holds its cap
-- of payloads or of payload bytes (a count alone let 100,000 payloads of 2 MiB
-- in, which Redis under noeviction cannot hold).
--
-- KEYS[1]  the lane's stream
-- KEYS[2]  the lane's byte count (payload bytes waiting)
-- ARGV[1]  most payloads waiting
-- ARGV[2]  most payload bytes waiting
-- ARGV[3]  source name
-- ARGV[4]  the raw body
--
-- Returns {'ok', id} or {'full', payloads, bytes}.
local waiting = redis.call('XLEN', KEYS[1])
if waiting == 0 then
  -- Nothing waits, so nothing is counted: heals a count left high by a
  -- consumer that died between deleting an entry and counting it out.
  redis.call('DEL', KEYS[2])
end
local bytes = tonumber(redis.call('GET', KEYS[2]) or '0')
local size = string.len(ARGV[4])
if waiting >= tonumber(ARGV[1]) or bytes + size > tonumber(ARGV[2]) then
  return {'full', waiting, bytes}
end
local id = redis.call('XADD', KEYS[1], '*', 'source', ARGV[3], 'body', ARGV[4])
redis.call('INCRBY', KEYS[2], size)
return {'ok', id}
