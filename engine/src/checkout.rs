//! The checkout rules that span Redis and PostgreSQL: how an API client's
//! `Idempotency-Key` names a reservation, which reservations a token may see, what
//! a paid confirm does after its hold ended, and how support finds a buyer's holds.

use sha2::{Digest, Sha256};

use crate::engine::valid_key_part;
use crate::error::EngineError;
use crate::model::{ConfirmOutcome, Hold};
use crate::{Backends, catalog, remediation};

/// The reservation id for `Idempotency-Key` `key` under API token `token_id`:
/// scoped per token, so two clients' keys never collide, and usable in Redis keys
/// and URLs (a key that is not is hashed).
pub fn reservation_id(token_id: i64, key: &str) -> String {
    if key.len() <= 100 && valid_key_part(key) {
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
pub async fn confirm_payment(b: &Backends, id: &str) -> Result<ConfirmOutcome, EngineError> {
    let outcome = b.engine.confirm(id).await?;
    if let ConfirmOutcome::Expired { state } = &outcome {
        remediation::record_late_payment(&b.pg, id, state.as_str()).await?;
    }
    Ok(outcome)
}

/// Reservation `query` if it exists, otherwise the open holds of buyer `query` on
/// the catalogue's drops (buyers are not indexed across SKUs; the drops' SKUs are
/// few, so their open holds are searched directly), each once.
pub async fn find_holds(b: &Backends, query: &str) -> Result<Vec<Hold>, EngineError> {
    let query = query.trim();
    if query.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(hold) = b.engine.hold(query).await? {
        return Ok(vec![hold]);
    }
    let mut seen = std::collections::HashSet::new();
    let mut holds = Vec::new();
    for sku in catalog::all_drop_skus(&b.pg).await? {
        for hold in b.engine.holds_of(&sku, 5_000).await? {
            if hold.buyer.as_deref() == Some(query) && seen.insert(hold.reservation_id.clone()) {
                holds.push(hold);
            }
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
    }
}
