//! Command-line flags and environment variables, with defaults that run locally.

use std::net::SocketAddr;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

/// Holdfast keeps stock honest during flash sales: Redis decides every reservation
/// atomically, PostgreSQL keeps the record, and a live dashboard shows it all.
#[derive(Debug, Parser)]
#[command(name = "holdfast", version, about, long_about = None)]
pub struct Cli {
    /// Settings every command shares.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Settings every command shares.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Redis holding the live counters and holds.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    pub redis_url: String,
    /// PostgreSQL, the system of record. The database is created if it is missing.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/holdfast",
        global = true
    )]
    pub database_url: String,
    /// Log filter, in tracing's `EnvFilter` syntax (e.g. `info,holdfast_engine=debug`).
    #[arg(long, env = "HOLDFAST_LOG", default_value = "info", global = true)]
    pub log: String,
    /// Log output format.
    #[arg(long, env = "HOLDFAST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Start even if Redis may evict keys (`maxmemory-policy allkeys-*`). Evicted
    /// counters read as "not warmed" and evicted holds leak reserved units.
    #[arg(long, env = "HOLDFAST_ALLOW_EVICTING_REDIS", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue, global = true)]
    pub allow_evicting_redis: bool,
    /// Reservation rules.
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Reservation rules shared by every command that touches stock.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Hash-tag shards SKUs are spread over in Redis. Fixed per deployment:
    /// changing it moves every SKU's keys.
    #[arg(long, env = "HOLDFAST_REDIS_SHARDS", default_value_t = 16, global = true,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub redis_shards: u16,
    /// How long a hold lasts when the request names no TTL, in seconds.
    #[arg(
        long,
        env = "HOLDFAST_HOLD_TTL_SECS",
        default_value_t = 600,
        global = true
    )]
    pub hold_ttl_secs: u64,
    /// Longest hold a request may ask for, in seconds.
    #[arg(
        long,
        env = "HOLDFAST_MAX_HOLD_TTL_SECS",
        default_value_t = 3_600,
        global = true
    )]
    pub max_hold_ttl_secs: u64,
    /// Most units of one SKU in one reservation.
    #[arg(
        long,
        env = "HOLDFAST_MAX_QTY_PER_LINE",
        default_value_t = 10,
        global = true
    )]
    pub max_qty_per_line: i64,
}

impl EngineArgs {
    /// The engine configuration these flags describe.
    pub fn config(&self) -> holdfast_engine::EngineConfig {
        holdfast_engine::EngineConfig {
            shards: self.redis_shards,
            default_hold_ttl: std::time::Duration::from_secs(self.hold_ttl_secs),
            max_hold_ttl: std::time::Duration::from_secs(self.max_hold_ttl_secs),
            max_qty_per_line: self.max_qty_per_line,
            ..holdfast_engine::EngineConfig::default()
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// The operator commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the dashboard, the APIs and the background workers (the default).
    Serve(ServeArgs),
    /// Rebuild stock counters missing in Redis from PostgreSQL (after a Redis loss).
    Warm(WarmArgs),
    /// Measure drift between Redis and PostgreSQL, record it, and correct it.
    Reconcile(ReconcileArgs),
    /// Create, list and revoke API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Pause, resume and inspect ingestion lanes.
    #[command(subcommand)]
    Lane(LaneCommand),
    /// Inspect and replay webhook payloads that could not be applied.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(DeadLetterCommand),
    /// Add, list and change dashboard users.
    #[command(subcommand)]
    User(UserCommand),
    /// List, take and force-release locks.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Rehearse a drop: simulated shoppers through the HTTP API of a running
    /// Holdfast, a live view, then truth checks (non-zero exit when one fails).
    Simulate(SimulateArgs),
}

/// Settings for `holdfast simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The running Holdfast to drive.
    #[arg(long, env = "HOLDFAST_URL", default_value = "http://127.0.0.1:3000")]
    pub url: String,
    /// An API token with the checkout scope; without one a temporary token is
    /// created in PostgreSQL and revoked at the end.
    #[arg(long, env = "HOLDFAST_TOKEN")]
    pub token: Option<String>,
    /// Shoppers arriving in all.
    #[arg(long, default_value_t = 20_000)]
    pub shoppers: u64,
    /// Units on sale (a new SKU of its own is stocked with them).
    #[arg(long, default_value_t = 2_000)]
    pub units: i64,
    /// Use this new SKU code instead of a generated `SIM-…` one.
    #[arg(long)]
    pub sku: Option<String>,
    /// Arrivals per second at the peak.
    #[arg(long, default_value_t = 2_000.0)]
    pub peak_rps: f64,
    /// Seconds at the peak (a step from zero), before the decay.
    #[arg(long, default_value_t = 5.0)]
    pub peak_secs: f64,
    /// Seconds over which arrivals decay to about 5% of the peak (0: no decay).
    #[arg(long, default_value_t = 10.0)]
    pub decay_secs: f64,
    /// Share of holders who pay (after a think time).
    #[arg(long, default_value_t = 0.6)]
    pub confirm: f64,
    /// Share of holders who walk away, leaving the hold to expire; the rest release.
    #[arg(long, default_value_t = 0.25)]
    pub abandon: f64,
    /// Longest think time before paying or releasing, in ms (each shopper's is random).
    #[arg(long, default_value_t = 1_500)]
    pub think_ms: u64,
    /// Hold lifetime asked for, in seconds (abandoned holds expire after it).
    #[arg(long, default_value_t = 5)]
    pub hold_ttl_secs: u64,
    /// Share of reservations sent a second time with the same idempotency key.
    #[arg(long, default_value_t = 0.1)]
    pub retry: f64,
    /// Share of shoppers who try again after their first attempt.
    #[arg(long, default_value_t = 0.1)]
    pub repeat: f64,
    /// The SKU's per-buyer limit; shoppers ask for 1 up to this many units (0: no
    /// limit, one unit each).
    #[arg(long, default_value_t = 2)]
    pub per_buyer_limit: i64,
    /// Seed for the shoppers' choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Longest wait after the run for holds to end and sales to reach PostgreSQL.
    #[arg(long, default_value_t = 60)]
    pub settle_secs: u64,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Also write an SVG plot of throughput and latency over the run here.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

/// `holdfast lock …`.
#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// Show held locks with holder, remaining lease and fencing token.
    List,
    /// Take a lock and leave it held for `--ttl-secs` (e.g. hold `reconcile` to
    /// keep scheduled reconciliation off during maintenance). Prints the fencing
    /// token; fails if someone else holds it.
    Take {
        /// The lock's name.
        name: String,
        /// How long the lease lasts.
        #[arg(long, default_value_t = 600)]
        ttl_secs: u64,
    },
    /// Delete a lock whoever holds it; their fencing token becomes stale.
    ForceRelease {
        /// The lock's name.
        name: String,
    },
}

/// `holdfast user …`.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user. Prints a one-time password they replace at first sign-in,
    /// unless `--password-stdin` gives their password.
    Add {
        /// Login name: lower-case letters, digits, '.', '_' or '-'.
        username: String,
        /// viewer (read-only), support (may release holds) or admin.
        #[arg(long, default_value = "viewer")]
        role: String,
        /// Read the password from standard input (one line) instead.
        #[arg(long)]
        password_stdin: bool,
    },
    /// List users and their roles.
    List,
    /// Change a user's role.
    Role {
        /// The user.
        username: String,
        /// viewer, support or admin.
        role: String,
    },
    /// Give a user a new one-time password (ends their sessions).
    ResetPassword {
        /// The user.
        username: String,
    },
    /// Delete a user and end their sessions.
    Delete {
        /// The user.
        username: String,
    },
}

/// `holdfast lane …`.
#[derive(Debug, Subcommand)]
pub enum LaneCommand {
    /// Show every lane's backlog, pending payloads and state.
    Status,
    /// Stop a lane's consumers (payloads still queue, up to the lane's cap).
    Pause {
        /// `orders` or `feeds`.
        lane: String,
    },
    /// Let a paused lane's consumers run again.
    Resume {
        /// `orders` or `feeds`.
        lane: String,
    },
}

/// `holdfast dead-letters …`.
#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// Show the newest dead letters with their reasons.
    List {
        /// How many.
        #[arg(long, default_value_t = 20)]
        count: usize,
    },
    /// Put a dead letter back on its lane (after fixing its cause).
    Replay {
        /// Its id, as `list` shows it.
        id: String,
    },
}

/// `holdfast token …`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print its secret (shown only this once).
    Create {
        /// A name for people, e.g. `checkout-prod`.
        #[arg(long)]
        name: String,
        /// Comma-separated scopes: checkout, ingest, read.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
    },
    /// List tokens (never their secrets).
    List,
    /// Revoke a token by id; it stops working within seconds.
    Revoke {
        /// The token's id, as `list` shows it.
        id: i64,
    },
}

/// Settings for `holdfast warm`.
#[derive(Debug, Clone, Args)]
pub struct WarmArgs {
    /// Also rewrite existing counters' `available` from PostgreSQL and their live
    /// reserved, pending and settled figures.
    #[arg(long)]
    pub force: bool,
}

/// Settings for `holdfast reconcile`.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// Also correct negative drift (stranded units) up. Positive drift (Redis could
    /// oversell) is always corrected down.
    #[arg(long)]
    pub correct_up: bool,
}

/// Settings for `holdfast serve`.
#[derive(Debug, Clone, Parser)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "HOLDFAST_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// Folder holding the built site (`pkg/holdfast.js`, `.wasm`, `.css`).
    #[arg(long, env = "LEPTOS_SITE_ROOT", default_value = "target/site")]
    pub site_root: String,
    /// Load the demo drop into PostgreSQL if it is not there yet (never overwrites),
    /// and warm any stock counters missing in Redis.
    #[arg(long, env = "HOLDFAST_DEMO", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue)]
    pub demo: bool,
    /// With `--demo`: the password of the demo users `admin`, `support` and
    /// `viewer` (created if missing, never changed).
    #[arg(long, env = "HOLDFAST_DEMO_PASSWORD", default_value = "holdfast-demo")]
    pub demo_password: String,
    /// Most PostgreSQL connections this process opens.
    #[arg(long, env = "HOLDFAST_PG_MAX_CONNECTIONS", default_value_t = 16)]
    pub pg_max_connections: u32,
    /// Pause between reaper passes, in milliseconds (holds past their deadline are
    /// returned within about this long).
    #[arg(long, env = "HOLDFAST_REAPER_INTERVAL_MS", default_value_t = 500)]
    pub reaper_interval_ms: u64,
    /// Most overdue holds the reaper ends per shard per pass.
    #[arg(long, env = "HOLDFAST_REAPER_BATCH", default_value_t = 200)]
    pub reaper_batch: usize,
    /// Seconds between scheduled reconciliation runs (0: never).
    #[arg(long, env = "HOLDFAST_RECONCILE_EVERY_SECS", default_value_t = 60)]
    pub reconcile_every_secs: u64,
    /// Let scheduled runs correct negative drift (stranded units) up, too.
    #[arg(long, env = "HOLDFAST_RECONCILE_CORRECT_UP", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue)]
    pub reconcile_correct_up: bool,
    /// Most stream entries per shard in one write-behind transaction.
    #[arg(long, env = "HOLDFAST_WRITE_BEHIND_BATCH", default_value_t = 2_000)]
    pub write_behind_batch: usize,
    /// Webhook sources, `name=lane:secret` (lane `orders` or `feeds`; secret of 16+
    /// characters), comma-separated in the environment. None by default.
    #[arg(
        long = "ingest-source",
        env = "HOLDFAST_INGEST_SOURCES",
        value_delimiter = ','
    )]
    pub ingest_sources: Vec<String>,
    /// Most API requests per second per token (bursts of twice that); 0 for no limit.
    #[arg(long, env = "HOLDFAST_API_RATE", default_value_t = crate::api::DEFAULT_TOKEN_RATE)]
    pub api_rate: u32,
    /// Most webhooks per second per source (bursts of twice that); 0 for no limit.
    #[arg(long, env = "HOLDFAST_INGEST_RATE", default_value_t = crate::api::DEFAULT_SOURCE_RATE)]
    pub ingest_rate: u32,
    /// How long a sell-out is remembered in memory, answering further attempts
    /// without Redis (cleared at once when stock comes back); 0 turns it off.
    #[arg(long, env = "HOLDFAST_SOLD_OUT_CACHE_MS", default_value_t = 2_000)]
    pub sold_out_cache_ms: u64,
    /// Origins (`https://shop.example`) whose pages may embed live stock badges,
    /// comma-separated in the environment. This server's own pages always may.
    #[arg(
        long = "badge-origin",
        env = "HOLDFAST_BADGE_ORIGINS",
        value_delimiter = ','
    )]
    pub badge_origins: Vec<String>,
    /// Most live badge connections per client address.
    #[arg(
        long,
        env = "HOLDFAST_BADGE_MAX_CONNECTIONS_PER_CLIENT",
        default_value_t = 50
    )]
    pub badge_max_connections_per_client: usize,
    /// Most events per second the `feeds` lane applies (bulk syncs must not crowd
    /// out checkout); 0 for no limit.
    #[arg(long, env = "HOLDFAST_FEEDS_RATE", default_value_t = 5_000)]
    pub feeds_rate: u32,
}

impl ServeArgs {
    /// `serve`'s settings from the environment and defaults alone, for when no
    /// subcommand was given.
    pub fn from_env() -> Self {
        Self::parse_from(["holdfast"])
    }
}
