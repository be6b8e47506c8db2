//! Redis: connecting with a self-healing connection and refusing evicting policies.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::{EngineError, redact_url};
use crate::postgres::one_line;

/// What Redis said about memory eviction, as checked at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionCheck {
    /// `noeviction`: Redis refuses writes rather than delete anything.
    Safe(String),
    /// An evicting policy (`allkeys-*` or `volatile-*`), accepted only because
    /// the operator overrode the check.
    Overridden(String),
    /// `CONFIG GET` is not allowed (some managed services): the policy is unknown.
    Unknown(String),
}

/// Opens a [`ConnectionManager`] to `url`, which reconnects by itself after Redis
/// restarts, and proves the server answers `PING` before returning.
pub async fn connect(url: &str) -> Result<ConnectionManager, EngineError> {
    let unreachable = |reason: String| EngineError::RedisUnreachable {
        url: redact_url(url),
        reason,
    };
    let client = redis::Client::open(url).map_err(|e| unreachable(one_line(&e.to_string())))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    let mut conn = ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| unreachable(one_line(&e.to_string())))?;
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .map_err(|e| unreachable(one_line(&e.to_string())))?;
    Ok(conn)
}

/// Reads `maxmemory-policy` and refuses anything but `noeviction` unless
/// `allow_evicting` is set.
///
/// Under an `allkeys-*` policy Redis may delete a stock counter under memory
/// pressure; a deleted counter reads as "not warmed" and a deleted hold leaks
/// reserved units. A `volatile-*` policy spares the counters but deletes keys
/// with a lifetime: feed event guards (a redelivered event applies twice),
/// per-buyer counters (the limit is lifted), ended-hold tombstones (a retry
/// holds stock twice) and lock leases. Both are start-up errors, not warnings.
pub async fn check_eviction_policy(
    conn: &mut ConnectionManager,
    url: &str,
    allow_evicting: bool,
) -> Result<EvictionCheck, EngineError> {
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await;
    let policy = match reply {
        Ok(pair) if pair.len() == 2 => pair[1].clone(),
        Ok(other) => {
            return Ok(EvictionCheck::Unknown(format!(
                "unexpected reply {other:?}"
            )));
        }
        Err(e) => return Ok(EvictionCheck::Unknown(one_line(&e.to_string()))),
    };
    if policy == "noeviction" {
        return Ok(EvictionCheck::Safe(policy));
    }
    if allow_evicting {
        return Ok(EvictionCheck::Overridden(policy));
    }
    Err(EngineError::EvictingRedis {
        url: redact_url(url),
        policy,
    })
}

/// Whether Redis answers `PING` within `timeout`.
pub async fn ping(conn: &ConnectionManager, timeout: Duration) -> Result<(), String> {
    let mut conn = conn.clone();
    let cmd = redis::cmd("PING");
    match tokio::time::timeout(timeout, cmd.query_async::<String>(&mut conn)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(one_line(&e.to_string())),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// Creates consumer group `group` on `stream` (and the stream), doing nothing if
/// it exists. Needed again after Redis loses its data.
pub async fn ensure_group(
    conn: &mut ConnectionManager,
    stream: &str,
    group: &str,
) -> Result<(), EngineError> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(e) if e.code() != Some("BUSYGROUP") => Err(e.into()),
        _ => Ok(()),
    }
}
