//! Where everything lives in Redis.
//!
//! Each SKU belongs to one of `shards` hash tags (`{hf0}` … `{hfN}`), chosen by a
//! stable hash of its code. Every key of that SKU, every hold on it and the
//! shard's event stream carry the same tag, so each script touches one slot and
//! runs unchanged on Redis Cluster. A bounded number of shards also means a bounded
//! number of event streams for readers to tail, however many SKUs there are.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `hf:{hfN}:sku:<sku>` | hash | `available`, `reserved`, `sold_pending`, `sold`, `limit`, `version` |
//! | `hf:{hfN}:holds:<sku>` | zset | open holds on the SKU, scored by deadline (ms) |
//! | `hf:{hfN}:buyer:<sku>:<buyer>` | string | units a buyer holds or bought (per-buyer limit) |
//! | `hf:{hfN}:hold:<rid>` | hash | one reservation: `state`, `lines`, `buyer`, `deadline`, `fp`, `after` (the first answer); or a refused request's record (`state` `refused`, kept 24 h) |
//! | `hf:{hfN}:due` | zset | the shard's open holds by deadline, for the reaper |
//! | `hf:{hfN}:due:aside` | zset | holds the reaper could not read or end, set aside for an operator |
//! | `hf:{hfN}:events` | stream | every change, see [`crate::events`] |
//! | `hf:{hfN}:seen:<source>:<id>` | string | a feed event already applied (24 h) |
//! | `hf:lock:{<name>}` / `…:fence` | string | a lease's holder token / its fencing counter |
//! | `hf:claim:{<rid>}` | string | which request owns reservation id `rid`: its fingerprint, set once by the first attempt (kept as long as the longest hold and its tombstone: 25 h by default); every path checks it, so one id is never held for two requests |
//! | `hf:idem:{t<token>}:<sha256(key)>` | string | an `Idempotency-Key`'s claim or stored answer (24 h): carts over several shards, confirm and release with a key (a one-shard hold is its own record) |
//! | `hf:ingest:{<lane>}` / `…:paused` | stream / string | a webhook lane's payloads / its pause flag |
//! | `hf:ingest:{dead}` | stream | payloads and events that could not be applied |
//! | `hf:feed:{<source>}:<event id>` | string | the fingerprint of a feed event id's first payload (24 h) |
//! | `hf:{mark}` | string | this Redis' data generation: gone means Redis lost its data (see [`crate::warmup::rewarm_after_loss`]) |

/// Key names for one deployment: the prefix is fixed, the shard count is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keyspace {
    shards: u16,
}

impl Keyspace {
    /// A keyspace with `shards` hash tags (at least 1).
    ///
    /// Changing the count moves SKUs between tags, so it is fixed per deployment.
    pub fn new(shards: u16) -> Self {
        Self {
            shards: shards.max(1),
        }
    }

    /// How many shards there are.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    /// The shard of `sku` (FNV-1a, stable across processes and releases).
    pub fn shard_of(&self, sku: &str) -> u16 {
        let mut hash: u32 = 0x811c_9dc5;
        for byte in sku.bytes() {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        (hash % u32::from(self.shards)) as u16
    }

    fn tag(shard: u16) -> String {
        format!("hf:{{hf{shard}}}")
    }

    /// Which request owns reservation id `rid` (its fingerprint): the one place
    /// every attempt under the id meets, whichever shards its lines are in.
    pub fn claim(&self, rid: &str) -> String {
        format!("hf:claim:{{{rid}}}")
    }

    /// Where the answer to `Idempotency-Key` `key` of API token `token_id` is kept
    /// (the key is hashed: clients choose it, and it may hold any visible ASCII).
    pub fn idempotency(token_id: i64, key: &str) -> String {
        use sha2::Digest;
        format!(
            "hf:idem:{{t{token_id}}}:{}",
            hex::encode(sha2::Sha256::digest(key.as_bytes()))
        )
    }

    /// The counters hash of `sku`.
    pub fn sku(&self, sku: &str) -> String {
        format!("{}:sku:{sku}", Self::tag(self.shard_of(sku)))
    }

    /// The open-holds zset of `sku`.
    pub fn sku_holds(&self, sku: &str) -> String {
        format!("{}:holds:{sku}", Self::tag(self.shard_of(sku)))
    }

    /// The per-buyer counter of `buyer` on `sku`.
    pub fn buyer(&self, sku: &str, buyer: &str) -> String {
        format!("{}:buyer:{sku}:{buyer}", Self::tag(self.shard_of(sku)))
    }

    /// The hold hash of reservation `rid` in `shard`.
    pub fn hold(&self, shard: u16, rid: &str) -> String {
        format!("{}:hold:{rid}", Self::tag(shard))
    }

    /// The due-holds zset of `shard`.
    pub fn due(&self, shard: u16) -> String {
        format!("{}:due", Self::tag(shard))
    }

    /// Holds of `shard` the reaper could not read or end, set aside for an
    /// operator (zset, scored by when).
    pub fn set_aside(&self, shard: u16) -> String {
        format!("{}:due:aside", Self::tag(shard))
    }

    /// The event stream of `shard`.
    pub fn events(&self, shard: u16) -> String {
        format!("{}:events", Self::tag(shard))
    }

    /// Every shard's event stream, in shard order.
    pub fn all_events(&self) -> Vec<String> {
        (0..self.shards).map(|s| self.events(s)).collect()
    }

    /// The guard marking feed event `event_id` from `source` as applied to `sku`'s shard.
    pub fn seen(&self, sku: &str, source: &str, event_id: &str) -> String {
        format!("{}:seen:{source}:{event_id}", Self::tag(self.shard_of(sku)))
    }

    /// The claim on feed event `event_id` of `source`, whatever its SKU: one event
    /// id is one event per source, as the ledger's `UNIQUE (source, event_id)`
    /// says. Holds the event's fingerprint (SKU and change), so a reused id with
    /// a different payload is told apart from a redelivery.
    pub fn feed_event(source: &str, event_id: &str) -> String {
        format!("hf:feed:{{{source}}}:{event_id}")
    }

    /// Failed sign-ins for user `username` in the current window (string counter
    /// with the window as its lifetime).
    pub fn login_failures(username: &str) -> String {
        format!("hf:login:{{{username}}}:failures")
    }

    /// Failed sign-ins for one username from one client address (`None`: the
    /// address is not known), in the username's slot.
    pub fn login_failures_from_for(username: &str, ip: Option<std::net::IpAddr>) -> String {
        match ip {
            Some(ip) => format!("hf:login:{{{username}}}:from:{ip}"),
            None => format!("hf:login:{{{username}}}:from:unknown"),
        }
    }

    /// A device token (by its hex digest) that exempts its browser from the
    /// per-user sign-in limit for `username`.
    pub fn login_device(username: &str, digest_hex: &str) -> String {
        format!("hf:login:{{{username}}}:device:{digest_hex}")
    }

    /// Failed sign-ins from one client address (any usernames).
    pub fn login_failures_from(ip: std::net::IpAddr) -> String {
        format!("hf:login:addr:{{{ip}}}:failures")
    }

    /// The mark whose disappearance says Redis lost its data.
    pub const LOSS_MARK: &'static str = "hf:{mark}";
    /// The counter each replica acknowledgement round writes and waits for
    /// ([`crate::replicas`]).
    pub const ACK_MARK: &'static str = "hf:{ack}";

    /// The lease key of lock `name`.
    pub fn lock(name: &str) -> String {
        format!("hf:lock:{{{name}}}")
    }

    /// The fencing counter of lock `name` (same hash tag as the lease).
    pub fn fence(name: &str) -> String {
        format!("hf:lock:{{{name}}}:fence")
    }

    /// The lock name inside a lease key, if `key` is one.
    pub fn lock_name(key: &str) -> Option<&str> {
        key.strip_prefix("hf:lock:{")?.strip_suffix('}')
    }
}

impl Default for Keyspace {
    fn default() -> Self {
        Self::new(16)
    }
}

#[cfg(test)]
mod tests {
    use super::Keyspace;

    #[test]
    fn one_skus_keys_share_a_tag() {
        let ks = Keyspace::new(16);
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        let s = ks.shard_of("DROP-001");
        let keys = [
            ks.sku("DROP-001"),
            ks.sku_holds("DROP-001"),
            ks.buyer("DROP-001", "b1"),
            ks.hold(s, "r1"),
            ks.due(s),
            ks.events(s),
            ks.seen("DROP-001", "erp", "e1"),
        ];
        assert!(keys.iter().all(|k| tag(k) == tag(&keys[0])), "{keys:?}");
    }

    #[test]
    fn shards_are_stable_and_spread() {
        let ks = Keyspace::new(16);
        assert_eq!(ks.shard_of("DROP-001"), ks.shard_of("DROP-001"));
        let used: std::collections::BTreeSet<u16> =
            (0..200).map(|i| ks.shard_of(&format!("SKU-{i}"))).collect();
        assert_eq!(used.len(), 16, "200 SKUs reach every shard");
        assert_eq!(Keyspace::new(0).shards(), 1);
    }

    #[test]
    fn lock_keys_round_trip() {
        assert_eq!(Keyspace::lock("reconcile"), "hf:lock:{reconcile}");
        assert_eq!(
            Keyspace::lock_name("hf:lock:{reconcile}"),
            Some("reconcile")
        );
        assert_eq!(Keyspace::lock_name("hf:lock:{reconcile}:fence"), None);
    }
}
