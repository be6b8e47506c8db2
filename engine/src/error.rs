//! The engine's error type and how a connection URL is shown without its secrets.

use thiserror::Error;

/// Everything that can go wrong below the API layer.
///
/// Variants say which backing service failed so callers can map them to a status
/// (`503` for an unavailable dependency) and operators know where to look.
#[derive(Debug, Error)]
pub enum EngineError {
    /// PostgreSQL could not be reached at start-up.
    #[error(
        "cannot reach PostgreSQL at {url}: {reason}. Start PostgreSQL or set DATABASE_URL to a server that answers"
    )]
    PostgresUnreachable {
        /// The URL tried, with any password removed.
        url: String,
        /// The driver's own explanation, as one line.
        reason: String,
    },
    /// Redis could not be reached at start-up.
    #[error(
        "cannot reach Redis at {url}: {reason}. Start redis-server or set REDIS_URL to a server that answers"
    )]
    RedisUnreachable {
        /// The URL tried, with any password removed.
        url: String,
        /// The driver's own explanation, as one line.
        reason: String,
    },
    /// Redis is configured so that it may evict stock counters under memory pressure.
    #[error(
        "Redis at {url} has maxmemory-policy '{policy}', which may evict stock counters and make \
         sold-out SKUs look unwarmed, lose holds, or forget the guards that stop a feed event or a \
         retry applying twice. Set `maxmemory-policy noeviction`, or pass --allow-evicting-redis to \
         start anyway"
    )]
    EvictingRedis {
        /// The URL checked, with any password removed.
        url: String,
        /// The policy Redis reported.
        policy: String,
    },
    /// Applying the schema migrations failed.
    #[error("cannot migrate the database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A PostgreSQL query failed after start-up.
    #[error("PostgreSQL error: {0}")]
    Postgres(#[from] sqlx::Error),
    /// A Redis command failed after start-up.
    #[error("Redis error: {0}")]
    Redis(#[from] redis::RedisError),
    /// A drop file was committed to PostgreSQL, but bringing its live
    /// counters along failed (Redis or PostgreSQL failing meanwhile). Nothing
    /// is lost: every running server finishes it by itself, or the same
    /// import again does.
    #[error(
        "the drop was saved in PostgreSQL, but its live counters are not all updated yet ({0});          every running server finishes that by itself within a minute, or import the same file          again"
    )]
    SavedNotLive(Box<EngineError>),
    /// A payment was recorded on the master, but fewer replicas than asked
    /// (`--confirm-replicas`) acknowledged it in time: it is not answered as
    /// paid, since losing the master now would lose it. A retry waits again.
    #[error(
        "the payment waits for {wanted} Redis replica(s) to acknowledge it; {acked} did within \
         {timeout_ms} ms{reason}. Retry shortly"
    )]
    ReplicasBehind {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acked: i64,
        /// How long the round waited.
        timeout_ms: u64,
        /// Why the round failed, when it did (with a leading `: `), else empty.
        reason: String,
    },
    /// The work is already being done elsewhere (its lock is held).
    #[error("{0}")]
    Busy(String),
    /// An `Idempotency-Key` sent with a confirm or release was kept for another
    /// request on the same reservation (its other action, or another body):
    /// nothing was done.
    #[error(
        "this Idempotency-Key was used with a different request; use a new key for a new request"
    )]
    KeyReused,
    /// A write under a lock carried a fencing token older than one already seen:
    /// this holder's lease lapsed and another holder has written since.
    #[error(
        "refused a write under lock '{lock}' with stale fencing token {token}: a later holder has written"
    )]
    StaleFence {
        /// The lock.
        lock: String,
        /// The stale token.
        token: i64,
    },
    /// The lease on a lock was lost mid-run (it lapsed and was not renewed in time).
    #[error("lost the '{0}' lock mid-run; stopped before writing anything more")]
    LeaseLost(String),
    /// Too many attempts: retry after `retry_after` seconds.
    #[error("{reason}; retry in {retry_after} s")]
    Throttled {
        /// Why.
        reason: String,
        /// Seconds until a retry may succeed.
        retry_after: u64,
    },
    /// A script answered something this version does not understand (a mismatch
    /// between `lua/` and the code, or keys edited by hand).
    #[error("unexpected reply from Redis: {0}")]
    UnexpectedReply(String),
    /// Settings that cannot work together on this deployment (refused at
    /// start-up, saying which and why).
    #[error("{0}")]
    Unsupported(String),
}

impl EngineError {
    /// The code a caller is answered with: a backing service that failed is
    /// `unavailable` (retry shortly), work already running elsewhere is `busy`,
    /// anything else is `internal`. The HTTP API and the server functions both
    /// map engine errors through this one rule.
    pub fn code(&self) -> holdfast_domain::ErrorCode {
        use holdfast_domain::ErrorCode;
        match self {
            Self::Postgres(_)
            | Self::Redis(_)
            | Self::PostgresUnreachable { .. }
            | Self::RedisUnreachable { .. }
            | Self::ReplicasBehind { .. }
            | Self::SavedNotLive(_) => ErrorCode::Unavailable,
            Self::Busy(_) => ErrorCode::Busy,
            Self::KeyReused => ErrorCode::IdempotencyKeyReused,
            Self::Throttled { .. } => ErrorCode::RateLimited,
            _ => ErrorCode::Internal,
        }
    }

    /// Whether the fault lies in the input rather than in a backing service:
    /// a script or PostgreSQL refused this very data (a script error, a key of
    /// the wrong type, a data exception or constraint violation, a reply this
    /// version cannot read). Retrying the same input cannot succeed, so a
    /// worker sets such input aside instead of retrying it forever; an outage
    /// (unreachable, timed out, loading, out of memory, busy) is retried.
    pub fn refused_input(&self) -> bool {
        match self {
            Self::Postgres(sqlx::Error::Database(db)) => db
                .code()
                .is_some_and(|c| c.starts_with("22") || c.starts_with("23")),
            Self::Redis(e) => {
                matches!(
                    e.kind(),
                    redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
                        | redis::ErrorKind::UnexpectedReturnType
                        | redis::ErrorKind::Parse
                ) || e.code() == Some("WRONGTYPE")
            }
            Self::UnexpectedReply(_) => true,
            _ => false,
        }
    }

    /// Seconds after which a retry may succeed (`Retry-After`): the wait a
    /// throttle names, otherwise the code's own hint.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::Throttled { retry_after, .. } => Some(*retry_after),
            _ => self.code().retry_after(),
        }
    }
}

/// Returns `url` with any password replaced by `***`, for logs and error messages.
///
/// Unparseable input is returned unchanged: it holds no recognisable secret to hide
/// and the operator needs to see what they typed.
pub fn redact_url(url: &str) -> String {
    // libpq's key=value form: `host=db password=… user=app`.
    if !url.contains(':') || (!url.contains("://") && url.contains('=') && url.contains(' ')) {
        return redact_params(url, ' ');
    }
    let Some((scheme, rest)) = url.split_once(':') else {
        return url.to_owned();
    };
    // Any number of slashes after the scheme (`postgres:/…` is accepted too).
    let slashes = rest.len() - rest.trim_start_matches('/').len();
    let (lead, rest) = rest.split_at(slashes);
    // The user information ends at the last `@` before the host: a password
    // may itself hold `/`, `?` or `@`, so the first of those is no boundary.
    let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest
        .rfind('@')
        .filter(|at| rest[..*at].contains(':') || *at < host_end);
    let (userinfo, after) = match at {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let userinfo = userinfo.map(|u| match u.split_once(':') {
        Some((user, _password)) => format!("{user}:***@"),
        None => format!("{u}@"),
    });
    let after = match after.split_once('?') {
        Some((path, query)) => format!("{path}?{}", redact_params(query, '&')),
        None => after.to_owned(),
    };
    format!("{scheme}:{lead}{}{after}", userinfo.unwrap_or_default())
}

/// `params` (separated by `sep`) with the value of every password-like key
/// replaced by `***`.
fn redact_params(params: &str, sep: char) -> String {
    params
        .split(sep)
        .map(|kv| match kv.split_once('=') {
            Some((k, _))
                if matches!(
                    k.trim().to_ascii_lowercase().as_str(),
                    "password" | "pass" | "passwd" | "pwd" | "sslpassword" | "secret"
                ) =>
            {
                format!("{k}=***")
            }
            _ => kv.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(&sep.to_string())
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn hides_passwords_and_keeps_the_rest() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/holdfast"),
            "postgres://app:***@db:5432/holdfast"
        );
        assert_eq!(
            redact_url("redis://:pw@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn hides_every_password_form_the_drivers_accept() {
        for (url, shown) in [
            (
                "postgres://postgres@127.0.0.1:5432/db?password=S3CRET",
                "postgres://postgres@127.0.0.1:5432/db?password=***",
            ),
            (
                "postgres://postgres:S3CRET/slash@127.0.0.1:5432/db",
                "postgres://postgres:***@127.0.0.1:5432/db",
            ),
            (
                "postgres://postgres:S3CRET?q@127.0.0.1/db",
                "postgres://postgres:***@127.0.0.1/db",
            ),
            ("redis://user:S3CRET/sl@h:6379", "redis://user:***@h:6379"),
            ("redis://:S3CRET?x@h:6379", "redis://:***@h:6379"),
            (
                "redis://127.0.0.1:6499/?password=S3CRET",
                "redis://127.0.0.1:6499/?password=***",
            ),
            (
                "redis+unix:///tmp/x.sock?pass=S3CRET",
                "redis+unix:///tmp/x.sock?pass=***",
            ),
            (
                "postgres:/postgres:S3CRET@127.0.0.1:5432/db",
                "postgres:/postgres:***@127.0.0.1:5432/db",
            ),
            (
                "host=db password=S3CRET user=app",
                "host=db password=*** user=app",
            ),
            ("redis://:p@ss@h:6379/0", "redis://:***@h:6379/0"),
        ] {
            let got = redact_url(url);
            assert_eq!(got, shown, "{url}");
            assert!(!got.contains("S3CRET"), "{got}");
        }
    }
}
