//! The Lua scripts from the workspace's `lua/` folder, embedded at build time.
//!
//! Each is called by SHA (`EVALSHA`). After a restart or fail-over Redis has an
//! empty script cache and answers `NOSCRIPT`; [`redis::Script`] then loads the
//! body and retries, so callers never see it.

use redis::Script;

/// Every script the engine runs.
#[derive(Debug, Clone)]
pub struct Scripts {
    /// `lua/reserve.lua`.
    pub reserve: Script,
    /// `lua/confirm.lua`.
    pub confirm: Script,
    /// `lua/release.lua`.
    pub release: Script,
    /// `lua/reap.lua`.
    pub reap: Script,
    /// `lua/warm.lua`.
    pub warm: Script,
    /// `lua/schedule.lua`.
    pub schedule: Script,
    /// `lua/delta.lua`.
    pub delta: Script,
    /// `lua/snapshot.lua`.
    pub snapshot: Script,
    /// `lua/lock_acquire.lua`.
    pub lock_acquire: Script,
    /// `lua/lock_release.lua`.
    pub lock_release: Script,
    /// `lua/lock_extend.lua`.
    pub lock_extend: Script,
    /// `lua/settle.lua`.
    pub settle: Script,
    /// `lua/correct.lua`.
    pub correct: Script,
    /// `lua/late.lua`.
    pub late: Script,
    /// `lua/forget_consumers.lua`.
    pub forget_consumers: Script,
    /// `lua/move.lua`.
    pub move_units: Script,
    /// `lua/split.lua`.
    pub split: Script,
    /// `lua/key_use.lua`.
    pub key_use: Script,
}

impl Scripts {
    /// Hashes every script body (nothing is sent to Redis until first use).
    pub fn new() -> Self {
        Self {
            reserve: Script::new(include_str!("../../lua/reserve.lua")),
            confirm: Script::new(include_str!("../../lua/confirm.lua")),
            release: Script::new(include_str!("../../lua/release.lua")),
            reap: Script::new(include_str!("../../lua/reap.lua")),
            warm: Script::new(include_str!("../../lua/warm.lua")),
            schedule: Script::new(include_str!("../../lua/schedule.lua")),
            delta: Script::new(include_str!("../../lua/delta.lua")),
            snapshot: Script::new(include_str!("../../lua/snapshot.lua")),
            lock_acquire: Script::new(include_str!("../../lua/lock_acquire.lua")),
            lock_release: Script::new(include_str!("../../lua/lock_release.lua")),
            lock_extend: Script::new(include_str!("../../lua/lock_extend.lua")),
            settle: Script::new(include_str!("../../lua/settle.lua")),
            correct: Script::new(include_str!("../../lua/correct.lua")),
            late: Script::new(include_str!("../../lua/late.lua")),
            forget_consumers: Script::new(include_str!("../../lua/forget_consumers.lua")),
            move_units: Script::new(include_str!("../../lua/move.lua")),
            split: Script::new(include_str!("../../lua/split.lua")),
            key_use: Script::new(include_str!("../../lua/key_use.lua")),
        }
    }

    /// Every script's name (its file without `.lua`) and SHA1, so a measured
    /// `EVALSHA` can be told by name.
    pub fn names(&self) -> [(&'static str, &str); 18] {
        [
            ("reserve", self.reserve.get_hash()),
            ("confirm", self.confirm.get_hash()),
            ("release", self.release.get_hash()),
            ("reap", self.reap.get_hash()),
            ("warm", self.warm.get_hash()),
            ("schedule", self.schedule.get_hash()),
            ("delta", self.delta.get_hash()),
            ("snapshot", self.snapshot.get_hash()),
            ("lock_acquire", self.lock_acquire.get_hash()),
            ("lock_release", self.lock_release.get_hash()),
            ("lock_extend", self.lock_extend.get_hash()),
            ("settle", self.settle.get_hash()),
            ("correct", self.correct.get_hash()),
            ("late", self.late.get_hash()),
            ("forget_consumers", self.forget_consumers.get_hash()),
            ("move", self.move_units.get_hash()),
            ("split", self.split.get_hash()),
            ("key_use", self.key_use.get_hash()),
        ]
    }

    /// The reserve script's SHA1, as `redis-benchmark EVALSHA` needs it.
    pub fn reserve_sha(&self) -> &str {
        self.reserve.get_hash()
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
