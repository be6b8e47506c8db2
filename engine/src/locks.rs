//! Named leases with fencing tokens.
//!
//! A lease is `SET key token NX PX ttl`; only the holder's token can extend or
//! release it. Each acquisition also takes the next value of a counter that never
//! expires: the fencing token. Work done under the lease carries it, and the
//! system of record refuses a token older than one it has seen, so a holder that
//! was paused past its lease cannot overwrite its successor's work.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::keys::Keyspace;

/// A held lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The lock's name.
    pub name: String,
    /// This holder's secret token.
    pub token: String,
    /// The fencing token of this acquisition; larger than any before it.
    pub fence: i64,
}

/// A lock as an operator inspects it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// The current holder's token.
    pub holder: String,
    /// Milliseconds until the lease lapses.
    pub remaining_ms: i64,
    /// The current holder's fencing token.
    pub fence: i64,
}

impl Engine {
    /// Takes lock `name` for `ttl` if it is free; `None` when someone holds it.
    pub async fn acquire_lock(
        &self,
        name: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, EngineError> {
        self.acquire_lock_above(name, ttl, 0).await
    }

    /// Like [`Engine::acquire_lock`], with a fencing token larger than `floor`
    /// (the newest token the system of record has seen, from
    /// [`crate::postgres::last_fence`]), even if Redis lost its counter.
    pub async fn acquire_lock_above(
        &self,
        name: &str,
        ttl: Duration,
        floor: i64,
    ) -> Result<Option<Lease>, EngineError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut inv = self.scripts.lock_acquire.prepare_invoke();
        inv.key(Keyspace::lock(name))
            .key(Keyspace::fence(name))
            .arg(&token)
            .arg(ttl.as_millis().max(1) as u64)
            .arg(floor.max(0));
        let (acquired, value): (i64, i64) = inv.invoke_async(&mut self.conn.clone()).await?;
        Ok((acquired == 1).then(|| Lease {
            name: name.to_owned(),
            token,
            fence: value,
        }))
    }

    /// Renews `lease` for `ttl`; `false` when it is no longer ours (stop working).
    pub async fn extend_lock(&self, lease: &Lease, ttl: Duration) -> Result<bool, EngineError> {
        let mut inv = self.scripts.lock_extend.prepare_invoke();
        inv.key(Keyspace::lock(&lease.name))
            .arg(&lease.token)
            .arg(ttl.as_millis().max(1) as u64);
        Ok(inv.invoke_async::<i64>(&mut self.conn.clone()).await? == 1)
    }

    /// Gives `lease` back; `false` when it had already lapsed or passed to another.
    pub async fn release_lock(&self, lease: &Lease) -> Result<bool, EngineError> {
        let mut inv = self.scripts.lock_release.prepare_invoke();
        inv.key(Keyspace::lock(&lease.name))
            .arg(&lease.token)
            .arg("0");
        Ok(inv.invoke_async::<i64>(&mut self.conn.clone()).await? == 1)
    }

    /// Releases lock `name` whoever holds it (an audited admin action); `false` when
    /// it was not held.
    pub async fn force_release_lock(&self, name: &str) -> Result<bool, EngineError> {
        let mut inv = self.scripts.lock_release.prepare_invoke();
        inv.key(Keyspace::lock(name)).arg("").arg("1");
        Ok(inv.invoke_async::<i64>(&mut self.conn.clone()).await? == 1)
    }

    /// Every held lock, found with `SCAN` (never `KEYS`), sorted by name.
    pub async fn list_locks(&self) -> Result<Vec<LockInfo>, EngineError> {
        let mut conn = self.conn.clone();
        // Every master's keys on a cluster: each lock has its own slot.
        let mut names: Vec<String> = self
            .connection()
            .scan_match("hf:lock:{*}")
            .await?
            .iter()
            .filter_map(|k| Keyspace::lock_name(k))
            .map(str::to_owned)
            .collect();
        names.sort();
        names.dedup();
        let mut locks = Vec::with_capacity(names.len());
        for name in names {
            let (holder, remaining_ms, fence): (Option<String>, i64, Option<i64>) = redis::pipe()
                .cmd("GET")
                .arg(Keyspace::lock(&name))
                .cmd("PTTL")
                .arg(Keyspace::lock(&name))
                .cmd("GET")
                .arg(Keyspace::fence(&name))
                .query_async(&mut conn)
                .await?;
            // Lapsed between SCAN and GET: not held any more.
            if let Some(holder) = holder {
                locks.push(LockInfo {
                    name,
                    holder,
                    remaining_ms,
                    fence: fence.unwrap_or(0),
                });
            }
        }
        Ok(locks)
    }
}
