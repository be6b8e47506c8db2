-- key_use.lua: keep the Idempotency-Key of a confirm or release of a cart whose
-- parts are in several shards, in its first part's hold, before the cart's
-- steps run (a one-shard hold keeps it in confirm.lua or release.lua itself,
-- in the same call). The cart's steps are idempotent by themselves; the key
-- only refuses another request under it.
--
-- KEYS[1]  hold hash of the cart's first part   hf:{hfN.j}:hold:<rid>
-- ARGV[1]  the key's hash field (`k:<token>:<key>`)   ARGV[2] the request's fingerprint
-- ARGV[3]  tombstone ttl ms: an ended part's record then lasts at least this
--          long from the key's use (as in confirm.lua)
--
-- Returns 'kept' (first use, or the same request again), 'key_reused' (kept for
-- another request: nothing is written) or 'unknown' (no such hold).
local state = redis.call('HGET', KEYS[1], 'state')
if not state or state == 'refused' then return 'unknown' end
local prior = redis.call('HGET', KEYS[1], ARGV[1])
if prior and prior ~= ARGV[2] then return 'key_reused' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local left = redis.call('PTTL', KEYS[1])
if left >= 0 and left < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 'kept'
