//! Reservation attempts per SKU and second, for a drop report's peak attempts
//! per second: refusals count (sold out, over the buyer's limit, not started,
//! ended), those the sold-out memory answers without Redis too.
//!
//! Each server counts in memory (one map update per attempt, off Redis' path)
//! and adds its counts to PostgreSQL's `attempts` every second
//! ([`Attempts::flush`]), so the report sums every server's and is the same on
//! any. While PostgreSQL is down the counts wait in memory, at most
//! [`MAX_WAITING`] SKU-seconds (the oldest are dropped past that, and counted
//! as dropped).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::PgPool;

use crate::EngineError;

/// Most SKU-seconds kept waiting for PostgreSQL (about a minute of 1,000 busy
/// SKUs); more are dropped rather than grow without bound.
pub const MAX_WAITING: usize = 60_000;

/// Attempts counted and not yet in PostgreSQL.
#[derive(Debug, Default)]
pub struct Attempts {
    waiting: Mutex<HashMap<(String, i64), i64>>,
    dropped: AtomicU64,
}

impl Attempts {
    /// Counts one attempt at `sku` now.
    pub fn note(&self, sku: &str) {
        let second = chrono::Utc::now().timestamp();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = waiting.get_mut(&(sku.to_owned(), second)) {
            *n += 1;
        } else if waiting.len() < MAX_WAITING {
            waiting.insert((sku.to_owned(), second), 1);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Attempts not counted because too many waited for PostgreSQL.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Adds the waiting counts to PostgreSQL in one statement; on failure they
    /// wait for the next flush. Returns how many SKU-seconds were written.
    pub async fn flush(&self, pg: &PgPool) -> Result<u64, EngineError> {
        let taken = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        if taken.is_empty() {
            return Ok(0);
        }
        let (mut skus, mut seconds, mut counts) = (Vec::new(), Vec::new(), Vec::new());
        for ((sku, second), n) in &taken {
            skus.push(sku.as_str());
            seconds.push(*second as f64);
            counts.push(*n);
        }
        let written = sqlx::query(
            "INSERT INTO attempts (sku, at, n)
             SELECT sku, to_timestamp(at), n FROM UNNEST($1::text[], $2::float8[], $3::bigint[])
                    AS t(sku, at, n)
             ON CONFLICT (sku, at) DO UPDATE SET n = attempts.n + EXCLUDED.n",
        )
        .bind(&skus)
        .bind(&seconds)
        .bind(&counts)
        .execute(pg)
        .await;
        match written {
            Ok(done) => Ok(done.rows_affected()),
            Err(e) => {
                let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
                for (key, n) in taken {
                    if let Some(m) = waiting.get_mut(&key) {
                        *m += n;
                    } else if waiting.len() < MAX_WAITING {
                        waiting.insert(key, n);
                    } else {
                        self.dropped.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
                Err(e.into())
            }
        }
    }

    /// Deletes counts older than `days` days (the housekeeping loop's).
    pub async fn forget_older_than(pg: &PgPool, days: i32) -> Result<u64, EngineError> {
        Ok(
            sqlx::query("DELETE FROM attempts WHERE at < now() - make_interval(days => $1)")
                .bind(days)
                .execute(pg)
                .await?
                .rows_affected(),
        )
    }
}
