//! API tokens: created and revoked by operators, shown once, stored as SHA-256.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::error::EngineError;

pub use holdfast_domain::Scope;

/// A token as listed (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// Its id.
    pub id: i64,
    /// A name for people ("checkout-prod").
    pub name: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
    /// When it was created.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl TokenInfo {
    /// Whether the token carries `scope`.
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }
}

/// A token just created: the only time its secret is available.
#[derive(Debug, Clone)]
pub struct NewToken {
    /// The stored record.
    pub info: TokenInfo,
    /// The bearer secret, `hf_…`; show it once and forget it.
    pub secret: String,
}

/// SHA-256 of a bearer secret, as stored.
pub fn digest(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

type Row = (
    i64,
    String,
    Vec<String>,
    chrono::DateTime<chrono::Utc>,
    Option<chrono::DateTime<chrono::Utc>>,
);

fn info((id, name, scopes, created_at, revoked_at): Row) -> TokenInfo {
    TokenInfo {
        id,
        name,
        scopes: scopes.iter().filter_map(|s| Scope::parse(s)).collect(),
        created_at,
        revoked_at,
    }
}

/// Creates a token named `name` with `scopes`.
pub async fn create(pg: &PgPool, name: &str, scopes: &[Scope]) -> Result<NewToken, EngineError> {
    let secret = format!(
        "hf_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let scopes: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    let row: Row = sqlx::query_as(
        "INSERT INTO api_tokens (name, token_sha256, scopes) VALUES ($1, $2, $3)
         RETURNING id, name, scopes, created_at, revoked_at",
    )
    .bind(name)
    .bind(digest(&secret))
    .bind(&scopes)
    .fetch_one(pg)
    .await?;
    Ok(NewToken {
        info: info(row),
        secret,
    })
}

/// Revokes token `id`; `false` when there is no such live token.
pub async fn revoke(pg: &PgPool, id: i64) -> Result<bool, EngineError> {
    let done = sqlx::query(
        "UPDATE api_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
    )
    .bind(id)
    .execute(pg)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Every token, newest first.
pub async fn list(pg: &PgPool) -> Result<Vec<TokenInfo>, EngineError> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, name, scopes, created_at, revoked_at FROM api_tokens ORDER BY id DESC",
    )
    .fetch_all(pg)
    .await?;
    Ok(rows.into_iter().map(info).collect())
}

/// The live (not revoked) token whose secret is `secret`.
pub async fn verify(pg: &PgPool, secret: &str) -> Result<Option<TokenInfo>, EngineError> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT id, name, scopes, created_at, revoked_at FROM api_tokens
          WHERE token_sha256 = $1 AND revoked_at IS NULL",
    )
    .bind(digest(secret))
    .fetch_optional(pg)
    .await?;
    Ok(row.map(info))
}

/// Whether `secret` has the shape of a token this server issues (`hf_` and 64
/// lower-case hex digits): anything else is refused without asking PostgreSQL.
pub fn well_formed(secret: &str) -> bool {
    secret.strip_prefix("hf_").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// How long a verified (or refused) token is remembered: a revocation takes
/// effect within this long while PostgreSQL answers.
pub const TOKEN_CACHE_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a token verified before PostgreSQL became unreachable keeps working
/// without it: checkout must not stop with the system of record. A revocation
/// made meanwhile takes effect within [`TOKEN_CACHE_TTL`] of PostgreSQL's return.
pub const TOKEN_OUTAGE_GRACE: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// A verification result (`None`: no such live token), when PostgreSQL gave it,
/// and when to ask PostgreSQL again.
type Verified = (Option<TokenInfo>, std::time::Instant, std::time::Instant);

/// While PostgreSQL is unreachable, how often one token's check is retried (the
/// requests in between use the last answer without waiting).
const OUTAGE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Verified tokens by the SHA-256 of their secret, so the hot path does not query
/// PostgreSQL per request.
#[derive(Debug, Default)]
pub struct TokenCache {
    entries: std::sync::Mutex<Entries>,
    /// Set while PostgreSQL is failing (the last check failed): stale answers
    /// are then given at once and checked again in the background.
    failing: std::sync::atomic::AtomicBool,
    /// Checks with PostgreSQL under way, by secret digest: a request for a
    /// secret already being checked waits for that answer instead of asking
    /// again (the first burst of a drop brings hundreds at once).
    checking: std::sync::Mutex<std::collections::HashMap<Vec<u8>, Check>>,
}

/// One check of a secret with PostgreSQL, run in a task of its own and shared
/// by every request that asks while it runs: its answer, or PostgreSQL's
/// error as text. No request's cancellation stops or restarts it.
type Check = futures_util::future::Shared<
    futures_util::future::BoxFuture<'static, Result<Option<TokenInfo>, String>>,
>;

impl TokenCache {
    /// A cache remembering at most `refused` refused secrets (the oldest
    /// refusal is forgotten first); [`TokenCache::default`] remembers
    /// [`REFUSED_REMEMBERED`].
    pub fn with_refused_cap(refused: usize) -> Self {
        Self {
            entries: std::sync::Mutex::new(Entries {
                refused_cap: Some(refused.max(1)),
                ..Entries::default()
            }),
            ..Self::default()
        }
    }

    /// The live token whose secret is `secret` when memory can answer at once,
    /// as [`TokenCache::verify`] would without asking PostgreSQL (verified
    /// within [`TOKEN_CACHE_TTL`]), in one digest and one lock: the path of
    /// nearly every API call. `None`: ask [`TokenCache::verify`].
    pub fn fresh_live(&self, secret: &str) -> Option<TokenInfo> {
        let key = digest(secret);
        let now = std::time::Instant::now();
        let entries = self.entries.lock().ok()?;
        match entries.get(&key) {
            Some((Some(info), _, next)) if now < *next => Some(info.clone()),
            _ => None,
        }
    }

    /// The live token whose secret is `secret`.
    ///
    /// A token checked within [`TOKEN_CACHE_TTL`] is answered from memory; after
    /// that PostgreSQL is asked again (waiting at most
    /// [`crate::postgres::QUICK_LOOKUP`]), so a revocation takes effect within
    /// the TTL. When PostgreSQL fails, a token checked within
    /// [`TOKEN_OUTAGE_GRACE`] keeps its last answer, and while it keeps failing
    /// such answers are given at once and PostgreSQL is asked again in the
    /// background (at most once a second per token): no checkout waits on an
    /// outage. A token never seen cannot be vouched for without PostgreSQL.
    pub async fn verify(
        self: &std::sync::Arc<Self>,
        pg: &PgPool,
        secret: &str,
    ) -> Result<Option<TokenInfo>, EngineError> {
        use std::sync::atomic::Ordering;
        let key = digest(secret);
        let now = std::time::Instant::now();
        let failing = self.failing.load(Ordering::Relaxed);
        // (answer, whether to ask PostgreSQL in the background) or None: ask now.
        let cached = self.entries.lock().ok().and_then(|mut entries| {
            let (info, verified, next) = entries.get(&key).cloned()?;
            if now < next {
                return Some((info, false));
            }
            if failing && verified.elapsed() < TOKEN_OUTAGE_GRACE {
                // Claim the refresh: later requests keep the answer meanwhile.
                entries.insert(key.clone(), (info.clone(), verified, now + OUTAGE_RETRY));
                return Some((info, true));
            }
            None
        });
        match cached {
            Some((info, false)) => Ok(info),
            Some((info, true)) => {
                let (cache, pg, secret) = (self.clone(), pg.clone(), secret.to_owned());
                tokio::spawn(async move {
                    if let Err(e) = cache.refresh(&pg, &secret).await {
                        tracing::debug!(error = %e, "PostgreSQL unavailable: keeping the last token check");
                    }
                });
                Ok(info)
            }
            None => match self.refresh(pg, secret).await {
                Ok(info) => Ok(info),
                Err(e) => {
                    let stale = self.entries.lock().ok().and_then(|mut entries| {
                        let (info, verified, _) = entries.get(&key).cloned()?;
                        (verified.elapsed() < TOKEN_OUTAGE_GRACE).then(|| {
                            entries
                                .insert(key.clone(), (info.clone(), verified, now + OUTAGE_RETRY));
                            info
                        })
                    });
                    stale.ok_or(e)
                }
            },
        }
    }

    /// Whether `secret` is remembered as a live token, or is being checked
    /// with PostgreSQL right now (asking again joins that check and costs
    /// PostgreSQL nothing). A refused one is not "known": each use of it
    /// counts against the pre-authentication limit, even while its refusal is
    /// cached, so cycling refused tokens cannot reach PostgreSQL faster than
    /// that limit.
    pub fn knows(&self, secret: &str) -> bool {
        let key = digest(secret);
        self.answer_for(&key).is_some_and(|live| live)
            || self
                .checking
                .lock()
                .is_ok_and(|checking| checking.contains_key(&key))
    }

    /// The answer remembered for `secret`: `Some(true)` live,
    /// `Some(false)` refused, `None` not remembered (PostgreSQL would be asked).
    pub fn answer(&self, secret: &str) -> Option<bool> {
        self.answer_for(&digest(secret))
    }

    /// [`TokenCache::answer`] by the secret's digest.
    fn answer_for(&self, key: &[u8]) -> Option<bool> {
        self.entries
            .lock()
            .ok()
            .and_then(|entries| entries.get(key).map(|(info, _, _)| info.is_some()))
    }

    /// Asks PostgreSQL about `secret` (waiting at most
    /// [`crate::postgres::QUICK_LOOKUP`]) and remembers the answer. While one
    /// such check of `secret` runs, others wait for its answer: the check runs
    /// in a task of its own, which leaves the checks under way when it ends,
    /// so a request that goes away (its client gone) neither stops it nor
    /// makes another start.
    async fn refresh(
        self: &std::sync::Arc<Self>,
        pg: &PgPool,
        secret: &str,
    ) -> Result<Option<TokenInfo>, EngineError> {
        use futures_util::FutureExt;
        let key = digest(secret);
        let check = {
            let mut checking = self
                .checking
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            checking
                .entry(key.clone())
                .or_insert_with(|| {
                    let (cache, pg, secret) = (self.clone(), pg.clone(), secret.to_owned());
                    let task = tokio::spawn(async move {
                        let answer = cache.ask(&pg, &secret).await;
                        // Remembered by now (or failed): later requests read
                        // the cache, or check again.
                        cache
                            .checking
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .remove(&key);
                        answer.map_err(|e| e.to_string())
                    });
                    async move {
                        task.await
                            .unwrap_or_else(|e| Err(format!("the token check stopped: {e}")))
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        check
            .await
            .map_err(|e| EngineError::Postgres(sqlx::Error::Io(std::io::Error::other(e))))
    }

    /// One check of `secret` with PostgreSQL, remembered.
    async fn ask(&self, pg: &PgPool, secret: &str) -> Result<Option<TokenInfo>, EngineError> {
        use std::sync::atomic::Ordering;
        let info = match crate::postgres::quick(verify(pg, secret)).await {
            Ok(info) => {
                self.failing.store(false, Ordering::Relaxed);
                info
            }
            Err(e) => {
                self.failing.store(true, Ordering::Relaxed);
                return Err(e);
            }
        };
        let now = std::time::Instant::now();
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(digest(secret), (info.clone(), now, now + TOKEN_CACHE_TTL));
        }
        Ok(info)
    }

    /// How many answers are remembered (live tokens plus at most the refusal
    /// cap).
    pub fn remembered(&self) -> usize {
        self.entries.lock().map_or(0, |e| e.map.len())
    }
}

/// Default refused secrets remembered at most: the oldest refusal is forgotten first,
/// in constant time, so invented tokens cannot grow the cache or stall it.
/// Live tokens are few (an operator issues them) and always kept.
pub const REFUSED_REMEMBERED: usize = 4_096;

/// The cache's answers by secret digest, with the refusals in arrival order.
#[derive(Debug, Default)]
struct Entries {
    map: std::collections::HashMap<Vec<u8>, Verified>,
    refused: std::collections::VecDeque<Vec<u8>>,
    /// Most refusals kept (`None`: [`REFUSED_REMEMBERED`]).
    refused_cap: Option<usize>,
}

impl Entries {
    fn get(&self, key: &[u8]) -> Option<&Verified> {
        self.map.get(key)
    }

    fn insert(&mut self, key: Vec<u8>, value: Verified) {
        if value.0.is_none() && !matches!(self.map.get(&key), Some((None, _, _))) {
            self.refused.push_back(key.clone());
            let cap = self.refused_cap.unwrap_or(REFUSED_REMEMBERED);
            while self.refused.len() > cap {
                if let Some(old) = self.refused.pop_front()
                    && matches!(self.map.get(&old), Some((None, _, _)))
                {
                    self.map.remove(&old);
                }
            }
        }
        self.map.insert(key, value);
    }
}
