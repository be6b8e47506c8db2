//! The server's settings from flags and environment variables, with defaults that
//! run locally: the connections every command shares ([`GlobalArgs`]), the
//! reservation rules ([`EngineArgs`]) and `serve`'s own flags ([`ServeArgs`]).

use std::net::SocketAddr;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, ValueEnum};

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
    /// Start even if Redis may evict keys (`maxmemory-policy` other than
    /// `noeviction`). Evicted counters read as "not warmed", evicted holds leak
    /// reserved units, evicted guards let a feed event or a retry apply twice.
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
    /// Seconds between scheduled verifications (the truth check; its last result
    /// is in /metrics and on the dashboard); 0: never.
    #[arg(long, env = "HOLDFAST_VERIFY_EVERY_SECS", default_value_t = 300)]
    pub verify_every_secs: u64,
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
    #[arg(long, env = "HOLDFAST_API_RATE", default_value_t = crate::http::ratelimit::DEFAULT_TOKEN_RATE)]
    pub api_rate: u32,
    /// Most webhooks per second per source (bursts of twice that); 0 for no limit.
    #[arg(long, env = "HOLDFAST_INGEST_RATE", default_value_t = crate::http::ratelimit::DEFAULT_SOURCE_RATE)]
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
