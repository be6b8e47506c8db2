//! Command-line flags and environment variables, with defaults that run locally.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379", global = true)]
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
    #[arg(long, env = "HOLDFAST_ALLOW_EVICTING_REDIS", global = true)]
    pub allow_evicting_redis: bool,
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
    /// Load the demo drop into PostgreSQL if it is not there yet (never overwrites).
    #[arg(long, env = "HOLDFAST_DEMO")]
    pub demo: bool,
    /// Most PostgreSQL connections this process opens.
    #[arg(long, env = "HOLDFAST_PG_MAX_CONNECTIONS", default_value_t = 16)]
    pub pg_max_connections: u32,
}

impl ServeArgs {
    /// `serve`'s settings from the environment and defaults alone, for when no
    /// subcommand was given.
    pub fn from_env() -> Self {
        Self::parse_from(["holdfast"])
    }
}
