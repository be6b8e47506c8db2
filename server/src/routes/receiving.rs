//! Memory for webhook bodies being read. A body is read whole before its
//! signature can be checked, so senders that start bodies and never finish
//! them would hold memory until each request's deadline (10,000 connections
//! of 2 MiB: 20 GiB). Bodies being read are bounded per sender and, in bytes,
//! all senders together; senders that delivered a verified webhook recently
//! read from a budget of their own, so senders with invented signatures
//! cannot shut the real ones out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::per_address::{AddressPlace, PerAddress};

/// How many of the largest webhook bodies may be read at once, in each of
/// the two budgets (senders not known yet; senders known). Past it a webhook
/// is 429 (`Retry-After: 1`) at once.
pub const BODIES_IN_FLIGHT: usize = 32;

/// How many webhook bodies a sender not known yet may have being read at
/// once, so that one cannot take every place of [`BODIES_IN_FLIGHT`].
pub const BODIES_PER_ADDRESS: usize = 4;

/// How many a known sender may have being read at once.
pub const BODIES_PER_KNOWN_ADDRESS: usize = 16;

/// How long a sender stays known after its last verified webhook.
pub const KNOWN_FOR: Duration = Duration::from_secs(3_600);

/// Most senders remembered as known (the longest unheard are forgotten).
const KNOWN_MAX: usize = 10_000;

/// The budgets and who is known.
#[derive(Debug)]
pub struct Receiving {
    unknown: Arc<Semaphore>,
    known_budget: Arc<Semaphore>,
    per_address: Arc<PerAddress>,
    known: Mutex<HashMap<IpAddr, Instant>>,
}

/// A body's places, given back when dropped.
#[derive(Debug)]
pub struct Reading {
    _place: AddressPlace,
    _bytes: OwnedSemaphorePermit,
}

impl Receiving {
    /// Budgets for bodies of at most `max_body` bytes.
    pub fn new(max_body: usize) -> Self {
        let bytes = BODIES_IN_FLIGHT
            .saturating_mul(max_body.max(1))
            .min(u32::MAX as usize);
        Self {
            unknown: Arc::new(Semaphore::new(bytes)),
            known_budget: Arc::new(Semaphore::new(bytes)),
            per_address: Arc::default(),
            known: Mutex::default(),
        }
    }

    /// Places for a body of `need` bytes from `address`; `None` when its
    /// sender, or its budget, is at its bound.
    pub fn admit(&self, address: IpAddr, need: usize) -> Option<Reading> {
        let known = self.is_known(address);
        let (max, budget) = if known {
            (BODIES_PER_KNOWN_ADDRESS, &self.known_budget)
        } else {
            (BODIES_PER_ADDRESS, &self.unknown)
        };
        let place = self.per_address.take(address, max)?;
        let bytes = budget
            .clone()
            .try_acquire_many_owned(u32::try_from(need.max(1)).unwrap_or(u32::MAX))
            .ok()?;
        Some(Reading {
            _place: place,
            _bytes: bytes,
        })
    }

    /// `address` delivered a verified webhook now.
    pub fn verified(&self, address: IpAddr) {
        let now = Instant::now();
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= KNOWN_MAX && !known.contains_key(&address) {
            known.retain(|_, at| now.duration_since(*at) < KNOWN_FOR);
            if known.len() >= KNOWN_MAX
                && let Some(oldest) = known.iter().min_by_key(|(_, at)| **at).map(|(a, _)| *a)
            {
                known.remove(&oldest);
            }
        }
        known.insert(address, now);
    }

    fn is_known(&self, address: IpAddr) -> bool {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&address)
            .is_some_and(|at| at.elapsed() < KNOWN_FOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_senders_read_from_a_budget_of_their_own() {
        let receiving = Receiving::new(1_000);
        let stranger = |i: u8| IpAddr::from([192, 0, 2, i]);
        let mut held = Vec::new();
        // Strangers: four each, BODIES_IN_FLIGHT in all.
        for i in 0..(BODIES_IN_FLIGHT / BODIES_PER_ADDRESS) as u8 {
            for _ in 0..BODIES_PER_ADDRESS {
                held.push(receiving.admit(stranger(i), 1_000).unwrap());
            }
            assert!(
                receiving.admit(stranger(i), 1).is_none(),
                "a fifth from one sender"
            );
        }
        assert!(
            receiving.admit(stranger(200), 1_000).is_none(),
            "the budget is spent"
        );
        // A sender that delivered a verified webhook still gets in, more at once.
        let provider = IpAddr::from([198, 51, 100, 7]);
        receiving.verified(provider);
        for _ in 0..BODIES_PER_KNOWN_ADDRESS {
            held.push(receiving.admit(provider, 1_000).unwrap());
        }
        assert!(receiving.admit(provider, 1).is_none());
        held.clear();
        assert!(
            receiving.admit(stranger(200), 1_000).is_some(),
            "places come back"
        );
    }
}
