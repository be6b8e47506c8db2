//! Counting what each client address (or account) has open at once
//! (connections, badge sockets, webhook bodies being read, dashboard tabs),
//! with a place given back when dropped.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// What each key has open now; a key with nothing open has no entry, so the
/// table is as large as the number of keys with something open.
#[derive(Debug)]
pub struct PerKey<K: Hash + Eq + Copy = IpAddr>(Mutex<HashMap<K, usize>>);

/// What each client address has open now.
pub type PerAddress = PerKey<IpAddr>;

/// One open thing's count for its key, given back when dropped (also when
/// what holds it is dropped unrun, so no path leaks a place).
#[derive(Debug)]
pub struct Place<K: Hash + Eq + Copy = IpAddr> {
    table: Arc<PerKey<K>>,
    address: K,
}

/// A place counted for a client address.
pub type AddressPlace = Place<IpAddr>;

impl<K: Hash + Eq + Copy> Default for PerKey<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<K: Hash + Eq + Copy> PerKey<K> {
    /// Counts one more for `address`; `None` when it already has `max`.
    pub fn take(self: &Arc<Self>, address: K, max: usize) -> Option<Place<K>> {
        let mut table = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let n = table.entry(address).or_insert(0);
        if *n >= max {
            if *n == 0 {
                table.remove(&address);
            }
            return None;
        }
        *n += 1;
        Some(Place {
            table: self.clone(),
            address,
        })
    }

    /// How many are open now, every address together.
    pub fn total(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .sum()
    }
}

impl<K: Hash + Eq + Copy> Drop for Place<K> {
    fn drop(&mut self) {
        let mut table = self.table.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = table.get_mut(&self.address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                table.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_has_its_own_count_and_gives_it_back() {
        let table = Arc::new(PerAddress::default());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = table.take(a, 2).unwrap();
        let second = table.take(a, 2).unwrap();
        assert!(table.take(a, 2).is_none(), "a is at its bound");
        let other = table.take(b, 2).unwrap();
        assert_eq!(table.total(), 3);
        drop(first);
        assert!(table.take(a, 2).is_some(), "a place came back");
        drop((second, other));
        assert_eq!(table.total(), 0);
        assert!(table.take(a, 0).is_none());
        assert!(table.0.lock().unwrap().is_empty(), "no entry left behind");
    }
}
