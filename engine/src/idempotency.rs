//! `Idempotency-Key` storage: the same key with the same request gets the stored
//! answer, status included; the same key with a different request is refused; a
//! key is claimed while its first request runs. Keys are scoped to the API token
//! and kept 24 hours in Redis ([`Keyspace::idempotency`]).
//!
//! Answers that invite a retry (5xx, 429, a drop not open: see
//! [`holdfast_domain::ErrorCode::kept_for_replay`]) are not stored: a client that
//! follows `Retry-After` with the same key gets the real outcome (for example a
//! 201 once a not-warmed SKU has been warmed), never a replay of the temporary
//! failure.
//!
//! A reservation in one shard needs none of this: `lua/reserve.lua` keeps its
//! answer in the hold itself (one round trip). Confirm and release keep a key
//! sent with them in the hold they act on ([`KeyUse`]): they are idempotent by
//! themselves, so the key only has to refuse another request under it, which
//! `lua/confirm.lua` and `lua/release.lua` do in the same call. The store
//! serves carts over several shards.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::Engine;
use crate::error::EngineError;
use crate::keys::Keyspace;

/// How long a key and its answer are kept.
pub const KEY_TTL_SECS: u64 = 24 * 3_600;
/// How long a key stays claimed by a request that is still running: past the
/// API's request deadline (3 s) the request has been answered, so a claim this
/// old belongs to an attempt that was cut off, and a retry may run.
const PENDING_TTL_SECS: u64 = 10;

/// What the store holds per key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    fp: String,
    status: Option<u16>,
    /// The answer as a tree: how records written before `text` hold it (read,
    /// never written; such a record lapses within [`KEY_TTL_SECS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<serde_json::Value>,
    /// The answer's JSON text as first sent, so that a replay is the same
    /// bytes (a tree would give its keys back in another order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    /// The last attempt failed in a way that invites a retry (5xx, 429): what it
    /// did is uncertain, so the retry must ask Redis rather than any shortcut.
    #[serde(default)]
    failed: bool,
}

impl Stored {
    /// The stored answer (status and JSON text), if the first request has
    /// been answered; a record written before `text` gives its tree's text.
    fn answer(self) -> Option<(u16, String)> {
        let text = self.text.or_else(|| self.body.map(|b| b.to_string()))?;
        Some((self.status?, text))
    }
}

/// What to do with a request carrying a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Begin {
    /// First use (or a retry after a failed attempt), now claimed: run it, then
    /// [`finish`]. `after_failure`: an earlier attempt with this key failed with a
    /// 5xx or 429 and may have done its work, so answers from memory (the
    /// sold-out cache) must not be used: only Redis knows.
    Fresh {
        /// An earlier attempt failed in a way that leaves its effect uncertain.
        after_failure: bool,
    },
    /// Seen before with the same request: answer with this status and JSON
    /// text (the first answer's bytes).
    Replay(u16, String),
    /// The key was used for a different request.
    Reused,
    /// The first request with this key is still running.
    InProgress,
}

/// An `Idempotency-Key` sent with a confirm or release, as the hold keeps it:
/// a hash field of the hold (`k:<token>:<key>`, so keys of different tokens
/// never meet) holding the request's fingerprint. The same key with the same
/// request is answered as the first was (the call is idempotent by itself);
/// with another request on that hold (the other action, another body) it is
/// refused with [`crate::EngineError::KeyReused`] and nothing moves. Kept as
/// long as the hold's record, and at least a tombstone's lifetime (24 hours
/// by default) from the key's last use. An answer given when Redis holds no
/// record of the reservation (unknown, or lost with Redis' data) has nowhere
/// to be kept: a retry asks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyUse {
    field: String,
    fp: String,
}

impl KeyUse {
    /// Key `key` of token `token_id`, sent with the request fingerprinted `fp`.
    pub fn new(token_id: i64, key: &str, fp: &str) -> Self {
        Self {
            field: format!("k:{token_id}:{key}"),
            fp: fp.to_owned(),
        }
    }

    /// The hold's hash field for the key.
    pub(crate) fn field(&self) -> &str {
        &self.field
    }

    /// The request's fingerprint.
    pub(crate) fn fp(&self) -> &str {
        &self.fp
    }

    /// The scripts' argument naming it (`key:<field> <fingerprint>`; a key
    /// is visible ASCII, so it has no space).
    pub(crate) fn arg(&self) -> String {
        format!("key:{} {}", self.field, self.fp)
    }
}

/// The fingerprint of a request: method, path and exact body.
pub fn fingerprint(method: &str, path: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(method.as_bytes());
    h.update(b" ");
    h.update(path.as_bytes());
    h.update(b"\n");
    h.update(body);
    hex::encode(h.finalize())
}

/// Claims `key` of token `token_id` for the request fingerprinted `fp`, or says
/// how to answer a repeat.
pub async fn begin(
    engine: &Engine,
    token_id: i64,
    key: &str,
    fp: &str,
) -> Result<Begin, EngineError> {
    let mut conn = engine.connection();
    let k = Keyspace::idempotency(token_id, key);
    let pending = |failed: bool| {
        serde_json::to_string(&Stored {
            fp: fp.to_owned(),
            status: None,
            body: None,
            text: None,
            failed,
        })
        .unwrap_or_default()
    };
    let claimed: Option<String> = redis::cmd("SET")
        .arg(&k)
        .arg(pending(false))
        .arg("NX")
        .arg("EX")
        .arg(PENDING_TTL_SECS)
        .query_async(&mut conn)
        .await?;
    if claimed.is_some() {
        return Ok(Begin::Fresh {
            after_failure: false,
        });
    }
    let raw: Option<String> = redis::cmd("GET").arg(&k).query_async(&mut conn).await?;
    let Some(stored) = raw.and_then(|r| serde_json::from_str::<Stored>(&r).ok()) else {
        // Lapsed between SET and GET: treat as new.
        return Ok(Begin::Fresh {
            after_failure: false,
        });
    };
    if stored.fp != fp {
        return Ok(Begin::Reused);
    }
    if stored.failed {
        // Claim it again for this retry, unless another retry just did.
        let swapped: Option<String> = redis::cmd("SET")
            .arg(&k)
            .arg(pending(false))
            .arg("XX")
            .arg("EX")
            .arg(PENDING_TTL_SECS)
            .arg("GET")
            .query_async(&mut conn)
            .await?;
        let was_failed = swapped
            .and_then(|r| serde_json::from_str::<Stored>(&r).ok())
            .is_some_and(|s| s.failed);
        return Ok(if was_failed {
            Begin::Fresh {
                after_failure: true,
            }
        } else {
            Begin::InProgress
        });
    }
    Ok(match stored.answer() {
        Some((status, text)) => Begin::Replay(status, text),
        None => Begin::InProgress,
    })
}

/// Stores the answer to `key` (`status` and the JSON text `body`) when it is `kept` (see
/// [`holdfast_domain::ErrorCode::kept_for_replay`]); otherwise marks the key as
/// failed so the retry runs again and asks Redis itself. A failure to store is logged, not returned: the caller's answer
/// stands, and a retry will simply run again.
pub async fn finish(
    engine: &Engine,
    token_id: i64,
    key: &str,
    fp: &str,
    status: u16,
    body: &str,
    kept: bool,
) {
    let mut conn = engine.connection();
    let k = Keyspace::idempotency(token_id, key);
    let result = if !kept {
        let failed = Stored {
            fp: fp.to_owned(),
            status: None,
            body: None,
            text: None,
            failed: true,
        };
        redis::cmd("SET")
            .arg(&k)
            .arg(serde_json::to_string(&failed).unwrap_or_default())
            .arg("EX")
            .arg(KEY_TTL_SECS)
            .query_async::<()>(&mut conn)
            .await
    } else {
        let stored = Stored {
            fp: fp.to_owned(),
            status: Some(status),
            body: None,
            text: Some(body.to_owned()),
            failed: false,
        };
        redis::cmd("SET")
            .arg(&k)
            .arg(serde_json::to_string(&stored).unwrap_or_default())
            .arg("EX")
            .arg(KEY_TTL_SECS)
            .query_async::<()>(&mut conn)
            .await
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not store an idempotent answer; a retry will run again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_kept_as_its_text_and_an_older_record_still_replays() {
        let text = r#"{"id":"r1","state":"held","available_after":3}"#;
        let record = Stored {
            fp: "f".into(),
            status: Some(201),
            body: None,
            text: Some(text.into()),
            failed: false,
        };
        let written = serde_json::to_string(&record).unwrap();
        assert!(!written.contains("\"body\""), "{written}");
        let read: Stored = serde_json::from_str(&written).unwrap();
        assert_eq!(read.answer(), Some((201, text.to_owned())));

        let older = r#"{"fp":"f","status":201,"body":{"b":1,"a":2},"failed":false}"#;
        let read: Stored = serde_json::from_str(older).unwrap();
        assert_eq!(read.answer(), Some((201, r#"{"a":2,"b":1}"#.to_owned())));

        let pending = r#"{"fp":"f","status":null,"failed":false}"#;
        let read: Stored = serde_json::from_str(pending).unwrap();
        assert_eq!(read.answer(), None, "claimed, not answered yet");
    }
}
