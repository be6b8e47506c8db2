//! `holdfast doctor`: checks a deployment before a drop and says, line by line,
//! what passes, what is a risk and what must be fixed, with what to do.
//!
//! It only reads: it opens one Redis connection and one PostgreSQL connection,
//! never creates the database, never migrates and never writes a key. A service
//! it cannot reach is a failing line, not an error, so the report is always
//! complete enough to act on.
//!
//! The checks and their thresholds:
//!
//! | line | pass | warn | fail |
//! |---|---|---|---|
//! | `redis reachable` | answers | | unreachable (its other lines are skipped) |
//! | `redis eviction policy` | `noeviction` | policy unreadable | any other policy ([`redis_conn::check_eviction_policy`]'s rule) |
//! | `redis persistence` | AOF on, `appendfsync` `everysec`/`always` | AOF off (RDB only, or none), `appendfsync no` | |
//! | `redis maxclients` | projected ≤ 80% | > 80% of `maxclients` | > 100% |
//! | `redis memory headroom` | ≥ 40% of `maxmemory` free | < 40% free, or no `maxmemory` | < 20% free, or (no `maxmemory`) over 80% of the host's memory |
//! | `clock skew` | ≤ 250 ms | > 250 ms | > 1 s |
//! | `redis tls` | `rediss://` (verified by a connection made), a Unix socket or loopback | plain TCP beyond loopback, `rediss://` not yet verified (no connection) | `#insecure` (refused), a URL [`redis_conn::client`] refuses (e.g. an unreadable CA file) |
//! | `postgres reachable` | answers | | unreachable (its other lines are skipped) |
//! | `postgres max_connections` | pools + margin fit | pools fit, margin does not | pools do not fit |
//! | `postgres tls` | TLS in use with `verify-full`, or loopback | no TLS beyond loopback, or an unverified certificate | |
//! | `webhook sources` | at least one, all valid | none | one `serve` would refuse |
//! | `badge origins` | at least one, all well-formed | none, or one that can never match | |
//!
//! "Projected" Redis clients are the larger of (clients connected now, not
//! counting this check's own connection, plus one more server) and (`--servers`
//! servers from nothing), with [`redis_connections_per_server`] each.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::redis_conn::RedisConn;
use holdfast_domain::Lane;
pub use holdfast_domain::doctor::{CheckLevel, DoctorCheck, DoctorReport};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

use crate::error::{EngineError, redact_url};
use crate::ingest::LaneConfig;
use crate::postgres::one_line;
use crate::redis_conn::{self, EvictionCheck};

/// The names of the report's lines, for code that looks one up.
pub mod check {
    /// Whether Redis answers.
    pub const REDIS_REACHABLE: &str = "redis reachable";
    /// `maxmemory-policy`.
    pub const REDIS_EVICTION: &str = "redis eviction policy";
    /// AOF and RDB.
    pub const REDIS_PERSISTENCE: &str = "redis persistence";
    /// `maxclients` against what the servers open.
    pub const REDIS_MAXCLIENTS: &str = "redis maxclients";
    /// `used_memory` against `maxmemory`.
    pub const REDIS_MEMORY: &str = "redis memory headroom";
    /// Redis' `TIME` against this host's clock.
    pub const CLOCK_SKEW: &str = "clock skew";
    /// Whether Redis traffic is encrypted or stays on this machine.
    pub const REDIS_TLS: &str = "redis tls";
    /// Whether PostgreSQL answers.
    pub const POSTGRES_REACHABLE: &str = "postgres reachable";
    /// `max_connections` against the servers' pools.
    pub const POSTGRES_CONNECTIONS: &str = "postgres max_connections";
    /// Whether PostgreSQL traffic is encrypted or stays on this machine.
    pub const POSTGRES_TLS: &str = "postgres tls";
    /// `HOLDFAST_INGEST_SOURCES`.
    pub const WEBHOOK_SOURCES: &str = "webhook sources";
    /// `HOLDFAST_BADGE_ORIGINS`.
    pub const BADGE_ORIGINS: &str = "badge origins";
    /// `serve`'s settings taken together.
    pub const SETTINGS: &str = "serve settings";
}

/// Longest wait for Redis' `INFO`.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// Skew between this host's clock and Redis' above which the line warns.
pub const SKEW_WARN: Duration = Duration::from_millis(250);
/// Skew above which the line fails.
pub const SKEW_FAIL: Duration = Duration::from_secs(1);
/// Share of `maxclients` the projected clients may use before the line warns.
pub const MAXCLIENTS_WARN_PERCENT: u64 = 80;
/// Free share of `maxmemory` below which the line fails: under `noeviction`,
/// Redis at its limit refuses every write, so every reservation fails.
pub const MEMORY_FAIL_HEADROOM_PERCENT: u64 = 20;
/// Free share of `maxmemory` below which the line warns (a drop adds holds,
/// buyer counters and events on top of the catalogue).
pub const MEMORY_WARN_HEADROOM_PERCENT: u64 = 40;
/// PostgreSQL connections kept free beyond the servers' pools for the one-shot
/// commands (`warm`, `reconcile` and `verify` open 4 each; `token`, `user` and
/// this check 1–2), `psql` and monitoring.
pub const PG_OPERATOR_MARGIN: u64 = 10;

/// What the deployment is configured with: the settings `holdfast serve` reads,
/// plus how many servers will run.
#[derive(Debug, Clone)]
pub struct DoctorConfig {
    /// `REDIS_URL`.
    pub redis_url: String,
    /// `DATABASE_URL`.
    pub database_url: String,
    /// PostgreSQL connections one server's pool opens (`HOLDFAST_PG_MAX_CONNECTIONS`).
    pub pg_pool_size: u32,
    /// Write-behind parts per server (`HOLDFAST_WRITE_BEHIND_WORKERS`), each a
    /// Redis connection of its own.
    pub write_behind_workers: usize,
    /// Servers that will run against these services.
    pub servers: u32,
    /// The webhook sources by name and lane, or why `serve` would refuse them.
    pub webhook_sources: Result<Vec<(String, Lane)>, String>,
    /// `HOLDFAST_BADGE_ORIGINS`, as given.
    pub badge_origins: Vec<String>,
    /// Whether `serve` accepts its settings together, or why it refuses them.
    pub settings: Result<(), String>,
}

/// Redis connections one `holdfast serve` process opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConnections {
    /// Held for the process's life.
    pub steady: u64,
    /// At most at once, counting the short-lived ones.
    pub peak: u64,
    /// What the held ones are for, with their counts.
    pub held: Vec<(String, u64)>,
}

/// The Redis connections one `holdfast serve` opens, as the server is built
/// (kept in step with `server/src/startup.rs`, `server/src/workers.rs`,
/// `server/src/feed.rs` and `server/src/live/hub.rs`; `cli/tests/doctor.rs`
/// counts a real server's clients against it):
///
/// - one multiplexed connection shared by the API, badges, the dashboard and
///   the failover watch;
/// - one shared by the background workers on their own threads (the reaper,
///   scheduled reconciliation and verification, the counters' keepers), first
///   opened as the start-up reachability probe;
/// - one for webhook intake, so a payload of megabytes is never written
///   ahead of checkout calls on the shared one;
/// - one per write-behind part (`write_behind_workers`, two by default) and
///   one for the event feed, whose blocking stream reads would stall a shared
///   connection;
/// - one per ingestion lane consumer (every lane is consumed, with or without
///   sources);
/// - briefly, one each time the dashboard hub re-reads the streams' tails.
pub fn redis_connections_per_server(write_behind_workers: usize) -> RedisConnections {
    let consumers: Vec<String> = Lane::ALL
        .iter()
        .map(|lane| {
            format!(
                "{} {}",
                lane.as_str(),
                LaneConfig::default_for(*lane).concurrency.max(1)
            )
        })
        .collect();
    let consumer_count: u64 = Lane::ALL
        .iter()
        .map(|lane| LaneConfig::default_for(*lane).concurrency.max(1) as u64)
        .sum();
    let write_behind = write_behind_workers.max(1) as u64;
    let held = vec![
        ("shared".to_owned(), 1),
        ("background workers".to_owned(), 1),
        ("webhook intake".to_owned(), 1),
        (format!("write-behind ({write_behind} parts)"), write_behind),
        ("event feed".to_owned(), 1),
        (
            format!("lane consumers ({})", consumers.join(", ")),
            consumer_count,
        ),
    ];
    let steady = held.iter().map(|(_, n)| n).sum();
    RedisConnections {
        steady,
        peak: steady + 1,
        held,
    }
}

/// Runs every check against `config`'s services and settings.
pub async fn run(config: &DoctorConfig) -> DoctorReport {
    let mut report = DoctorReport::default();
    let connected = redis_conn::connect(&config.redis_url).await;
    let reached = connected.is_ok();
    match connected {
        Ok(mut conn) => redis_checks(&mut report, &mut conn, config).await,
        Err(e) => {
            // The error's own advice is the action column's; keep the reason.
            let finding = match e {
                EngineError::RedisUnreachable { url, reason } => {
                    format!("cannot reach Redis at {url}: {reason}")
                }
                other => other.to_string(),
            };
            report.push(
                check::REDIS_REACHABLE,
                CheckLevel::Fail,
                format!("{finding}; the other Redis checks could not run"),
                "Start Redis or point REDIS_URL at one that answers, then run `holdfast doctor` again",
            )
        }
    }
    report.checks.push(redis_tls(&config.redis_url, reached));
    postgres_checks(&mut report, config).await;
    report.checks.push(webhook_sources(&config.webhook_sources));
    report.checks.push(badge_origins(&config.badge_origins));
    report.checks.push(match &config.settings {
        Ok(()) => line(
            check::SETTINGS,
            CheckLevel::Pass,
            "`holdfast serve` accepts these settings together".to_owned(),
            "",
        ),
        Err(why) => line(
            check::SETTINGS,
            CheckLevel::Fail,
            format!("`holdfast serve` refuses to start: {why}"),
            "Change the settings it names",
        ),
    });
    report
}

fn line(name: &str, level: CheckLevel, finding: String, action: &str) -> DoctorCheck {
    DoctorCheck {
        name: name.to_owned(),
        level,
        finding,
        action: action.to_owned(),
    }
}

/// A setting from `CONFIG GET`, or `None` when the command is refused (some
/// managed services rename or forbid it).
async fn config_get(conn: &mut RedisConn, name: &str) -> Option<String> {
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await
        .ok()?;
    pair.get(1).cloned()
}

fn number(info: &HashMap<String, String>, field: &str) -> Option<u64> {
    info.get(field).and_then(|v| v.parse().ok())
}

async fn redis_checks(report: &mut DoctorReport, conn: &mut RedisConn, c: &DoctorConfig) {
    let info = match redis_conn::info(conn, REDIS_TIMEOUT).await {
        Ok(info) => info,
        Err(reason) => {
            report.push(
                check::REDIS_REACHABLE,
                CheckLevel::Fail,
                format!(
                    "{} answered PING but not INFO: {reason}",
                    redact_url(&c.redis_url)
                ),
                "Allow INFO for Holdfast's Redis user (its ACL), then run `holdfast doctor` again",
            );
            return;
        }
    };
    report.push(
        check::REDIS_REACHABLE,
        CheckLevel::Pass,
        format!(
            "Redis {} at {} answered",
            info.get("redis_version").map_or("?", String::as_str),
            redact_url(&c.redis_url)
        ),
        "",
    );
    // The same rule `serve` applies at start-up, never overridden here: the
    // doctor reports what the override would hide.
    report.checks.push(eviction(
        redis_conn::check_eviction_policy(conn, &c.redis_url, false).await,
    ));
    let aof = info.get("aof_enabled").map(|v| v == "1");
    let save = config_get(conn, "save").await;
    let fsync = config_get(conn, "appendfsync").await;
    report
        .checks
        .push(persistence(aof, save.as_deref(), fsync.as_deref()));
    let maxclients = match number(&info, "maxclients") {
        Some(n) => Some(n),
        // INFO names it only from Redis 7 on.
        None => config_get(conn, "maxclients")
            .await
            .and_then(|v| v.parse().ok()),
    };
    // This check's own connection is not a client of the deployment.
    let others = number(&info, "connected_clients").map(|n| n.saturating_sub(1));
    report.checks.push(maxclients_line(
        maxclients,
        others,
        c.servers,
        &redis_connections_per_server(c.write_behind_workers),
    ));
    report.checks.push(memory(
        number(&info, "used_memory"),
        number(&info, "maxmemory"),
        number(&info, "total_system_memory"),
    ));
    report.checks.push(match clock_skew(conn).await {
        Ok((skew_ms, rtt)) => skew_line(skew_ms, rtt),
        Err(e) => line(
            check::CLOCK_SKEW,
            CheckLevel::Warn,
            format!("could not read Redis' TIME: {}", one_line(&e.to_string())),
            "Compare the clocks by hand (`redis-cli TIME` and `date +%s`); run NTP on both hosts",
        ),
    });
}

fn eviction(result: Result<EvictionCheck, EngineError>) -> DoctorCheck {
    let name = check::REDIS_EVICTION;
    let fix = "Set `maxmemory-policy noeviction` (CONFIG SET and redis.conf); `holdfast serve` \
               refuses to start on this Redis unless --allow-evicting-redis is given";
    let evicting = |policy: &str| {
        let deletes = if policy.starts_with("volatile") {
            "deletes keys with a lifetime under memory pressure: feed event guards (a \
             redelivered event applies twice), per-buyer counters (the limit lifts), ended-hold \
             tombstones (a retry holds twice) and lock leases"
        } else {
            "deletes any key under memory pressure: stock counters (SKUs read as not warmed), \
             holds (reserved units leak) and every guard"
        };
        line(
            name,
            CheckLevel::Fail,
            format!("maxmemory-policy is {policy}, which {deletes}"),
            fix,
        )
    };
    match result {
        Ok(EvictionCheck::Safe(policy)) => line(
            name,
            CheckLevel::Pass,
            format!("maxmemory-policy is {policy}: Redis refuses writes rather than delete keys"),
            "",
        ),
        Ok(EvictionCheck::Overridden(policy)) => evicting(&policy),
        Ok(EvictionCheck::Unknown(reason)) => line(
            name,
            CheckLevel::Warn,
            format!("could not read maxmemory-policy ({reason})"),
            "Check it in the provider's console or redis.conf: it must be noeviction",
        ),
        Err(EngineError::EvictingRedis { policy, .. }) => evicting(&policy),
        Err(e) => line(
            name,
            CheckLevel::Fail,
            format!("could not check maxmemory-policy: {e}"),
            fix,
        ),
    }
}

const AFTER_A_LOSS: &str = "After any Redis restart run `holdfast warm` (rebuilds missing counters \
     from PostgreSQL) and then `holdfast reconcile` (repairs drift)";

/// The persistence line from `aof_enabled`, `CONFIG GET save` and
/// `CONFIG GET appendfsync` (`None`: unknown).
fn persistence(aof: Option<bool>, save: Option<&str>, fsync: Option<&str>) -> DoctorCheck {
    let name = check::REDIS_PERSISTENCE;
    let rdb = match save.map(str::trim) {
        Some("") => "RDB snapshots off".to_owned(),
        Some(s) => format!("RDB snapshots on (save {s})"),
        None => "RDB schedule unknown (CONFIG refused)".to_owned(),
    };
    match aof {
        Some(true) => {
            let fsync = fsync.unwrap_or("unknown");
            if fsync == "no" {
                line(
                    name,
                    CheckLevel::Warn,
                    format!(
                        "AOF on with appendfsync no (the OS flushes, often every 30 s); {rdb}: a \
                         host crash loses that long of sales and holds from Redis"
                    ),
                    "Set `appendfsync everysec` (at most about a second lost)",
                )
            } else {
                line(
                    name,
                    CheckLevel::Pass,
                    format!(
                        "AOF on (appendfsync {fsync}); {rdb}: a restart keeps counters and holds"
                    ),
                    "",
                )
            }
        }
        _ => {
            let aof_state = if aof.is_none() {
                "AOF state unknown"
            } else {
                "AOF off"
            };
            let loses = if save.is_some_and(|s| !s.trim().is_empty()) {
                "a restart rolls Redis back to its last snapshot: holds, sales and stock changes \
                 since then are lost or undone in Redis, and sales not yet written to PostgreSQL \
                 are lost"
            } else {
                "a Redis restart loses every counter and hold: reservations answer \"not warmed\", \
                 confirms of lost holds answer 410, and sales not yet written to PostgreSQL are lost"
            };
            line(
                name,
                CheckLevel::Warn,
                format!("{aof_state}, {rdb}: {loses}"),
                &format!("Turn AOF on (`appendonly yes`, `appendfsync everysec`). {AFTER_A_LOSS}"),
            )
        }
    }
}

/// The `maxclients` line: `others` clients connected now besides this check,
/// `servers` servers each opening `need`.
fn maxclients_line(
    maxclients: Option<u64>,
    others: Option<u64>,
    servers: u32,
    need: &RedisConnections,
) -> DoctorCheck {
    let name = check::REDIS_MAXCLIENTS;
    let servers = u64::from(servers.max(1));
    let per_server = format!(
        "one server opens up to {} ({} held: {}; plus up to {} briefly)",
        need.peak,
        need.steady,
        need.held
            .iter()
            .map(|(what, n)| format!("{what} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        need.peak - need.steady
    );
    let Some(maxclients) = maxclients.filter(|m| *m > 0) else {
        return line(
            name,
            CheckLevel::Warn,
            format!("could not read maxclients; {per_server}"),
            "Check maxclients in redis.conf or the provider's console",
        );
    };
    let others = others.unwrap_or(0);
    // Servers already running are among `others`; one more must still fit, and
    // so must the whole fleet started from nothing.
    let projected = (others + need.peak).max(servers * need.peak);
    let percent = projected * 100 / maxclients;
    let finding = format!(
        "maxclients {maxclients}, {others} other client(s) connected now; {per_server}; \
         {servers} server(s) need {}; projected {projected} ({percent}% of maxclients)",
        servers * need.peak
    );
    if projected > maxclients {
        line(
            name,
            CheckLevel::Fail,
            finding,
            "Raise maxclients (and the Redis host's open-file limit), or run fewer servers: \
             Redis refuses connections past it and a server cannot start its workers",
        )
    } else if percent > MAXCLIENTS_WARN_PERCENT {
        line(
            name,
            CheckLevel::Warn,
            finding,
            "Raise maxclients before the drop: operator commands, monitoring and a restarting \
             server each need connections too",
        )
    } else {
        line(name, CheckLevel::Pass, finding, "")
    }
}

fn mib(bytes: u64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if mib < 1024.0 {
        format!("{mib:.1} MiB")
    } else {
        format!("{:.1} GiB", mib / 1024.0)
    }
}

/// The memory line from `used_memory`, `maxmemory` and `total_system_memory`.
fn memory(used: Option<u64>, max: Option<u64>, system: Option<u64>) -> DoctorCheck {
    let name = check::REDIS_MEMORY;
    let Some(used) = used else {
        return line(
            name,
            CheckLevel::Warn,
            "INFO did not report used_memory".to_owned(),
            "Check Redis' memory use by hand before the drop",
        );
    };
    match max {
        Some(max) if max > 0 => {
            let free = max.saturating_sub(used);
            let percent = free * 100 / max;
            let finding = format!(
                "{} used of maxmemory {}: {percent}% free",
                mib(used),
                mib(max)
            );
            if percent < MEMORY_FAIL_HEADROOM_PERCENT {
                line(
                    name,
                    CheckLevel::Fail,
                    finding,
                    "Raise maxmemory (or move Redis to a larger host) before the drop: at the limit \
                     noeviction refuses every write, so every reservation fails",
                )
            } else if percent < MEMORY_WARN_HEADROOM_PERCENT {
                line(
                    name,
                    CheckLevel::Warn,
                    finding,
                    "Raise maxmemory: holds, buyer counters and events of a drop come on top of \
                     the catalogue",
                )
            } else {
                line(name, CheckLevel::Pass, finding, "")
            }
        }
        _ => {
            let host = match system.filter(|s| *s > 0) {
                Some(system) => format!(
                    "{} used of the host's {} ({}%)",
                    mib(used),
                    mib(system),
                    used * 100 / system
                ),
                None => format!("{} used", mib(used)),
            };
            let crowded = system.is_some_and(|s| s > 0 && used * 100 / s > 80);
            line(
                name,
                if crowded {
                    CheckLevel::Fail
                } else {
                    CheckLevel::Warn
                },
                format!(
                    "no maxmemory (0, unlimited); {host}: Redis grows until the OS kills it \
                     (out-of-memory killer) and every counter and hold goes with it"
                ),
                "Set maxmemory below the host's memory, leaving room for the fork that \
                 persistence makes (e.g. 60% of RAM), with maxmemory-policy noeviction",
            )
        }
    }
}

/// Redis' clock minus this host's, in milliseconds, and the round trip it was
/// measured over (the best of three: the shortest round trip bounds the error).
async fn clock_skew(conn: &mut RedisConn) -> Result<(i64, Duration), EngineError> {
    let mut best: Option<(i64, Duration)> = None;
    for _ in 0..3 {
        let sent = SystemTime::now();
        let started = Instant::now();
        let (secs, micros): (String, String) = redis::cmd("TIME").query_async(conn).await?;
        let rtt = started.elapsed();
        let parse = |s: &str| {
            s.parse::<i64>()
                .map_err(|_| EngineError::UnexpectedReply(format!("TIME answered {s:?}")))
        };
        let redis_ms = parse(&secs)? * 1_000 + parse(&micros)? / 1_000;
        // Redis read its clock about half-way through the round trip.
        let local_ms = (sent + rtt / 2)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        if best.is_none_or(|(_, r)| rtt < r) {
            best = Some((redis_ms - local_ms, rtt));
        }
    }
    best.ok_or_else(|| EngineError::UnexpectedReply("no TIME sample".into()))
}

fn skew_line(skew_ms: i64, rtt: Duration) -> DoctorCheck {
    let name = check::CLOCK_SKEW;
    let way = if skew_ms >= 0 { "ahead of" } else { "behind" };
    let finding = format!(
        "Redis' clock is {} ms {way} this host's (± {} ms, measured over a {:.1} ms round trip)",
        skew_ms.unsigned_abs(),
        rtt.as_millis().div_ceil(2),
        rtt.as_secs_f64() * 1_000.0
    );
    let why = "Run NTP (chrony or systemd-timesyncd) on both hosts: hold deadlines and event \
               times come from Redis' clock, while the write-behind's lag, `holdfast verify`'s \
               lag check and shoppers' countdowns compare them with other clocks";
    let abs = u128::from(skew_ms.unsigned_abs());
    if abs > SKEW_FAIL.as_millis() {
        line(name, CheckLevel::Fail, finding, why)
    } else if abs > SKEW_WARN.as_millis() {
        line(name, CheckLevel::Warn, finding, why)
    } else {
        line(name, CheckLevel::Pass, finding, "")
    }
}

/// Whether `host` names this machine: loopback addresses and `localhost`.
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

const TUNNEL: &str = "keep it on a private network, or reach it through a TLS tunnel \
     (stunnel, spiped, an SSH tunnel) whose loopback end Holdfast connects to";

/// The `redis tls` line for `url`; `reached`: whether a connection was made,
/// so a TLS URL is only called verified when a handshake actually verified.
fn redis_tls(url: &str, reached: bool) -> DoctorCheck {
    // A cluster named by seeds: TLS and credentials come from the first.
    let url = url.split(',').next().unwrap_or(url).trim();
    let name = check::REDIS_TLS;
    let shown = redact_url(url);
    let client = match redis_conn::client(url) {
        Ok(client) => client,
        Err(e) => {
            return line(
                name,
                CheckLevel::Fail,
                format!("cannot read {shown}: {e}"),
                "Fix REDIS_URL",
            );
        }
    };
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Unix(path) => line(
            name,
            CheckLevel::Pass,
            format!(
                "Unix socket {}: traffic stays on this machine",
                path.display()
            ),
            "",
        ),
        redis::ConnectionAddr::Tcp(host, _) if is_loopback(host) => line(
            name,
            CheckLevel::Pass,
            format!("{shown} is loopback: traffic stays on this machine"),
            "",
        ),
        redis::ConnectionAddr::Tcp(host, _) => line(
            name,
            CheckLevel::Warn,
            format!(
                "{host} is reached over plain TCP: stock, holds and the Redis password cross \
                 the network unencrypted"
            ),
            &format!("Use rediss:// (Redis with tls-port), or {TUNNEL}"),
        ),
        redis::ConnectionAddr::TcpTls { insecure: true, .. } => line(
            name,
            CheckLevel::Fail,
            format!(
                "{shown} asks for TLS without checking the certificate (#insecure), which \
                 Holdfast refuses: anyone in between could pose as Redis"
            ),
            "Drop #insecure and name the server's CA with ?ssl_ca_certs=/path/ca.pem",
        ),
        redis::ConnectionAddr::TcpTls { .. } if !reached => line(
            name,
            CheckLevel::Warn,
            format!(
                "{shown} is set to use TLS with certificate checks, but no connection was \
                 made, so the certificate is not checked yet"
            ),
            "Fix what `redis reachable` says, then run `holdfast doctor` again",
        ),
        _ => line(
            name,
            CheckLevel::Pass,
            format!("{shown} uses TLS, certificate and host name verified"),
            "",
        ),
    }
}

/// What the PostgreSQL connection reported, for the lines after it.
struct PgFacts {
    version: String,
    max_connections: u64,
    superuser_reserved: u64,
    reserved: u64,
    open: u64,
    superuser: bool,
    ssl: Option<bool>,
}

async fn pg_facts(pool: &sqlx::PgPool) -> Result<PgFacts, EngineError> {
    // `reserved_connections` exists from PostgreSQL 16 on; `true` makes an older
    // server answer NULL instead of an error.
    let row: (String, i32, i32, i32, i64, Option<bool>, Option<bool>) = sqlx::query_as(
        "SELECT current_setting('server_version'),
                current_setting('max_connections')::int,
                current_setting('superuser_reserved_connections')::int,
                COALESCE(current_setting('reserved_connections', true), '0')::int,
                (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
                (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
                (SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid())",
    )
    .fetch_one(pool)
    .await?;
    let count = |n: i32| u64::try_from(n).unwrap_or(0);
    Ok(PgFacts {
        version: row.0,
        max_connections: count(row.1),
        superuser_reserved: count(row.2),
        reserved: count(row.3),
        open: u64::try_from(row.4).unwrap_or(0),
        superuser: row.5.unwrap_or(false),
        ssl: row.6,
    })
}

/// One connection to `options`, failing within a few seconds.
async fn pg_connect(options: PgConnectOptions) -> Result<sqlx::PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
}

async fn postgres_checks(report: &mut DoctorReport, c: &DoctorConfig) {
    let shown = redact_url(&c.database_url);
    let unreachable = |report: &mut DoctorReport, reason: String| {
        report.push(
            check::POSTGRES_REACHABLE,
            CheckLevel::Fail,
            format!("cannot reach PostgreSQL at {shown}: {reason}; the other PostgreSQL checks could not run"),
            "Start PostgreSQL or point DATABASE_URL at one that answers, then run `holdfast doctor` again",
        );
    };
    let options: PgConnectOptions = match c.database_url.parse() {
        Ok(o) => o,
        Err(e) => return unreachable(report, one_line(&e.to_string())),
    };
    let mut note = String::new();
    let pool = match pg_connect(options.clone()).await {
        Ok(pool) => pool,
        // A database that does not exist yet is no fault: `serve` creates it.
        // The server's settings can be read from the maintenance database.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("3D000") => {
            note = format!(
                " (database {} does not exist yet: `holdfast serve` creates it)",
                options.get_database().unwrap_or("?")
            );
            match pg_connect(options.clone().database("postgres")).await {
                Ok(pool) => pool,
                Err(e) => return unreachable(report, one_line(&e.to_string())),
            }
        }
        Err(e) => return unreachable(report, one_line(&e.to_string())),
    };
    let facts = match pg_facts(&pool).await {
        Ok(f) => f,
        Err(e) => return unreachable(report, one_line(&e.to_string())),
    };
    pool.close().await;
    report.push(
        check::POSTGRES_REACHABLE,
        CheckLevel::Pass,
        format!("PostgreSQL {} at {shown} answered{note}", facts.version),
        "",
    );
    report
        .checks
        .push(pg_connections(&facts, c.pg_pool_size, c.servers));
    report.checks.push(pg_tls(&options, &facts, &shown).await);
}

fn pg_connections(f: &PgFacts, pool: u32, servers: u32) -> DoctorCheck {
    let name = check::POSTGRES_CONNECTIONS;
    let servers = u64::from(servers.max(1));
    let need = u64::from(pool) * servers;
    let usable = f
        .max_connections
        .saturating_sub(f.superuser_reserved)
        .saturating_sub(f.reserved);
    let role = if f.superuser {
        " (Holdfast's role is a superuser and could use the reserved slots, but they are kept \
         for emergencies)"
    } else {
        ""
    };
    let finding = format!(
        "max_connections {} minus {} reserved for superusers{} leaves {usable}{role}; \
         {servers} server(s) × pool {pool} = {need}; {} open now",
        f.max_connections,
        f.superuser_reserved,
        if f.reserved > 0 {
            format!(" and {} reserved", f.reserved)
        } else {
            String::new()
        },
        f.open
    );
    if need > usable {
        line(
            name,
            CheckLevel::Fail,
            finding,
            "Raise max_connections (restart PostgreSQL), lower HOLDFAST_PG_MAX_CONNECTIONS, run \
             fewer servers, or put a pooler (PgBouncer, transaction mode) in between: the last \
             servers' pools would be refused connections under load",
        )
    } else if need + PG_OPERATOR_MARGIN > usable {
        line(
            name,
            CheckLevel::Warn,
            format!("{finding}; fewer than {PG_OPERATOR_MARGIN} left for operator commands"),
            "Leave room for `holdfast warm`/`reconcile`/`verify` (4 each), psql and monitoring: \
             raise max_connections or lower the pool",
        )
    } else {
        line(name, CheckLevel::Pass, finding, "")
    }
}

fn ssl_mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

async fn pg_tls(options: &PgConnectOptions, f: &PgFacts, shown: &str) -> DoctorCheck {
    let name = check::POSTGRES_TLS;
    let mode = ssl_mode_name(options.get_ssl_mode());
    if let Some(socket) = options.get_socket() {
        return line(
            name,
            CheckLevel::Pass,
            format!(
                "Unix socket {}: traffic stays on this machine",
                socket.display()
            ),
            "",
        );
    }
    let host = options.get_host();
    if is_loopback(host) {
        return line(
            name,
            CheckLevel::Pass,
            format!("{host} is loopback: traffic stays on this machine (sslmode={mode})"),
            "",
        );
    }
    if f.ssl == Some(true) {
        return if matches!(options.get_ssl_mode(), PgSslMode::VerifyFull) {
            line(
                name,
                CheckLevel::Pass,
                format!(
                    "TLS in use to {host}, certificate and host name verified (sslmode={mode})"
                ),
                "",
            )
        } else {
            line(
                name,
                CheckLevel::Warn,
                format!(
                    "TLS in use to {host}, but sslmode={mode} does not verify who answers \
                     (a man in the middle can read and change the record)"
                ),
                "Set sslmode=verify-full (and sslrootcert) in DATABASE_URL",
            )
        };
    }
    // Find out whether the server offers TLS, so the advice fits.
    let (why, action) = match pg_connect(options.clone().ssl_mode(PgSslMode::Require)).await {
        Ok(pool) => {
            pool.close().await;
            (
                "the server offers TLS".to_owned(),
                "Set sslmode=verify-full (and sslrootcert) in DATABASE_URL".to_owned(),
            )
        }
        Err(e) => (
            format!("asking for TLS failed: {}", one_line(&e.to_string())),
            format!("Enable ssl on the server and set sslmode=verify-full, or {TUNNEL}"),
        ),
    };
    line(
        name,
        CheckLevel::Warn,
        format!(
            "{shown} is reached without TLS (sslmode={mode}): orders, tokens' hashes and the \
             password cross the network unencrypted; {why}"
        ),
        &action,
    )
}

fn webhook_sources(sources: &Result<Vec<(String, Lane)>, String>) -> DoctorCheck {
    let name = check::WEBHOOK_SOURCES;
    match sources {
        Err(why) => line(
            name,
            CheckLevel::Fail,
            format!("HOLDFAST_INGEST_SOURCES is invalid: {why}; `holdfast serve` refuses to start"),
            "Fix the entry: name=lane:secret, lane orders or feeds, a secret of 16+ characters",
        ),
        Ok(list) if list.is_empty() => line(
            name,
            CheckLevel::Warn,
            "none configured: no supplier feed or order webhook can arrive (every webhook is \
             refused as unsigned or badly signed)"
                .to_owned(),
            "Add sources with HOLDFAST_INGEST_SOURCES=name=lane:secret (or --ingest-source), \
             unless stock changes only through warm-up and the API",
        ),
        Ok(list) => {
            let mut named: Vec<String> = list
                .iter()
                .map(|(source, lane)| format!("{source} → {}", lane.as_str()))
                .collect();
            named.sort();
            let silent: Vec<&str> = Lane::ALL
                .iter()
                .filter(|l| !list.iter().any(|(_, lane)| lane == *l))
                .map(|l| l.as_str())
                .collect();
            let silent = if silent.is_empty() {
                String::new()
            } else {
                format!("; no source feeds lane {}", silent.join(", "))
            };
            line(
                name,
                CheckLevel::Pass,
                format!("{} source(s): {}{silent}", list.len(), named.join(", ")),
                "",
            )
        }
    }
}

/// Why `origin` can never equal a browser's `Origin` header (`scheme://host[:port]`,
/// lower case, no path), which badges compare it with exactly.
fn origin_problem(origin: &str) -> Option<&'static str> {
    let origin = origin.trim().trim_end_matches('/');
    let Some((scheme, rest)) = origin.split_once("://") else {
        return Some("no http:// or https://");
    };
    if scheme != "http" && scheme != "https" {
        return Some("not http or https");
    }
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ', '*']) {
        return Some("a path, wildcard or space");
    }
    if origin.chars().any(|c| c.is_ascii_uppercase()) {
        return Some("upper-case letters (browsers send lower case)");
    }
    None
}

fn badge_origins(origins: &[String]) -> DoctorCheck {
    let name = check::BADGE_ORIGINS;
    let origins: Vec<&str> = origins
        .iter()
        .map(|o| o.trim())
        .filter(|o| !o.is_empty())
        .collect();
    if origins.is_empty() {
        return line(
            name,
            CheckLevel::Warn,
            "none configured: only this server's own pages can embed live stock badges".to_owned(),
            "Add the shop's origins with HOLDFAST_BADGE_ORIGINS=https://shop.example (or \
             --badge-origin), unless badges are not used",
        );
    }
    let bad: Vec<String> = origins
        .iter()
        .filter_map(|o| origin_problem(o).map(|why| format!("{o} ({why})")))
        .collect();
    if bad.is_empty() {
        line(
            name,
            CheckLevel::Pass,
            format!("{} origin(s): {}", origins.len(), origins.join(", ")),
            "",
        )
    } else {
        line(
            name,
            CheckLevel::Warn,
            format!("never matching a page: {}", bad.join(", ")),
            "Write each origin as a browser sends it: scheme and host (and port), lower case, \
             e.g. https://shop.example",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_off_warns_and_says_how_to_recover() {
        let off = persistence(Some(false), Some(""), Some("everysec"));
        assert_eq!(off.level, CheckLevel::Warn);
        assert!(off.action.contains("holdfast warm") && off.action.contains("reconcile"));
        assert!(off.finding.contains("loses every counter and hold"));
        let rdb = persistence(Some(false), Some("3600 1"), None);
        assert_eq!(rdb.level, CheckLevel::Warn);
        assert!(rdb.finding.contains("last snapshot"));
        let aof = persistence(Some(true), Some(""), Some("everysec"));
        assert_eq!(aof.level, CheckLevel::Pass);
        assert_eq!(
            persistence(Some(true), None, Some("no")).level,
            CheckLevel::Warn
        );
    }

    #[test]
    fn maxclients_thresholds() {
        let need = redis_connections_per_server(crate::record::DEFAULT_WORKERS);
        assert!(need.peak > need.steady);
        let level =
            |max, others, servers| maxclients_line(Some(max), Some(others), servers, &need).level;
        assert_eq!(level(10_000, 0, 1), CheckLevel::Pass);
        // 80% is fine, just past it warns, past 100% fails.
        assert_eq!(level(need.peak * 10, need.peak * 7, 1), CheckLevel::Pass);
        assert_eq!(
            level(need.peak * 10, need.peak * 7 + 1, 1),
            CheckLevel::Warn
        );
        assert_eq!(level(need.peak * 10, 0, 11), CheckLevel::Fail);
        assert_eq!(
            maxclients_line(None, None, 1, &need).level,
            CheckLevel::Warn
        );
    }

    #[test]
    fn memory_thresholds() {
        let mib = 1024 * 1024;
        assert_eq!(
            memory(Some(50 * mib), Some(100 * mib), None).level,
            CheckLevel::Pass
        );
        assert_eq!(
            memory(Some(70 * mib), Some(100 * mib), None).level,
            CheckLevel::Warn
        );
        assert_eq!(
            memory(Some(81 * mib), Some(100 * mib), None).level,
            CheckLevel::Fail
        );
        assert_eq!(
            memory(Some(mib), Some(0), Some(1_000 * mib)).level,
            CheckLevel::Warn
        );
        assert_eq!(
            memory(Some(900 * mib), Some(0), Some(1_000 * mib)).level,
            CheckLevel::Fail
        );
    }

    #[test]
    fn skew_thresholds() {
        let rtt = Duration::from_millis(1);
        assert_eq!(skew_line(3, rtt).level, CheckLevel::Pass);
        assert_eq!(skew_line(-251, rtt).level, CheckLevel::Warn);
        assert_eq!(skew_line(1_001, rtt).level, CheckLevel::Fail);
        assert!(skew_line(-300, rtt).finding.contains("behind"));
    }

    #[test]
    fn pg_connections_keep_the_reserved_slots_and_a_margin() {
        let facts = |max| PgFacts {
            version: "15".into(),
            max_connections: max,
            superuser_reserved: 3,
            reserved: 0,
            open: 1,
            superuser: false,
            ssl: None,
        };
        // 100 - 3 reserved = 97 usable.
        assert_eq!(pg_connections(&facts(100), 16, 1).level, CheckLevel::Pass);
        assert_eq!(
            pg_connections(&facts(100), 20, 4).level,
            CheckLevel::Pass,
            "80 + 10 ≤ 97"
        );
        assert_eq!(
            pg_connections(&facts(100), 16, 6).level,
            CheckLevel::Warn,
            "96 + 10 > 97"
        );
        assert_eq!(
            pg_connections(&facts(100), 16, 7).level,
            CheckLevel::Fail,
            "112 > 97"
        );
    }

    #[test]
    fn tls_passes_on_loopback_and_warns_beyond() {
        let tls = |url| redis_tls(url, true);
        assert_eq!(tls("redis://127.0.0.1:6379").level, CheckLevel::Pass);
        assert_eq!(tls("redis://localhost:6379").level, CheckLevel::Pass);
        assert_eq!(tls("redis://[::1]:6379").level, CheckLevel::Pass);
        assert_eq!(tls("unix:///run/redis.sock").level, CheckLevel::Pass);
        let remote = tls("redis://:pw@10.0.0.5:6379");
        assert_eq!(remote.level, CheckLevel::Warn);
        assert!(!remote.finding.contains("pw"), "no password shown");
        assert_eq!(tls("rediss://10.0.0.5:6379").level, CheckLevel::Pass);
        assert_eq!(
            tls("redis://127.0.0.1:7001,redis://127.0.0.1:7002").level,
            CheckLevel::Pass,
            "a cluster's seed list"
        );
        let unverified = redis_tls("rediss://10.0.0.5:6379", false);
        assert_eq!(
            unverified.level,
            CheckLevel::Warn,
            "not called verified without a connection: {}",
            unverified.finding
        );
        assert_eq!(
            redis_tls("rediss://10.0.0.5:6379/#insecure", false).level,
            CheckLevel::Fail,
            "an unverified certificate is refused, as serve refuses it"
        );
        let missing = tls("rediss://10.0.0.5:6379/?ssl_ca_certs=/nonexistent/ca.pem");
        assert_eq!(missing.level, CheckLevel::Fail);
        assert!(
            missing.finding.contains("/nonexistent/ca.pem"),
            "{}",
            missing.finding
        );
        assert_eq!(
            tls("redis://10.0.0.5:6379/?ssl_ca_certs=/tmp/ca.pem").level,
            CheckLevel::Fail,
            "certificate files without TLS are a mistake"
        );
    }

    #[test]
    fn sources_and_origins() {
        assert_eq!(webhook_sources(&Ok(vec![])).level, CheckLevel::Warn);
        assert_eq!(
            webhook_sources(&Ok(vec![("erp".into(), Lane::Feeds)])).level,
            CheckLevel::Pass
        );
        assert_eq!(
            webhook_sources(&Err("entry 1".into())).level,
            CheckLevel::Fail
        );
        assert_eq!(badge_origins(&[]).level, CheckLevel::Warn);
        assert_eq!(
            badge_origins(&[
                "https://shop.example".into(),
                "http://127.0.0.1:8080/".into()
            ])
            .level,
            CheckLevel::Pass
        );
        for bad in [
            "shop.example",
            "https://shop.example/page",
            "https://Shop.example",
            "*",
        ] {
            assert_eq!(
                badge_origins(&[bad.into()]).level,
                CheckLevel::Warn,
                "{bad}"
            );
        }
    }
}
