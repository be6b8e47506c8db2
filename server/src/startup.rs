//! Connecting to Redis and PostgreSQL at start-up, with checks that fail in one
//! readable line.

use holdfast_engine::kv::{self, EvictionCheck};
use holdfast_engine::{Backends, EngineConfig, EngineError, redact_url, store};

/// Connects to Redis (checking its eviction policy) and PostgreSQL (creating the
/// database and migrating it), in that order.
pub async fn connect(
    redis_url: &str,
    database_url: &str,
    allow_evicting_redis: bool,
    pg_max_connections: u32,
    engine: EngineConfig,
) -> Result<Backends, EngineError> {
    let mut redis = kv::connect(redis_url).await?;
    match kv::check_eviction_policy(&mut redis, redis_url, allow_evicting_redis).await? {
        EvictionCheck::Safe(policy) => tracing::debug!(%policy, "Redis eviction policy is safe"),
        EvictionCheck::Overridden(policy) => tracing::warn!(
            %policy,
            url = %redact_url(redis_url),
            "Redis may evict stock counters; running anyway because --allow-evicting-redis was given"
        ),
        EvictionCheck::Unknown(reason) => tracing::warn!(
            %reason,
            "could not read Redis' maxmemory-policy; make sure it is noeviction or volatile-*"
        ),
    }
    let pg = store::connect_and_migrate(database_url, pg_max_connections).await?;
    Ok(Backends::new(pg, redis, engine))
}
