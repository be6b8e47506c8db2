//! The command line: `holdfast <command>` and each command's flags. The settings
//! the server itself needs (connections, reservation rules, `serve`'s flags) live
//! in [`holdfast_server::config`] and are flattened in here.

use clap::{Args, Parser, Subcommand};
pub use holdfast_server::config::{EngineArgs, GlobalArgs, LogFormat, ServeArgs};

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

/// The operator commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the dashboard, the APIs and the background workers (the default).
    Serve(Box<ServeArgs>),
    /// Rebuild stock counters missing in Redis from PostgreSQL (after a Redis loss).
    Warm(WarmArgs),
    /// Measure drift between Redis and PostgreSQL, record it, and correct it.
    Reconcile(ReconcileArgs),
    /// Check the truth on live data without stopping sales: counters, the
    /// conservation equation, holds and due sets, carts, the ledger, the
    /// write-behind's lag and the streams. Exits non-zero on any violation.
    Verify(VerifyArgs),
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
    /// Show how a SKU's stock is split over Redis shards, or split it into
    /// parts (one hot SKU beyond one Redis core), between drops: refused while
    /// it has open holds or sales not yet written to PostgreSQL.
    Split(SplitArgs),
    /// Drops: import and export them as files (CSV, JSON), schedule their start
    /// and end (to the second, by Redis' clock on every server), arm them and
    /// check their readiness.
    #[command(subcommand)]
    Drop(DropCommand),
    /// Rehearse a drop: simulated shoppers through the HTTP API of a running
    /// Holdfast, a live view, then truth checks (non-zero exit when one fails).
    Simulate(SimulateArgs),
    /// Check a deployment before a drop: Redis' eviction policy, persistence,
    /// maxclients, memory headroom and clock, PostgreSQL's max_connections
    /// against the pools, TLS, webhook sources and badge origins. Prints a
    /// table of pass / warn / fail with what to do. Only reads: nothing is
    /// created, migrated or written.
    #[command(after_help = DOCTOR_EXIT_CODES)]
    Doctor(Box<DoctorArgs>),
}

/// The exit codes of `holdfast doctor`, shown under its `--help`.
pub const DOCTOR_EXIT_CODES: &str = "\
Exit codes (the worst line decides):
  0  every line passed, or some warned (warnings are printed; see --strict)
  1  some line warned and --strict was given (or doctor itself could not run)
  2  some line failed: fix it before the drop (a malformed command line also exits 2)";

/// Settings for `holdfast doctor`: its own flags, and `serve`'s settings read
/// exactly as `serve` reads them (flags and environment), so the checks see the
/// pool size, webhook sources, badge origins and number of servers
/// (`--servers`) the deployment will run with.
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Exit 1 when any line warns (by default warnings are printed and the exit
    /// code is 0).
    #[arg(long)]
    pub strict: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// `serve`'s settings.
    #[command(flatten, next_help_heading = "Settings read as `serve` reads them")]
    pub serve: ServeArgs,
}

/// Settings for `holdfast simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The running Holdfast to drive; several servers of one deployment as
    /// several `--url`s (or a comma-separated list): shoppers are spread over
    /// them, and each one's retry and payment go to another server than its
    /// reservation.
    #[arg(
        long,
        env = "HOLDFAST_URL",
        default_value = "http://127.0.0.1:3000",
        value_delimiter = ',',
        num_args = 1
    )]
    pub url: Vec<String>,
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
    /// Connections to each server, opened before the first shopper arrives
    /// and kept, as a load balancer holds its pool of backend connections (up
    /// to 1,024): at most this many requests are in flight to each server, and
    /// a request waits for a free connection (its latency counting from the
    /// shopper's arrival). With 0, shoppers open connections as they need
    /// them, as many as they like, so a sudden step also measures connection
    /// set-up.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub connections: u64,
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

/// `holdfast drop …`.
#[derive(Debug, Subcommand)]
pub enum DropCommand {
    /// Show a drop's start and end.
    Show {
        /// The drop's code.
        code: String,
    },
    /// Set when a drop starts and ends. Before the start its SKUs answer
    /// `not_started`, from the end `ended` (holds taken before then can still
    /// be paid); it takes effect at once on every server. A bound left out
    /// stays as it is.
    Schedule {
        /// The drop's code.
        code: String,
        /// The start, RFC 3339 (`2026-12-01T09:00:00Z`), or `none`.
        #[arg(long)]
        starts_at: Option<String>,
        /// The end, RFC 3339, or `none`.
        #[arg(long)]
        ends_at: Option<String>,
    },
    /// Create or update a drop from a CSV or JSON file (columns and fields in
    /// docs/drops.md). The whole file is checked first and every problem is
    /// printed by line and column; then it is written all or nothing. A SKU's
    /// `stock` is the units the drop is given: a change moves stock on hand by
    /// the difference, through the same atomic path as a feed, and importing
    /// the same file again changes nothing.
    Import {
        /// The file (`.csv` or `.json`; `-` reads standard input, see --format).
        file: String,
        /// The file's form when its name does not say: csv or json.
        #[arg(long)]
        format: Option<String>,
        /// Print what would change and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Why, for the audit log and each stock change.
        #[arg(long, default_value = "drop import")]
        reason: String,
    },
    /// Arm a drop before its start: warm the counters its SKUs lack, write its
    /// schedule and per-buyer limits into them, optionally pause the feeds lane,
    /// then check that it is ready (counters agree with PostgreSQL, Redis'
    /// eviction policy, write-behind, feeds lane, open holds, schedule). Exits 1
    /// when something is not ready.
    Arm {
        /// The drop's code.
        code: String,
        /// Pause the feeds lane too, so supplier feeds wait until after the rush.
        #[arg(long)]
        pause_feeds: bool,
    },
    /// Check a drop's readiness without changing anything (what `drop arm`
    /// checks). Exits 1 when something is not ready.
    Ready {
        /// The drop's code.
        code: String,
    },
    /// Print a drop's report: per SKU units sold, holds taken and how they ended
    /// (confirmed, released by shoppers or by support, expired, open), late
    /// payments, shortfalls, the busiest second and the time to sell out.
    Report {
        /// The drop's code.
        code: String,
        /// Print CSV instead of a table.
        #[arg(long)]
        csv: bool,
    },
    /// Print a drop as a file that `drop import` takes back unchanged.
    Export {
        /// The drop's code.
        code: String,
        /// csv or json.
        #[arg(long, default_value = "csv")]
        format: String,
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
        /// viewer (read-only), support (may release holds), merchandiser (may set up
        /// drops) or admin.
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
        /// viewer, support, merchandiser or admin.
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
        /// Comma-separated scopes: checkout, ingest, read, catalog.
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

/// Settings for `holdfast split`.
#[derive(Debug, Clone, Args)]
pub struct SplitArgs {
    /// The SKU.
    pub sku: String,
    /// Split it into this many parts on as many shards (1 to 16; 1 puts it
    /// back in one counter). Without it, the parts are shown.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub parts: Option<u16>,
}

/// Settings for `holdfast warm`.
#[derive(Debug, Clone, Args)]
pub struct WarmArgs {
    /// Also rewrite existing counters' `available` from PostgreSQL and their live
    /// reserved, pending and settled figures.
    #[arg(long)]
    pub force: bool,
}

/// Settings for `holdfast verify`.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// An event older than this many seconds not yet in PostgreSQL is a violation.
    #[arg(long, default_value_t = 60)]
    pub max_lag_secs: u64,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Settings for `holdfast reconcile`.
#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    /// Also correct negative drift (stranded units) up. Positive drift (Redis could
    /// oversell) is always corrected down.
    #[arg(long)]
    pub correct_up: bool,
    /// Lease on the `reconcile` lock, in seconds, renewed after every page. A run
    /// that stalls longer loses the lock and stops before writing anything more.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_secs: u64,
}
