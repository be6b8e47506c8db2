//! Per-process token-bucket rate limits: a refusal says how many seconds to
//! wait (the server answers 429 with `Retry-After`).
//!
//! API calls are limited per token, webhooks per source: both are identities the
//! server has verified, so a client cannot dodge its limit by changing address,
//! and shoppers behind one NAT do not share one. What costs PostgreSQL before
//! any identity is known (invented API tokens, invented session cookies) is
//! limited per client address.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Instant;

/// Default requests per second per API token.
pub const DEFAULT_TOKEN_RATE: u32 = 20_000;
/// Default webhooks per second per source.
pub const DEFAULT_SOURCE_RATE: u32 = 200;

/// A refill rate and burst size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    /// Sustained requests per second.
    pub per_sec: f64,
    /// Most requests at once after a quiet spell.
    pub burst: f64,
}

impl Limit {
    /// `per_sec` sustained with a burst of twice that (at least 1).
    pub fn per_second(per_sec: u32) -> Self {
        Self {
            per_sec: f64::from(per_sec),
            burst: f64::from(per_sec.max(1)) * 2.0,
        }
    }
}

/// Buckets by key (a token's id, a client's address, a name): typed, so the
/// hot path checks a bucket without formatting or allocating a key.
#[derive(Debug)]
pub struct RateLimiter<K = String> {
    limit: Limit,
    buckets: Mutex<HashMap<K, (f64, Instant)>>,
}

impl<K: Hash + Eq> RateLimiter<K> {
    /// A limiter applying `limit` to every key.
    pub fn new(limit: Limit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `key`'s bucket; `Err(seconds)` to wait when empty.
    pub fn check<Q>(&self, key: &Q) -> Result<(), u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.holds_one(key, true)
    }

    /// Whether `key`'s bucket holds a request, without taking it: for work
    /// that counts only by its outcome ([`RateLimiter::charge`] afterwards),
    /// so that what does not count never waits on what does.
    pub fn admits<Q>(&self, key: &Q) -> Result<(), u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.holds_one(key, false)
    }

    /// Whether `key`'s bucket holds a request (taken when `take`).
    fn holds_one<Q>(&self, key: &Q, take: bool) -> Result<(), u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with_bucket(key, Ok(()), |limit, tokens| {
            if *tokens < 1.0 {
                return Err(limit.wait_for(*tokens));
            }
            if take {
                *tokens -= 1.0;
            }
            Ok(())
        })
    }

    /// Takes one request from `key`'s bucket after the fact (a session cookie
    /// that turned out not to be live). Requests [`RateLimiter::admits`] let
    /// through at once may leave the bucket in debt, down to one burst below
    /// empty, which later requests wait off. Requests admitted together are
    /// not bounded by this: each is charged only after it has run.
    pub fn charge<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with_bucket(key, (), |limit, tokens| {
            *tokens = (*tokens - 1.0).max(-limit.burst);
        });
    }

    /// Runs `f` on `key`'s bucket refilled to now (a new key starts full); an
    /// unlimited limiter, or a poisoned lock, answers `unlimited` instead.
    fn with_bucket<Q, T>(&self, key: &Q, unlimited: T, f: impl FnOnce(Limit, &mut f64) -> T) -> T
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if self.limit.per_sec <= 0.0 {
            return unlimited;
        }
        let Ok(mut buckets) = self.buckets.lock() else {
            return unlimited;
        };
        let now = Instant::now();
        if buckets.len() > 100_000 {
            let burst = self.limit.burst;
            let rate = self.limit.per_sec;
            buckets.retain(|_, (tokens, at)| *tokens + at.elapsed().as_secs_f64() * rate < burst);
        }
        // A key is copied only the first time it is seen.
        if !buckets.contains_key(key) {
            buckets.insert(key.to_owned(), (self.limit.burst, now));
        }
        let Some((tokens, at)) = buckets.get_mut(key) else {
            return unlimited;
        };
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.limit.per_sec)
            .min(self.limit.burst);
        *at = now;
        f(self.limit, tokens)
    }
}

impl Limit {
    /// Whole seconds until a bucket holding `tokens` holds one (at least 1).
    fn wait_for(self, tokens: f64) -> u64 {
        ((1.0 - tokens) / self.per_sec).ceil().max(1.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_the_burst_then_refuses_then_refills() {
        let limiter = RateLimiter::new(Limit {
            per_sec: 20.0,
            burst: 3.0,
        });
        assert!((0..3).all(|_| limiter.check("a").is_ok()));
        assert_eq!(limiter.check("a"), Err(1));
        assert!(limiter.check("b").is_ok(), "keys are independent");
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert!(limiter.check("a").is_ok(), "refilled");
        assert!(
            RateLimiter::new(Limit::per_second(0)).check("x").is_ok(),
            "0 means unlimited"
        );
    }

    #[test]
    fn only_what_is_charged_counts_and_debt_is_waited_off() {
        let limiter = RateLimiter::new(Limit {
            per_sec: 0.001,
            burst: 2.0,
        });
        assert!(
            (0..10).all(|_| limiter.admits("a").is_ok()),
            "admitting takes nothing"
        );
        limiter.charge("a");
        limiter.charge("a");
        assert!(limiter.admits("a").is_err(), "two charged: empty");
        for _ in 0..10 {
            limiter.charge("a");
        }
        assert_eq!(
            limiter.admits("a"),
            Err(3000),
            "debt stops one burst below empty: 3 requests to refill at 0.001/s"
        );
        assert!(limiter.admits("b").is_ok(), "keys are independent");
        let quick = RateLimiter::new(Limit {
            per_sec: 50.0,
            burst: 1.0,
        });
        quick.charge("a");
        quick.charge("a");
        assert!(quick.admits("a").is_err(), "in debt");
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert!(quick.admits("a").is_ok(), "the debt is waited off");
    }
}
