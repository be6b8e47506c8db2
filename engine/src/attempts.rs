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

/// Counts waiting, per SKU then per Unix second (a SKU is looked up by `&str`,
/// so counting an attempt allocates nothing once its SKU is known).
#[derive(Debug, Default)]
struct Waiting {
    by_sku: HashMap<String, HashMap<i64, i64>>,
    /// SKU-seconds in `by_sku` (bounded by [`MAX_WAITING`]).
    entries: usize,
}

/// Attempts counted and not yet in PostgreSQL.
#[derive(Debug, Default)]
pub struct Attempts {
    waiting: Mutex<Waiting>,
    dropped: AtomicU64,
}

impl Attempts {
    /// Counts one attempt at `sku` now.
    pub fn note(&self, sku: &str) {
        let second = chrono::Utc::now().timestamp();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        self.add(&mut waiting, sku, second, 1);
    }

    /// Adds `n` attempts at `sku` in `second`, within [`MAX_WAITING`]
    /// SKU-seconds (beyond it they are counted as dropped).
    fn add(&self, waiting: &mut Waiting, sku: &str, second: i64, n: i64) {
        if let Some(count) = waiting.by_sku.get_mut(sku).and_then(|s| s.get_mut(&second)) {
            *count += n;
        } else if waiting.entries < MAX_WAITING {
            waiting.entries += 1;
            if let Some(seconds) = waiting.by_sku.get_mut(sku) {
                seconds.insert(second, n);
            } else {
                waiting
                    .by_sku
                    .insert(sku.to_owned(), HashMap::from([(second, n)]));
            }
        } else {
            self.dropped.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Attempts not counted because too many waited for PostgreSQL.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Adds the waiting counts to PostgreSQL in one statement; on failure they
    /// wait for the next flush. Returns how many SKU-seconds were written.
    pub async fn flush(&self, pg: &PgPool) -> Result<u64, EngineError> {
        let taken =
            std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner())).by_sku;
        if taken.is_empty() {
            return Ok(0);
        }
        let (mut skus, mut seconds, mut counts) = (Vec::new(), Vec::new(), Vec::new());
        for (sku, per_second) in &taken {
            for (second, n) in per_second {
                skus.push(sku.as_str());
                seconds.push(*second as f64);
                counts.push(*n);
            }
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
                for (sku, per_second) in &taken {
                    for (second, n) in per_second {
                        self.add(&mut waiting, sku, *second, *n);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Past [`MAX_WAITING`] SKU-seconds new ones are dropped and counted as
    /// such; a SKU-second already waiting still counts.
    #[test]
    fn waiting_counts_are_bounded() {
        // One fixed second, so the clock turning over cannot add SKU-seconds.
        let attempts = Attempts::default();
        let mut waiting = Waiting::default();
        for i in 0..MAX_WAITING + 5 {
            attempts.add(&mut waiting, &format!("SKU-{i}"), 7, 1);
        }
        attempts.add(&mut waiting, "SKU-0", 7, 1);
        assert_eq!(attempts.dropped(), 5);
        assert_eq!(waiting.by_sku["SKU-0"][&7], 2);
    }

    /// With PostgreSQL unreachable a flush fails and the counts wait for the
    /// next one, none lost.
    #[tokio::test]
    async fn counts_wait_while_postgresql_is_down() {
        let attempts = Attempts::default();
        for _ in 0..3 {
            attempts.note("DOWN-1");
        }
        let closed = crate::testkit::closed_port();
        let port = closed.port();
        let pg = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(std::time::Duration::from_millis(200))
            .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/none"))
            .unwrap();
        assert!(attempts.flush(&pg).await.is_err());
        let waiting = attempts.waiting.lock().unwrap();
        let counted: i64 = waiting.by_sku["DOWN-1"].values().sum();
        assert_eq!((counted, waiting.entries <= 2), (3, true));
    }
}
