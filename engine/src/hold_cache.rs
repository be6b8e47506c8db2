//! The one-shard reservations this process made, remembered so that confirming
//! or releasing one is a single Redis call: the script runs on the shard and
//! lines remembered instead of after a look-up of where the hold lives.
//!
//! Memory is only a hint. The script is given the fingerprint of the request
//! that made the hold and answers `mismatch` (or `unknown`) when the hold in
//! Redis is not that one, and the caller then looks the hold up as before. An
//! entry is used only while its id's claim lasts (the look-up path checks a
//! hold against the claim's owner; within the claim's life that owner is the
//! request remembered).
//! A process that did not make the hold (another server behind the load
//! balancer, or this one after a restart) has no entry and looks it up: two
//! round trips instead of one, same answer.
//!
//! Two generations bound the memory: entries go into the young map; when it
//! holds half the capacity it becomes the old map and the previous old map is
//! dropped, so the newest holds are always remembered.

use std::collections::HashMap;
use std::mem;
use std::sync::Mutex;

use crate::Hold;

/// A hold this process made: where it lives, and until when memory may stand
/// for a look-up.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    /// The shard its lines are in.
    pub(crate) shard: u16,
    /// The hold as made.
    pub(crate) hold: Hold,
    /// Unix ms after which it is forgotten: the look-up path checks a hold
    /// against its id's claim, so memory must not outlive the claim.
    pub(crate) until_ms: i64,
}

impl Known {
    /// The fingerprint of the request that made the hold.
    pub(crate) fn fp(&self) -> String {
        crate::engine::fingerprint_of(&self.hold.lines, self.hold.buyer.as_deref())
    }
}

/// Holds made by this process, newest kept (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct HoldCache {
    half: usize,
    maps: Mutex<Generations>,
}

#[derive(Debug, Default)]
struct Generations {
    young: HashMap<String, Known>,
    old: HashMap<String, Known>,
}

impl HoldCache {
    /// A cache of at most `entries` holds (0: none are remembered).
    pub(crate) fn new(entries: usize) -> Self {
        Self {
            half: entries / 2,
            maps: Mutex::default(),
        }
    }

    /// Remembers `known` (its hold's id is the key).
    pub(crate) fn remember(&self, known: Known) {
        if self.half == 0 {
            return;
        }
        let aged = {
            let mut maps = self.lock();
            let aged = if maps.young.len() >= self.half {
                let young = mem::take(&mut maps.young);
                Some(mem::replace(&mut maps.old, young))
            } else {
                None
            };
            maps.young.insert(known.hold.reservation_id.clone(), known);
            aged
        };
        // The oldest generation is freed outside the lock: no caller waits
        // while a hundred thousand entries are dropped.
        drop(aged);
    }

    /// The hold `rid`, when this process made it and still remembers it at
    /// `now_ms` (Unix ms).
    pub(crate) fn get(&self, rid: &str, now_ms: i64) -> Option<Known> {
        let maps = self.lock();
        maps.young
            .get(rid)
            .or_else(|| maps.old.get(rid))
            .filter(|k| now_ms < k.until_ms)
            .cloned()
    }

    /// Forgets `rid` (what was remembered did not match Redis).
    pub(crate) fn forget(&self, rid: &str) {
        let mut maps = self.lock();
        maps.young.remove(rid);
        maps.old.remove(rid);
    }

    /// Forgets every hold (Redis lost its data: ids may have been taken since).
    pub(crate) fn clear(&self) {
        let dropped = {
            let mut maps = self.lock();
            (mem::take(&mut maps.young), mem::take(&mut maps.old))
        };
        drop(dropped);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        // A panic while holding the lock leaves the maps consistent (each
        // operation is one map call), so a poisoned lock is still usable.
        self.maps.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HoldState;

    fn known(rid: &str) -> Known {
        Known {
            shard: 1,
            hold: Hold {
                reservation_id: rid.into(),
                state: HoldState::Held,
                lines: Vec::new(),
                buyer: None,
                expires_at_ms: 0,
                created_at_ms: 0,
            },
            until_ms: 100,
        }
    }

    #[test]
    fn keeps_the_newest_within_its_capacity() {
        let cache = HoldCache::new(4);
        for rid in ["a", "b", "c", "d", "e"] {
            cache.remember(known(rid));
        }
        // "a" and "b" filled the first young map and aged; "c" and "d" the
        // second, which pushed them out; "e" is young.
        assert!(cache.get("a", 0).is_none() && cache.get("b", 0).is_none());
        for rid in ["c", "d", "e"] {
            assert_eq!(
                cache.get(rid, 99).map(|k| k.hold.reservation_id),
                Some(rid.into())
            );
        }
        // From its time on, an entry is no longer used.
        assert!(cache.get("e", 100).is_none());
        cache.forget("d");
        assert!(cache.get("d", 0).is_none());
        cache.clear();
        assert!(cache.get("c", 0).is_none());
    }

    #[test]
    fn remembers_nothing_at_capacity_zero() {
        let cache = HoldCache::new(0);
        cache.remember(known("a"));
        assert!(cache.get("a", 0).is_none());
    }
}
