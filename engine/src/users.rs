//! Dashboard users, roles and login sessions.
//!
//! Passwords are stored as argon2id hashes and checked on one of four hashing threads (a
//! hash costs tens of milliseconds of CPU, which must not stall the async
//! workers serving checkout). Sessions are random secrets handed to the browser in
//! an HttpOnly cookie; PostgreSQL keeps only their SHA-256 digest.

use std::time::Duration;

use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::error::EngineError;
use crate::tokens::digest;

pub use holdfast_domain::Role;

/// A dashboard user, without the password hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// Database id.
    pub id: i64,
    /// Login name (lower case).
    pub username: String,
    /// What the user may do.
    pub role: Role,
    /// The password is a generated one-time password that must be replaced.
    pub must_change_password: bool,
    /// When the user was created.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

#[derive(sqlx::FromRow)]
struct UserRow {
    id: i64,
    username: String,
    role: String,
    must_change_password: bool,
    created_at: chrono::DateTime<chrono::Utc>,
}

impl UserRow {
    fn into_user(self) -> Result<User, EngineError> {
        let role = Role::parse(&self.role).ok_or_else(|| {
            EngineError::UnexpectedReply(format!("user {} has unknown role {}", self.id, self.role))
        })?;
        Ok(User {
            id: self.id,
            username: self.username,
            role,
            must_change_password: self.must_change_password,
            created_at: self.created_at,
        })
    }
}

/// How long a login lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The shortest password accepted.
pub const MIN_PASSWORD_LEN: usize = 10;

/// Why a user could not be created or changed.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// The name is not 1 to 63 of `a-z 0-9 . _ -`, starting with a letter or digit.
    #[error(
        "a username is 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit"
    )]
    BadName,
    /// The password is shorter than [`MIN_PASSWORD_LEN`].
    #[error("a password needs at least {MIN_PASSWORD_LEN} characters")]
    WeakPassword,
    /// The password is longer than [`MAX_PASSWORD_LEN`] bytes: sign-in
    /// refuses such passwords unhashed, so it could never be used.
    #[error("a password has at most {MAX_PASSWORD_LEN} bytes")]
    LongPassword,
    /// The name is taken.
    #[error("a user named {0} already exists")]
    Taken(String),
    /// No such user.
    #[error("there is no user {0}")]
    Unknown(String),
    /// The change would leave nobody able to administer Holdfast.
    #[error("this would leave no admin; make another user admin first")]
    LastAdmin,
    /// PostgreSQL failed: not the request's fault.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<sqlx::Error> for UserError {
    fn from(e: sqlx::Error) -> Self {
        Self::Engine(e.into())
    }
}

/// Whether `name` is an acceptable username.
pub fn valid_username(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
}

/// A random secret of about 240 bits, URL- and cookie-safe.
pub fn random_secret() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Whether `secret` has the shape of a [`random_secret`] (64 lower-case hex
/// digits): anything else is refused without a lookup.
pub fn well_formed_secret(secret: &str) -> bool {
    secret.len() == 64
        && secret
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A generated password that is easy to type: four groups of five characters.
pub fn generate_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyz23456789";
    let bytes: Vec<u8> = uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .chain(uuid::Uuid::new_v4().as_bytes())
        .copied()
        .collect();
    let chars: Vec<char> = bytes
        .iter()
        .take(20)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    chars
        .chunks(5)
        .map(|c| c.iter().collect::<String>())
        .collect::<Vec<_>>()
        .join("-")
}

/// Default for how many passwords are hashed at once, at most: each takes
/// about 19 MiB and a thread, so a burst of sign-ins must not take the
/// server's memory.
pub const DEFAULT_HASHES_AT_ONCE: usize = 4;
static HASHES_AT_ONCE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Sets how many passwords this process hashes at once (its hashing threads
/// and permits), before the first hash; `false` when hashing already started
/// with another number (the setting is then ignored).
pub fn set_hashes_at_once(n: usize) -> bool {
    *HASHES_AT_ONCE.get_or_init(|| n.clamp(1, 256)) == n.clamp(1, 256)
}

/// How many passwords are hashed at once (fixed at the first hash).
fn hashes_at_once() -> usize {
    *HASHES_AT_ONCE.get_or_init(|| DEFAULT_HASHES_AT_ONCE)
}

fn hashing() -> &'static tokio::sync::Semaphore {
    static HASHING: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    HASHING.get_or_init(|| tokio::sync::Semaphore::new(hashes_at_once()))
}

/// Longest password accepted (argon2 hashes any length; a megabyte would be
/// hashed just the same).
pub const MAX_PASSWORD_LEN: usize = 1_024;

/// Default failed sign-ins for one username from one client address before
/// that pair is refused for the window
/// (`EngineConfig::login_failures_per_user_and_address`).
pub const LOGIN_FAILURES: i64 = 5;
/// Default failed sign-ins for one username from all addresses together
/// (`EngineConfig::login_failures_per_user`): stops guessing spread over many
/// addresses, while a single address cannot lock an account out for others.
pub const LOGIN_FAILURES_PER_USER: i64 = 100;
/// The window over which failed sign-ins count, and the wait once over.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(15 * 60);

/// A permit to hash. A sign-in (`wait` false) is refused at once when every
/// permit is taken; an administrator's change (`wait` true) waits its turn.
async fn hashing_permit(wait: bool) -> Result<tokio::sync::SemaphorePermit<'static>, EngineError> {
    let busy = || EngineError::Throttled {
        reason: "too many sign-ins at once".into(),
        retry_after: 1,
    };
    if wait {
        hashing().acquire().await.map_err(|_| busy())
    } else {
        hashing().try_acquire().map_err(|_| busy())
    }
}

async fn hash_password(password: String) -> Result<String, EngineError> {
    hash_password_as(password, true).await
}

/// A job for a hashing thread.
type HashJob = Box<dyn FnOnce() + Send>;

/// Runs `work` on one of the long-lived hashing threads (as many as passwords
/// hashed at once).
///
/// Not on tokio's blocking pool: it grows to hundreds of threads, and the C
/// allocator keeps a 19 MiB arena per thread that ever hashed, so memory grew
/// with every burst and never came back. A fixed set of threads keeps it at
/// that many arenas.
async fn on_hashing_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, EngineError> {
    use std::sync::{Arc, Mutex, OnceLock, mpsc};
    static JOBS: OnceLock<mpsc::Sender<HashJob>> = OnceLock::new();
    let jobs = JOBS.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<HashJob>();
        let rx = Arc::new(Mutex::new(rx));
        for n in 0..hashes_at_once() {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("holdfast-hash-{n}"))
                .spawn(move || {
                    loop {
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "could not start a password-hashing thread");
            }
        }
        tx
    });
    let (done, result) = tokio::sync::oneshot::channel();
    jobs.send(Box::new(move || {
        let _ = done.send(work());
    }))
    .map_err(|_| EngineError::UnexpectedReply("the hashing threads are gone".into()))?;
    result
        .await
        .map_err(|_| EngineError::UnexpectedReply("a hashing job was dropped".into()))
}

async fn hash_password_as(password: String, wait: bool) -> Result<String, EngineError> {
    let _permit = hashing_permit(wait).await?;
    on_hashing_thread(move || hash_here(&password)).await?
}

async fn verify_password(password: String, hash: String) -> Result<bool, EngineError> {
    let _permit = hashing_permit(false).await?;
    on_hashing_thread(move || verify_here(&password, &hash)).await
}

thread_local! {
    /// This hashing thread's argon2 memory (19 MiB with the default
    /// parameters), allocated once and reused: allocating and freeing it per
    /// hash fragmented the C heap so that every sign-in kept 19 MiB resident.
    static MEMORY: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most argon2 memory a stored hash may ask for (64 MiB): a hash is ours, but
/// a bound costs nothing.
const MAX_BLOCKS: usize = 64 * 1024;

/// Argon2 of `password` and `salt` into `out`, in this thread's reused memory.
fn argon2_here(
    argon: &Argon2<'_>,
    blocks: usize,
    password: &[u8],
    salt: &[u8],
    out: &mut [u8],
) -> bool {
    if blocks > MAX_BLOCKS {
        return false;
    }
    MEMORY.with_borrow_mut(|memory| {
        if memory.len() < blocks {
            memory.resize(blocks, Block::default());
        }
        argon
            .hash_password_into_with_memory(password, salt, out, &mut memory[..blocks])
            .is_ok()
    })
}

/// A new argon2id hash of `password` in PHC string form, with a random salt
/// and the default parameters.
fn hash_here(password: &str) -> Result<String, EngineError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        EngineError::UnexpectedReply(format!("password hash ({what}): {e}"))
    };
    let params = Params::default();
    let salt =
        SaltString::encode_b64(uuid::Uuid::new_v4().as_bytes()).map_err(|e| fail("salt", &e))?;
    let mut salt_buf = [0u8; 64];
    let salt_bytes = salt
        .as_salt()
        .decode_b64(&mut salt_buf)
        .map_err(|e| fail("salt", &e))?;
    let argon = Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone());
    let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
    if !argon2_here(
        &argon,
        params.block_count(),
        password.as_bytes(),
        salt_bytes,
        &mut out,
    ) {
        return Err(fail("argon2", &"hashing failed"));
    }
    let phc = PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(&params).map_err(|e| fail("params", &e))?,
        salt: Some(salt.as_salt()),
        hash: Some(Output::new(&out).map_err(|e| fail("output", &e))?),
    };
    Ok(phc.to_string())
}

/// Whether `password` matches the PHC string `stored` (compared in constant time).
fn verify_here(password: &str, stored: &str) -> bool {
    let Ok(phc) = PasswordHash::new(stored) else {
        return false;
    };
    let (Ok(algorithm), Ok(params), Some(salt), Some(expected)) = (
        Algorithm::try_from(phc.algorithm),
        Params::try_from(&phc),
        phc.salt,
        phc.hash,
    ) else {
        return false;
    };
    let version = match phc.version.map(Version::try_from) {
        None => Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let mut salt_buf = [0u8; 64];
    let Ok(salt_bytes) = salt.decode_b64(&mut salt_buf) else {
        return false;
    };
    let mut out = vec![0u8; expected.len()];
    let argon = Argon2::new(algorithm, version, params.clone());
    argon2_here(
        &argon,
        params.block_count(),
        password.as_bytes(),
        salt_bytes,
        &mut out,
    ) && Output::new(&out).is_ok_and(|o| o == expected)
}

fn check_new(username: &str, password: &str) -> Result<(), UserError> {
    if !valid_username(username) {
        return Err(UserError::BadName);
    }
    acceptable_password(password)
}

/// Whether `password` may be set: long enough to resist guessing, and short
/// enough that sign-in, which refuses longer ones unhashed, accepts it.
fn acceptable_password(password: &str) -> Result<(), UserError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(UserError::WeakPassword);
    }
    if password.len() > MAX_PASSWORD_LEN {
        return Err(UserError::LongPassword);
    }
    Ok(())
}

/// Creates a user; `must_change` marks a generated password to be replaced at
/// first login.
pub async fn create(
    pg: &PgPool,
    username: &str,
    role: Role,
    password: &str,
    must_change: bool,
) -> Result<User, UserError> {
    check_new(username, password)?;
    let hash = hash_password(password.to_owned()).await?;
    let row = sqlx::query_as::<_, UserRow>(
        "INSERT INTO users (username, password_hash, role, must_change_password)
         VALUES ($1, $2, $3, $4) ON CONFLICT (username) DO NOTHING
         RETURNING id, username, role, must_change_password, created_at",
    )
    .bind(username)
    .bind(hash)
    .bind(role.as_str())
    .bind(must_change)
    .fetch_optional(pg)
    .await?;
    match row {
        Some(row) => Ok(row.into_user()?),
        None => Err(UserError::Taken(username.to_owned())),
    }
}

/// How people can sign in after start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignIn {
    /// The demo users `admin`, `support` and `viewer` exist with this password
    /// (unless they existed before with others).
    Demo(String),
    /// The database had no users: `admin` was created with this one-time password.
    FirstAdmin(String),
    /// Users existed; nothing was created.
    Existing,
}

/// Prepares sign-in at start-up: with a demo password, creates the demo users
/// that are missing (an existing one is left as it is); otherwise, on a database
/// with no users, creates `admin` with a one-time password.
pub async fn prepare_sign_in(
    pg: &PgPool,
    demo_password: Option<&str>,
) -> Result<SignIn, EngineError> {
    if let Some(password) = demo_password {
        for (name, role) in [
            ("admin", Role::Admin),
            ("support", Role::Support),
            ("merchandiser", Role::Merchandiser),
            ("viewer", Role::Viewer),
        ] {
            // An existing user (a taken name) is left as it is.
            if let Err(UserError::Engine(e)) = create(pg, name, role, password, false).await {
                return Err(e);
            }
        }
        return Ok(SignIn::Demo(password.to_owned()));
    }
    Ok(match ensure_first_admin(pg).await? {
        Some(password) => SignIn::FirstAdmin(password),
        None => SignIn::Existing,
    })
}

/// On a database with no users at all, creates `admin` with a generated
/// one-time password and returns that password (to print once); otherwise `None`.
pub async fn ensure_first_admin(pg: &PgPool) -> Result<Option<String>, EngineError> {
    let any: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM users)")
        .fetch_one(pg)
        .await?;
    if any {
        return Ok(None);
    }
    let password = generate_password();
    // Two servers starting at once: only one insert wins, and only it prints.
    match create(pg, "admin", Role::Admin, &password, true).await {
        Ok(_) => Ok(Some(password)),
        Err(UserError::Engine(e)) => Err(e),
        Err(_) => Ok(None),
    }
}

/// Every user, by name.
pub async fn list(pg: &PgPool) -> Result<Vec<User>, EngineError> {
    sqlx::query_as::<_, UserRow>(
        "SELECT id, username, role, must_change_password, created_at FROM users ORDER BY username",
    )
    .fetch_all(pg)
    .await?
    .into_iter()
    .map(UserRow::into_user)
    .collect()
}

/// Locks every admin row for the rest of `tx` and returns how many admins
/// other than `username` there are. Two changes racing to remove the last two
/// admins queue on these locks; the second then sees the first's change and
/// is refused, so the check and the change are one atomic step.
async fn lock_other_admins(
    tx: &mut sqlx::PgConnection,
    username: &str,
) -> Result<usize, EngineError> {
    let admins: Vec<String> =
        sqlx::query_scalar("SELECT username FROM users WHERE role = 'admin' FOR UPDATE")
            .fetch_all(&mut *tx)
            .await?;
    Ok(admins.iter().filter(|a| a.as_str() != username).count())
}

/// Changes a user's role; refuses to demote the last admin.
pub async fn set_role(pg: &PgPool, username: &str, role: Role) -> Result<(), UserError> {
    let mut tx = pg.begin().await?;
    if role != Role::Admin && lock_other_admins(&mut tx, username).await? == 0 {
        return Err(UserError::LastAdmin);
    }
    let done = sqlx::query("UPDATE users SET role = $2 WHERE username = $1")
        .bind(username)
        .bind(role.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if done != 1 {
        return Err(UserError::Unknown(username.to_owned()));
    }
    tx.commit().await?;
    Ok(())
}

/// Deletes a user and their sessions; refuses to delete the last admin.
pub async fn delete(pg: &PgPool, username: &str) -> Result<(), UserError> {
    let mut tx = pg.begin().await?;
    if lock_other_admins(&mut tx, username).await? == 0 {
        let role: Option<String> = sqlx::query_scalar("SELECT role FROM users WHERE username = $1")
            .bind(username)
            .fetch_optional(&mut *tx)
            .await?;
        if role.as_deref() == Some("admin") {
            return Err(UserError::LastAdmin);
        }
    }
    let done = sqlx::query("DELETE FROM users WHERE username = $1")
        .bind(username)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if done != 1 {
        return Err(UserError::Unknown(username.to_owned()));
    }
    tx.commit().await?;
    Ok(())
}

/// Replaces a user's password and ends their other sessions. `one_time` marks a
/// generated password the user must replace at their next sign-in; otherwise
/// the mark is cleared.
pub async fn set_password(
    pg: &PgPool,
    username: &str,
    password: &str,
    one_time: bool,
    keep_session: Option<&str>,
) -> Result<(), UserError> {
    acceptable_password(password)?;
    let hash = hash_password(password.to_owned()).await?;
    let mut tx = pg.begin().await?;
    let id: Option<i64> = sqlx::query_scalar(
        "UPDATE users SET password_hash = $2, must_change_password = $3
         WHERE username = $1 RETURNING id",
    )
    .bind(username)
    .bind(hash)
    .bind(one_time)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else {
        return Err(UserError::Unknown(username.to_owned()));
    };
    let keep = keep_session.map(digest).unwrap_or_default();
    sqlx::query("DELETE FROM sessions WHERE user_id = $1 AND digest <> $2")
        .bind(id)
        .bind(keep)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// One sign-in attempt: who, with what, from where, replacing which session.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    /// The username as typed.
    pub username: &'a str,
    /// The password as typed.
    pub password: &'a str,
    /// The client's address (after trusted proxies), for the per-address limit.
    pub from: Option<std::net::IpAddr>,
    /// The session secret the browser already holds: ended by a successful
    /// sign-in, so a session id planted before sign-in is never promoted.
    pub replaces: Option<&'a str>,
    /// The device token this browser got at an earlier successful sign-in as
    /// this user: such a browser is exempt from the per-user limit, so failures
    /// spread over many addresses cannot lock the user out of their own browser.
    pub device: Option<&'a str>,
}

/// A successful sign-in.
#[derive(Debug, Clone)]
pub struct LoggedIn {
    /// The user.
    pub user: User,
    /// The new session's secret (for the session cookie).
    pub session: String,
    /// This browser's device token for the user (for the device cookie).
    pub device: String,
}

/// How long a device token lets its browser past the per-user limit.
pub const DEVICE_TTL: Duration = Duration::from_secs(90 * 24 * 3600);

/// Default failed sign-ins from one client address (any usernames) before it
/// is refused for the window (`EngineConfig::login_failures_per_address`):
/// enough for an office behind one NAT to mistype, far too few to guess
/// passwords across many accounts.
pub const LOGIN_FAILURES_PER_ADDRESS: i64 = 20;

/// `lua/login_attempt.lua`: counts one attempt against one limit, atomically.
static LOGIN_ATTEMPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../lua/login_attempt.lua")));

/// Checks `password` for `username` under the guessing limits; `Ok(false)` for
/// a wrong password (counted) or a name that cannot exist.
///
/// Three counts per [`LOGIN_WINDOW`], from the engine's configuration: failures
/// for the username from this address (default [`LOGIN_FAILURES`]), for the
/// username from everywhere ([`LOGIN_FAILURES_PER_USER`]) and from this address
/// for any username ([`LOGIN_FAILURES_PER_ADDRESS`]). Past any of them the
/// attempt is refused ([`EngineError::Throttled`], even with the right
/// password) until the window ends. Each attempt is counted before the hash
/// in one atomic step, so a burst cannot exceed a limit, and taken back when
/// the password was right. At most [`set_hashes_at_once`] passwords are hashed
/// at once (others are refused at once); passwords longer than
/// [`MAX_PASSWORD_LEN`] never match. The counts live in Redis, shared by every
/// server.
async fn check_password(
    b: &crate::Backends,
    name: &str,
    password: &str,
    from: Option<std::net::IpAddr>,
    device: Option<&str>,
) -> Result<bool, EngineError> {
    use crate::keys::Keyspace;
    if !valid_username(name) {
        // No such user can exist; nothing is stored or hashed for it.
        return Ok(false);
    }
    let limits = &b.engine.config;
    let mut conn = b.engine.connection();
    let over_long = password.len() > MAX_PASSWORD_LEN;
    let mut counts = Vec::new();
    if !over_long {
        // A password that cannot match is not a guess at this user: it
        // counts against the address only (and is never hashed), so it cannot
        // be used to lock the user out cheaply.
        counts.push((
            Keyspace::login_failures_from_for(name, from),
            limits.login_failures_per_user_and_address,
            "too many failed sign-ins for this user from this address",
        ));
        let trusted_device = match device {
            Some(token) => {
                redis::cmd("EXISTS")
                    .arg(Keyspace::login_device(name, &digest_hex(token)))
                    .query_async::<bool>(&mut conn)
                    .await?
            }
            None => false,
        };
        if !trusted_device {
            counts.push((
                Keyspace::login_failures(name),
                limits.login_failures_per_user,
                "too many failed sign-ins for this user",
            ));
        }
    }
    if let Some(ip) = from {
        counts.push((
            Keyspace::login_failures_from(ip),
            limits.login_failures_per_address,
            "too many failed sign-ins from this address",
        ));
    }
    let window = LOGIN_WINDOW.as_millis() as u64;
    let mut counted: Vec<&str> = Vec::new();
    for (key, limit, reason) in &counts {
        let (verdict, n): (String, i64) = LOGIN_ATTEMPT
            .key(key)
            .arg(*limit)
            .arg(window)
            .invoke_async(&mut conn)
            .await?;
        if verdict != "ok" {
            take_back(&mut conn, &counted).await?;
            return Err(EngineError::Throttled {
                reason: (*reason).into(),
                retry_after: (n.max(1_000) as u64).div_ceil(1_000),
            });
        }
        counted.push(key);
    }
    let checked = async {
        if over_long {
            return Ok(false);
        }
        let row: Option<(String,)> =
            sqlx::query_as("SELECT password_hash FROM users WHERE username = $1")
                .bind(name)
                .fetch_optional(&b.pg)
                .await?;
        match row {
            Some((hash,)) => verify_password(password.to_owned(), hash).await,
            None => {
                // Unknown names cost a hash too, so timing does not reveal which
                // names exist.
                hash_password_as(password.to_owned(), false).await?;
                Ok(false)
            }
        }
    };
    match checked.await {
        Ok(true) => {
            // Not a failure: take the counts back, and forgive this address
            // its earlier mistakes for this user (the first count).
            take_back(&mut conn, &counted[1..]).await?;
            if let Some(first) = counted.first() {
                redis::cmd("DEL")
                    .arg(*first)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
            Ok(true)
        }
        Ok(false) => Ok(false),
        Err(e) => {
            // Not checked (hashing busy, PostgreSQL down): not a failure either.
            take_back(&mut conn, &counted).await?;
            Err(e)
        }
    }
}

/// `lua/login_take_back.lua`.
static LOGIN_TAKE_BACK: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../lua/login_take_back.lua")));

/// Takes back one counted attempt from each of `keys` (each still counting).
/// One call per key: the keys live in different slots.
async fn take_back(
    conn: &mut crate::redis_conn::RedisConn,
    keys: &[&str],
) -> Result<(), EngineError> {
    for key in keys {
        LOGIN_TAKE_BACK.key(*key).invoke_async::<()>(conn).await?;
    }
    Ok(())
}

/// Checks a username and password (under [`check_password`]'s limits); on
/// success starts a new session, ends the one the browser held before and any
/// expired ones, and returns the user with the new session secret (for the
/// cookie).
pub async fn login(
    b: &crate::Backends,
    attempt: Attempt<'_>,
) -> Result<Option<LoggedIn>, EngineError> {
    let name = attempt.username.trim().to_lowercase();
    if !check_password(b, &name, attempt.password, attempt.from, attempt.device).await? {
        return Ok(None);
    }
    let secret = random_secret();
    let user = sqlx::query_as::<_, UserRow>(
        "WITH gone AS (DELETE FROM sessions WHERE expires_at < now() OR digest = $4),
              u AS (SELECT id, username, role, must_change_password, created_at FROM users WHERE username = $1),
              s AS (INSERT INTO sessions (digest, user_id, expires_at)
                    SELECT $2, id, now() + make_interval(secs => $3) FROM u)
         SELECT * FROM u",
    )
    .bind(&name)
    .bind(digest(&secret))
    .bind(SESSION_TTL.as_secs_f64())
    .bind(attempt.replaces.map(digest).unwrap_or_default())
    .fetch_optional(&b.pg)
    .await?;
    let Some(user) = user else {
        return Ok(None);
    };
    // This browser is now a known device for the user: failures elsewhere
    // cannot lock it out.
    let device = random_secret();
    redis::cmd("SET")
        .arg(crate::keys::Keyspace::login_device(
            &name,
            &digest_hex(&device),
        ))
        .arg(1)
        .arg("PX")
        .arg(DEVICE_TTL.as_millis() as u64)
        .query_async::<()>(&mut b.engine.connection())
        .await?;
    Ok(Some(LoggedIn {
        user: user.into_user()?,
        session: secret,
        device,
    }))
}

/// The hex SHA-256 of a secret, as keys store it.
fn digest_hex(secret: &str) -> String {
    hex::encode(digest(secret))
}

/// Why a user's own password change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The current password given is wrong (counted like a failed sign-in).
    #[error("the current password is not right")]
    WrongCurrent,
    /// The new password is refused, or PostgreSQL failed.
    #[error(transparent)]
    User(#[from] UserError),
}

/// A signed-in user replaces their own password: the current one must be given
/// (checked under the sign-in limits, so a stolen session cannot be turned
/// into a stolen account), and every other session of theirs ends.
pub async fn change_own_password(
    b: &crate::Backends,
    username: &str,
    current: &str,
    new: &str,
    from: Option<std::net::IpAddr>,
    session: &str,
) -> Result<(), ChangeError> {
    acceptable_password(new)?;
    if !check_password(b, username, current, from, None)
        .await
        .map_err(UserError::from)?
    {
        return Err(ChangeError::WrongCurrent);
    }
    set_password(&b.pg, username, new, false, Some(session)).await?;
    Ok(())
}

/// Deletes sessions past their end; returns how many. Run on a schedule so the
/// table holds only live sessions even when nobody signs in or out.
pub async fn purge_expired_sessions(pg: &PgPool) -> Result<u64, EngineError> {
    Ok(sqlx::query("DELETE FROM sessions WHERE expires_at < now()")
        .execute(pg)
        .await?
        .rows_affected())
}

/// Default session lookups per client address per second that may find no
/// live session (bursts of twice that; [`session_user_from`]): a browser
/// whose session ended misses once per call until it signs in again, far
/// fewer than a flood of invented cookies, each of which would otherwise
/// cost PostgreSQL a lookup on the pool the write-behind records through.
pub const UNKNOWN_SESSIONS_PER_ADDRESS: u32 = 10;

/// The user a live session belongs to, for a request from `from` (the
/// client's address after trusted proxies).
///
/// Only misses count: a lookup that finds no live session is charged to its
/// address afterwards, and once an address has missed more than
/// [`UNKNOWN_SESSIONS_PER_ADDRESS`] a second its lookups are refused without
/// asking PostgreSQL ([`EngineError::Throttled`], a 429 with `Retry-After`)
/// until its bucket refills. Live sessions behind that address are refused
/// too meanwhile (their cookies cannot be told from invented ones without the
/// lookup), but live lookups never use the bucket up, however many are in
/// flight or however slow PostgreSQL is. Misses sent concurrently are not
/// bounded yet: all pass while the bucket holds a place and are charged after
/// their lookups ([`crate::ratelimit::RateLimiter::charge`]).
pub async fn session_user_from(
    b: &crate::Backends,
    secret: &str,
    from: Option<std::net::IpAddr>,
) -> Result<Option<User>, EngineError> {
    if let Some(ip) = from {
        b.session_misses
            .admits(&ip)
            .map_err(|retry_after| EngineError::Throttled {
                reason: "too many session cookies from this address were not live sessions".into(),
                retry_after,
            })?;
    }
    let user = session_user(&b.pg, secret).await;
    if let (Some(ip), Ok(None)) = (from, &user) {
        b.session_misses.charge(&ip);
    }
    user
}

/// The user a live session belongs to.
pub async fn session_user(pg: &PgPool, secret: &str) -> Result<Option<User>, EngineError> {
    sqlx::query_as::<_, UserRow>(
        "SELECT u.id, u.username, u.role, u.must_change_password, u.created_at
         FROM sessions s JOIN users u ON u.id = s.user_id
         WHERE s.digest = $1 AND s.expires_at > now()",
    )
    .bind(digest(secret))
    .fetch_optional(pg)
    .await?
    .map(UserRow::into_user)
    .transpose()
}

/// Ends a session (logout). Also drops expired sessions, so the table stays small.
pub async fn logout(pg: &PgPool, secret: &str) -> Result<(), EngineError> {
    sqlx::query("DELETE FROM sessions WHERE digest = $1 OR expires_at < now()")
        .bind(digest(secret))
        .execute(pg)
        .await?;
    Ok(())
}

#[cfg(test)]
mod hashing_tests {
    use super::*;
    use argon2::password_hash::{PasswordHasher, PasswordVerifier};

    #[test]
    fn a_password_sign_in_would_refuse_cannot_be_set() {
        assert!(matches!(
            acceptable_password("short"),
            Err(UserError::WeakPassword)
        ));
        assert!(acceptable_password(&"x".repeat(MAX_PASSWORD_LEN)).is_ok());
        assert!(matches!(
            acceptable_password(&"x".repeat(MAX_PASSWORD_LEN + 1)),
            Err(UserError::LongPassword)
        ));
    }

    #[test]
    fn hashes_are_standard_phc_strings_both_ways() {
        let ours = hash_here("correct horse battery").unwrap();
        assert!(
            ours.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{ours}"
        );
        assert!(verify_here("correct horse battery", &ours));
        assert!(!verify_here("correct horse batterY", &ours));
        // The argon2 crate's own verifier accepts ours…
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(
            Argon2::default()
                .verify_password(b"correct horse battery", &parsed)
                .is_ok()
        );
        // …and hashes stored by its own hasher still verify.
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        let theirs = Argon2::default()
            .hash_password(b"an older password", &salt)
            .unwrap()
            .to_string();
        assert!(verify_here("an older password", &theirs));
        assert!(!verify_here("another", &theirs));
        assert!(!verify_here("x", "not a hash"));
        assert!(
            !verify_here(
                "x",
                "$argon2id$v=19$m=4194304,t=2,p=1$MDEyMzQ1Njc4OWFiY2RlZg$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
            ),
            "a hash asking for 4 GiB is refused, not computed"
        );
    }
}
