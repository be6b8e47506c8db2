//! Where everything lives in Redis.
//!
//! Each SKU belongs to one of `shards` hash tags, chosen by a stable hash of its
//! code. Every key of that SKU, every hold on it and the shard's event stream
//! carry the same tag, so each script touches one slot and runs unchanged on
//! Redis Cluster. A bounded number of shards also means a bounded number of
//! event streams for readers to tail, however many SKUs there are.
//!
//! **Even shards.** Redis Cluster gives each master a contiguous range of the
//! 16,384 slots. Shard `i`'s tag (`hf<i>` with a suffix, e.g. `{hf3.41}`) is
//! chosen so its slot falls in the `i`-th of `shards` equal slices of that
//! range: with `m` masters each holds `shards / m` shards, give or take one.
//! Plain `{hf0}`…`{hf15}` would land where CRC16 puts them (3/8/5 shards on
//! three masters, none at all on four of eight). The default of 64 shards
//! gives every master of a cluster of up to 64 an equal share within one
//! (32 masters: two each); more shards than masters is what lets a cluster
//! grow. The count is fixed per deployment: it is written to Redis
//! ([`Keyspace::LAYOUT`]) and a process configured otherwise is refused at
//! start-up ([`crate::Engine::check_layout`]).
//!
//! | key | type | holds |
//! |---|---|---|
//! | `hf:{hfN.j}:sku:<sku>` | hash | `available`, `reserved`, `sold_pending`, `sold`, `limit`, `version` |
//! | `hf:{hfN.j}:sku:<sku>~<j>/<k>` | hash | part `j` of a SKU split into `k` (part 0 is the SKU's own counter): the same fields, `parts` = k on every part, `moving` (units on their way to another part, and units `parked` there while another part may owe), `gen` (counts rises of `available`) and `hold_back` (a feed's mark: units coming back are parked), see [`crate::split`] |
//! | `hf:{hfN.j}:moves:<sku>~<j>/<k>` / `hf:{hfN.j}:moved:<part>:<tid>` | hash / string | transfers out of a part not yet finished / a transfer a part received (24 h) |
//! | `hf:{hfN.j}:holds:<sku>` | zset | open holds on the SKU, scored by deadline (ms) |
//! | `hf:{hfN.j}:buyer:<sku>:<buyer>` | string | units a buyer holds or bought (per-buyer limit) |
//! | `hf:{hfN.j}:hold:<rid>` | hash | one reservation: `state`, `lines`, `buyer`, `deadline`, `fp`, `after` (the first answer); or a refused request's record (`state` `refused`, kept 24 h) |
//! | `hf:{hfN.j}:due` | zset | the shard's open holds by deadline, for the reaper |
//! | `hf:{hfN.j}:due:aside` | zset | holds the reaper could not read or end, set aside for an operator |
//! | `hf:{hfN.j}:events` | stream | every change, see [`crate::events`] |
//! | `hf:{hfN.j}:seen:<source>:<id>` | string | a feed event already applied (24 h) |
//! | `hf:lock:{<name>}` / `…:fence` | string | a lease's holder token / its fencing counter (`debts:<sku>`: a payment handing a split SKU's debt on) |
//! | `hf:claim:{<rid>}` | string | which request owns reservation id `rid`: its fingerprint, set once by the first attempt (kept as long as the longest hold and its tombstone: 25 h by default); every path checks it, so one id is never held for two requests |
//! | `hf:building:{<rid>}` | string | the attempt building cart `rid` now (a random token, a lease of [`crate::cart::BUILD_LEASE`]); a second attempt meanwhile is told to retry |
//! | `hf:idem:{t<token>}:<sha256(key)>` | string | an `Idempotency-Key`'s claim or stored answer (24 h): carts over several shards, confirm and release with a key (a one-shard hold is its own record) |
//! | `hf:ingest:{<lane>}` / `…:paused` | stream / string | a webhook lane's payloads / its pause flag |
//! | `hf:ingest:{dead}` | stream | payloads and events that could not be applied |
//! | `hf:feed:{<source>}:<event id>` | string | the fingerprint of a feed event id's first payload (24 h) |
//! | `hf:{hfN.j}:mark` | string | the shard's data generation: gone means the shard lost its data (see [`crate::warmup::rewarm_after_loss`]) |
//! | `hf:{layout}` | string | the shard count and tag scheme the data is laid out in |
//! | `hf:{ack}` / `hf:ack:<n>` | string | counters the replica acknowledgement rounds write and `WAIT` for (one node / one per cluster master, `<n>` chosen to fall in one of its slots) |

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Slots in a Redis Cluster.
const SLOTS: u32 = 16_384;

/// The version of the tag scheme, written with the shard count to
/// [`Keyspace::LAYOUT`].
const TAG_SCHEME: &str = "even1";

/// Key names for one deployment: the prefix is fixed, the shard count is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keyspace {
    shards: u16,
    /// Each shard's key prefix, `hf:{<tag>}`.
    tags: &'static [String],
}

impl Keyspace {
    /// A keyspace with `shards` hash tags (at least 1).
    ///
    /// Changing the count moves SKUs between tags, so it is fixed per deployment.
    pub fn new(shards: u16) -> Self {
        let shards = shards.max(1);
        Self {
            shards,
            tags: tags(shards),
        }
    }

    /// How many shards there are.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    /// The shard count and tag scheme, as [`Keyspace::LAYOUT`] records them.
    pub fn layout(&self) -> String {
        format!("shards={} tags={TAG_SCHEME}", self.shards)
    }

    /// The shard of `sku` (FNV-1a, stable across processes and releases).
    ///
    /// Part `j` of a SKU split into `k` ([`part_name`]) lies `j * shards / k`
    /// shards after the SKU's own, so a split SKU's parts sit in `k` evenly
    /// spaced shards and, on a cluster, on as many masters as it has.
    pub fn shard_of(&self, sku: &str) -> u16 {
        let Some((base, part, parts)) = parse_part(sku) else {
            return (fnv(sku) % u32::from(self.shards)) as u16;
        };
        let shards = u32::from(self.shards);
        let stride = (shards / u32::from(parts.max(1))).max(1);
        ((fnv(base) % shards + u32::from(part) * stride) % shards) as u16
    }

    /// The name a key of `sku` is made from: part 0 of a split SKU is the
    /// SKU's own counter (its history, feed versions and settings stay there).
    fn key_name<'a>(&self, sku: &'a str) -> &'a str {
        match parse_part(sku) {
            Some((base, 0, _)) => base,
            _ => sku,
        }
    }

    fn tag(&self, shard: u16) -> &str {
        &self.tags[usize::from(shard)]
    }

    /// Which request owns reservation id `rid` (its fingerprint): the one place
    /// every attempt under the id meets, whichever shards its lines are in.
    pub fn claim(&self, rid: &str) -> String {
        format!("hf:claim:{{{rid}}}")
    }

    /// Who is building cart `rid` now (a lease holding a random token, in the
    /// claim's slot): one attempt at a time writes or undoes a cart's parts.
    pub fn cart_build(&self, rid: &str) -> String {
        format!("hf:building:{{{rid}}}")
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
        format!(
            "{}:sku:{}",
            self.tag(self.shard_of(sku)),
            self.key_name(sku)
        )
    }

    /// The open-holds zset of `sku`.
    pub fn sku_holds(&self, sku: &str) -> String {
        format!(
            "{}:holds:{}",
            self.tag(self.shard_of(sku)),
            self.key_name(sku)
        )
    }

    /// The per-buyer counter of `buyer` on `sku`.
    pub fn buyer(&self, sku: &str, buyer: &str) -> String {
        format!(
            "{}:buyer:{}:{buyer}",
            self.tag(self.shard_of(sku)),
            self.key_name(sku)
        )
    }

    /// Units on their way out of part `name` of a split SKU to another part
    /// (hash: transfer id to `qty|to`), see [`crate::split`].
    pub fn moves(&self, name: &str) -> String {
        format!(
            "{}:moves:{}",
            self.tag(self.shard_of(name)),
            self.key_name(name)
        )
    }

    /// The guard marking transfer `tid` as received by part `name` (24 h).
    pub fn moved_in(&self, name: &str, tid: &str) -> String {
        format!(
            "{}:moved:{}:{tid}",
            self.tag(self.shard_of(name)),
            self.key_name(name)
        )
    }

    /// The hold hash of reservation `rid` in `shard`.
    pub fn hold(&self, shard: u16, rid: &str) -> String {
        format!("{}:hold:{rid}", self.tag(shard))
    }

    /// The due-holds zset of `shard`.
    pub fn due(&self, shard: u16) -> String {
        format!("{}:due", self.tag(shard))
    }

    /// Holds of `shard` the reaper could not read or end, set aside for an
    /// operator (zset, scored by when).
    pub fn set_aside(&self, shard: u16) -> String {
        format!("{}:due:aside", self.tag(shard))
    }

    /// The mark whose disappearance says `shard` lost its data
    /// ([`crate::warmup::rewarm_after_loss`]).
    pub fn mark(&self, shard: u16) -> String {
        format!("{}:mark", self.tag(shard))
    }

    /// The event stream of `shard`.
    pub fn events(&self, shard: u16) -> String {
        format!("{}:events", self.tag(shard))
    }

    /// Every shard's event stream, in shard order.
    pub fn all_events(&self) -> Vec<String> {
        (0..self.shards).map(|s| self.events(s)).collect()
    }

    /// The guard marking feed event `event_id` from `source` as applied to `sku`'s shard.
    pub fn seen(&self, sku: &str, source: &str, event_id: &str) -> String {
        format!("{}:seen:{source}:{event_id}", self.tag(self.shard_of(sku)))
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

    /// The counter each replica acknowledgement round writes and waits for
    /// ([`crate::replicas`]).
    pub const ACK_MARK: &'static str = "hf:{ack}";
    /// The layout the data in Redis was written in ([`Keyspace::layout`]).
    pub const LAYOUT: &'static str = "hf:{layout}";

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
        Self::new(DEFAULT_SHARDS)
    }
}

/// The most parts a SKU may be split into ([`part_name`]).
pub const MAX_PARTS: u16 = 16;

/// The name of part `part` of SKU `sku` split into `parts` (`SKU~j/k`): what a
/// hold's line, an event and a script call name when they mean that part. No
/// SKU code has a `~` ([`crate::valid_sku`]), so a part's name is never a
/// SKU's. An unsplit SKU (`parts` below 2) is its own only part.
pub fn part_name(sku: &str, part: u16, parts: u16) -> String {
    if parts < 2 {
        sku.to_owned()
    } else {
        format!("{sku}~{part}/{parts}")
    }
}

/// The SKU a part's name (or a SKU code) belongs to.
pub fn base_sku(name: &str) -> &str {
    name.split_once('~').map_or(name, |(base, _)| base)
}

/// A part's name as (SKU, part, parts); `None` for a plain SKU code.
pub fn parse_part(name: &str) -> Option<(&str, u16, u16)> {
    let (base, rest) = name.split_once('~')?;
    let (part, parts) = rest.split_once('/')?;
    let (part, parts) = (part.parse().ok()?, parts.parse().ok()?);
    (part < parts).then_some((base, part, parts))
}

/// FNV-1a of `text`: stable across processes and releases.
pub(crate) fn fnv(text: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in text.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The shard count a deployment gets unless configured otherwise.
pub const DEFAULT_SHARDS: u16 = 64;

/// The key prefixes of `shards` shards, made once per count (a process uses
/// one, tests a few) and kept for the process' life.
fn tags(shards: u16) -> &'static [String] {
    static MADE: OnceLock<Mutex<HashMap<u16, &'static [String]>>> = OnceLock::new();
    let mut made = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    made.entry(shards).or_insert_with(|| {
        let tags: Vec<String> = (0..shards)
            .map(|i| format!("hf:{{{}}}", even_tag(i, shards)))
            .collect();
        Box::leak(tags.into_boxed_slice())
    })
}

/// The hash tag of shard `i` of `shards`: `hf<i>`, or `hf<i>.<j>` with the
/// smallest `j` that puts its slot in the `i`-th of `shards` equal slices of
/// the slot range (about `shards` tries).
fn even_tag(i: u16, shards: u16) -> String {
    let (lo, hi) = (
        u32::from(i) * SLOTS / u32::from(shards),
        (u32::from(i) + 1) * SLOTS / u32::from(shards),
    );
    (0..)
        .map(|j| {
            if j == 0 {
                format!("hf{i}")
            } else {
                format!("hf{i}.{j}")
            }
        })
        .find(|tag| (lo..hi).contains(&u32::from(slot(tag))))
        .expect("some suffix lands in every slice")
}

/// The Redis Cluster slot of a hash tag's content (CRC16-XMODEM, mod 16,384).
pub fn slot(tag: &str) -> u16 {
    crc_slot(tag.as_bytes())
}

/// The Redis Cluster slot of `key`: of its hash tag (the text between the
/// first `{` and the next `}`, when not empty), else of the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|b| *b == b'}')
            .filter(|close| *close > 0)
            .map(|close| &rest[..close])
    });
    crc_slot(tagged.unwrap_or(key))
}

fn crc_slot(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    (u32::from(crc) % SLOTS) as u16
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
    fn key_slots_follow_the_hash_tag() {
        use super::key_slot;
        assert_eq!(key_slot(b"hf:{hf0}:due"), 9_493);
        assert_eq!(key_slot(b"hf0"), 9_493);
        // An empty tag hashes the whole key, as Redis does.
        assert_eq!(key_slot(b"{}hf0"), super::slot("{}hf0"));
    }

    #[test]
    fn slots_match_redis() {
        // CLUSTER KEYSLOT on Redis 7.0 for these tags.
        assert_eq!(super::slot("hf0"), 9_493);
        assert_eq!(super::slot("hf1"), 13_620);
        assert_eq!(super::slot("hf0.1"), 9_092);
        assert_eq!(super::slot("123456789"), 12_739);
    }

    #[test]
    fn shards_spread_evenly_over_the_slot_range() {
        for shards in [1_u16, 3, 16, 64, 100] {
            let ks = Keyspace::new(shards);
            for masters in [1_u32, 3, 8, 32, 64] {
                if u32::from(shards) < masters {
                    continue;
                }
                // Each of `masters` gets an equal contiguous slot range.
                let mut per_master = vec![0_u32; masters as usize];
                for i in 0..shards {
                    let key = ks.due(i);
                    let tag = &key[key.find('{').unwrap() + 1..key.find('}').unwrap()];
                    let slot = u32::from(super::slot(tag));
                    per_master[(slot * masters / super::SLOTS) as usize] += 1;
                }
                let (min, max) = (
                    per_master.iter().min().unwrap(),
                    per_master.iter().max().unwrap(),
                );
                // Within one of an equal share; within two when the count
                // does not divide (slices and masters' ranges then straddle).
                let tolerance = if u32::from(shards) % masters == 0 {
                    1
                } else {
                    2
                };
                assert!(
                    max - min <= tolerance,
                    "{shards} shards on {masters} masters: {per_master:?}"
                );
            }
        }
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
    fn parts_of_a_split_sku_spread_over_its_shards() {
        use super::{base_sku, parse_part, part_name};
        let ks = Keyspace::new(64);
        let home = ks.shard_of("HOT-1");
        let shards: Vec<u16> = (0..4)
            .map(|j| ks.shard_of(&part_name("HOT-1", j, 4)))
            .collect();
        assert_eq!(
            shards,
            (0..4).map(|j| (home + 16 * j) % 64).collect::<Vec<_>>()
        );
        // Part 0 is the SKU's own counter; the others are keys of their own.
        assert_eq!(ks.sku(&part_name("HOT-1", 0, 4)), ks.sku("HOT-1"));
        assert_eq!(
            ks.buyer(&part_name("HOT-1", 0, 4), "b"),
            ks.buyer("HOT-1", "b")
        );
        assert_ne!(ks.sku(&part_name("HOT-1", 1, 4)), ks.sku("HOT-1"));
        assert!(
            ks.sku(&part_name("HOT-1", 1, 4))
                .ends_with(":sku:HOT-1~1/4")
        );
        assert_eq!(part_name("HOT-1", 0, 1), "HOT-1");
        assert_eq!(base_sku("HOT-1~3/4"), "HOT-1");
        assert_eq!(base_sku("HOT-1"), "HOT-1");
        assert_eq!(parse_part("HOT-1~3/4"), Some(("HOT-1", 3, 4)));
        assert_eq!(parse_part("HOT-1~4/4"), None);
        assert_eq!(parse_part("HOT-1"), None);
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
