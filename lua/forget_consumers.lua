-- forget_consumers.lua: delete a stream group's consumers that are gone.
--
-- Every server process reads under a name of its own (role, host, pid, a
-- random tag), so each restart leaves its old names in the group. A name with
-- nothing pending that has not read for ARGV[2] ms belongs to a process that
-- is gone: deleting it loses nothing. Checked and deleted in one script, so a
-- consumer cannot take an entry between the check and the delete (deleting a
-- consumer drops its pending entries from the group).
--
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  idle ms: only consumers silent at least this long go
-- ARGV[3]  the caller's own consumer name (never deleted)
--
-- Returns how many consumers were deleted (0 when the group does not exist).
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then return 0 end
local idle_floor = tonumber(ARGV[2])
local gone = 0
for _, c in ipairs(consumers) do
    local f = {}
    for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
    if f['name'] ~= ARGV[3] and tonumber(f['pending']) == 0
        and tonumber(f['idle']) >= idle_floor then
        redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
        gone = gone + 1
    end
end
return gone
