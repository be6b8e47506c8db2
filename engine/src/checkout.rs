//! The checkout rules that span Redis and PostgreSQL: how an API client's
//! `Idempotency-Key` names a reservation, which reservations a token may see, what
//! a paid confirm does after its hold ended, and how support finds a buyer's holds.

use sha2::{Digest, Sha256};

use crate::engine::valid_key_part;
use crate::error::EngineError;
use crate::model::{ConfirmOutcome, Hold, HoldState, Line};
use crate::{Backends, catalog, remediation};

/// The reservation id for `Idempotency-Key` `key` under API token `token_id`:
/// scoped per token, so two clients' keys never collide, and usable in Redis keys
/// and URLs (a key that is not is hashed, and so is a key that looks like a
/// hashed one, so that no key can name another key's reservation).
pub fn reservation_id(token_id: i64, key: &str) -> String {
    let looks_hashed =
        key.len() == 33 && key.starts_with('h') && key[1..].bytes().all(|b| b.is_ascii_hexdigit());
    if key.len() <= 100 && valid_key_part(key) && !looks_hashed {
        format!("t{token_id}-{key}")
    } else {
        format!(
            "t{token_id}-h{}",
            &hex::encode(Sha256::digest(key.as_bytes()))[..32]
        )
    }
}

/// Whether reservation `id` was made through API token `token_id`: a token only
/// sees its own reservations.
pub fn made_by(id: &str, token_id: i64) -> bool {
    id.strip_prefix(&format!("t{token_id}-"))
        .is_some_and(|rest| !rest.is_empty())
}

/// Confirms (records the payment of) reservation `id`. A payment for a hold that
/// had already ended takes no stock and leaves a remediation record (refund or
/// re-reserve) for support; a repeated late confirm records nothing more.
///
/// When Redis does not know `id`, the system of record decides: an order for it
/// means it was confirmed before Redis lost it ([`ConfirmOutcome::AlreadyConfirmed`]);
/// a hold PostgreSQL saw made means Redis lost it: no stock is taken and a
/// remediation with its buyer and lines is recorded ([`ConfirmOutcome::Lost`]).
///
/// The reservation as it stands afterwards comes with the outcome when Redis
/// knows it (read in the same calls). `key`: the `Idempotency-Key` the payment
/// came with, kept in the hold ([`crate::idempotency::KeyUse`]).
pub async fn confirm_payment(
    b: &Backends,
    id: &str,
    key: Option<&crate::idempotency::KeyUse>,
) -> Result<(ConfirmOutcome, Option<Hold>), EngineError> {
    let (outcome, shown) = b.engine.confirm_showing(id, key).await?;
    match &outcome {
        ConfirmOutcome::Expired { state } => {
            // Kept in Redis' stream first, so PostgreSQL being down loses nothing:
            // the write-behind records it. Recorded directly too when PostgreSQL
            // answers at once, so support sees it without waiting.
            b.engine.note_late_payment(id, *state).await?;
            if let Err(e) =
                crate::postgres::quick(remediation::record_late_payment(&b.pg, id, state.as_str()))
                    .await
            {
                tracing::warn!(reservation = %id, error = %e,
                    "late payment kept in the event stream; the write-behind records it");
            }
        }
        // Redis still remembers who owns the id, so it did not lose the hold:
        // there was none for its owner (a refusal, or an undone conflict), or
        // it was paid and its record has lapsed (the id's claim outlives it
        // by the longest hold): then the order says so.
        ConfirmOutcome::Unknown if b.engine.id_claimed(id).await? => {
            let paid = remediation::ordered(&b.pg, id).await?;
            let outcome = if paid {
                ConfirmOutcome::AlreadyConfirmed
            } else {
                ConfirmOutcome::Unknown
            };
            return Ok((outcome, None));
        }
        ConfirmOutcome::Unknown => {
            return Ok((remediation::confirm_unknown(&b.pg, id).await?, None));
        }
        _ => {}
    }
    Ok((outcome, shown))
}

impl Backends {
    /// `(sku, owed)` for every SKU of the drops that owes units: a feed lowered
    /// its stock below what open holds keep.
    pub async fn owed_units(&self) -> Result<Vec<(String, i64)>, EngineError> {
        let skus = catalog::all_drop_skus(&self.pg).await?;
        let figures = self.engine.figures_many(&skus).await?;
        Ok(skus
            .into_iter()
            .zip(figures)
            .filter_map(|(sku, f)| f.filter(|f| f.owed > 0).map(|f| (sku, f.owed)))
            .collect())
    }
}

/// Reservation `id` as Redis holds it or, when Redis no longer knows it (its
/// tombstone lapsed, or Redis lost its data), as the system of record has it: a
/// recorded order is a confirmed reservation with its lines. `None` when neither
/// knows it. (PostgreSQL is asked only when Redis does not know the id.)
pub async fn find_reservation(b: &Backends, id: &str) -> Result<Option<Hold>, EngineError> {
    if let Some(hold) = b.engine.hold(id).await? {
        return Ok(Some(hold));
    }
    let lines: Vec<(String, i64, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT l.sku, l.qty, o.confirmed_at FROM orders o
           JOIN order_lines l ON l.reservation_id = o.reservation_id
          WHERE o.reservation_id = $1 ORDER BY l.sku",
    )
    .bind(id)
    .fetch_all(&b.pg)
    .await?;
    let Some((_, _, at)) = lines.first().cloned() else {
        return Ok(None);
    };
    let buyer: Option<String> = sqlx::query_scalar(
        "SELECT buyer FROM holds WHERE reservation_id = $1 AND buyer IS NOT NULL AND buyer <> '' LIMIT 1",
    )
    .bind(id)
    .fetch_optional(&b.pg)
    .await?;
    Ok(Some(Hold {
        reservation_id: id.to_owned(),
        state: HoldState::Confirmed,
        lines: lines
            .into_iter()
            .map(|(sku, qty, _)| Line { sku, qty })
            .collect(),
        buyer,
        expires_at_ms: at.timestamp_millis(),
        created_at_ms: at.timestamp_millis(),
    }))
}

/// Most holds a buyer search returns (newest first).
pub const MAX_FOUND_HOLDS: i64 = 200;

/// The live holds `query` names: the reservation with that id, or the holds of
/// the buyer with that name (from PostgreSQL's index of recorded holds, newest
/// first, at most [`MAX_FOUND_HOLDS`], each read back from Redis so only live
/// ones, held or being confirmed, are shown). A search costs one index lookup and a bounded number of
/// reads however often it runs; a hold appears once the write-behind has
/// recorded it (within about a second).
pub async fn find_holds(b: &Backends, query: &str) -> Result<Vec<Hold>, EngineError> {
    let query = query.trim();
    if query.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(hold) = b.engine.hold(query).await? {
        return Ok(vec![hold]);
    }
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT reservation_id FROM holds WHERE buyer = $1
          GROUP BY reservation_id ORDER BY max(created_at) DESC LIMIT $2",
    )
    .bind(query)
    .bind(MAX_FOUND_HOLDS)
    .fetch_all(&b.pg)
    .await?;
    let mut holds = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(hold) = b.engine.hold(&id).await?
            && matches!(hold.state, HoldState::Held | HoldState::Confirming)
        {
            holds.push(hold);
        }
    }
    Ok(holds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_ids_are_scoped_and_safe() {
        assert_eq!(reservation_id(7, "order-1"), "t7-order-1");
        let hashed = reservation_id(7, "has space");
        assert!(hashed.starts_with("t7-h") && valid_key_part(&hashed));
        assert!(made_by("t7-order-1", 7));
        assert!(!made_by("t71-order-1", 7));
        assert!(!made_by("t7-", 7));
        // A key spelled like a long key's hash is hashed too: no collision.
        let long = "a".repeat(255);
        let spelled = reservation_id(7, &long)["t7-".len()..].to_owned();
        assert_ne!(reservation_id(7, &spelled), reservation_id(7, &long));
    }
}
