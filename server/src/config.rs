//! The server's settings from flags and environment variables, with defaults that
//! run locally: the connections every command shares ([`GlobalArgs`]), the
//! reservation rules ([`EngineArgs`]) and `serve`'s own flags ([`ServeArgs`]).

use std::net::SocketAddr;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args, Parser, ValueEnum};

/// Settings every command shares.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Redis holding the live counters and holds. `rediss://` speaks TLS and
    /// verifies the server against the system's roots or the CA file named by
    /// `?ssl_ca_certs=/path/ca.pem` (a client certificate: `&ssl_certfile=…&ssl_keyfile=…`);
    /// `user:password@` authenticates (ACL users too).
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        global = true
    )]
    pub redis_url: String,
    /// PostgreSQL, the system of record. The database is created if it is missing.
    /// TLS as libpq spells it: `?sslmode=verify-full&sslrootcert=/path/ca.pem`.
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
    /// Threads running requests and the live side (a server's background
    /// workers have their own: `serve --background-threads`); by default one
    /// per core this process may run on. Where Redis and PostgreSQL share the machine,
    /// one fewer leaves them a core: on two cores it cut the server's CPU by a
    /// fifth at 5,000 reservations/s with the same p99, but answered the first
    /// second of a step to 8,000 shoppers/s more slowly on one of two machines
    /// measured (BENCHMARKS.md), so measure before changing it.
    #[arg(long, env = "HOLDFAST_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..), global = true)]
    pub worker_threads: Option<u16>,
    /// Reservation rules.
    #[command(flatten)]
    pub engine: EngineArgs,
}

impl GlobalArgs {
    /// The runtime's worker threads: `--worker-threads`, or one per core this
    /// process may run on.
    pub fn runtime_workers(&self) -> usize {
        match self.worker_threads {
            Some(n) => usize::from(n),
            None => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        }
    }
}

/// Reservation rules shared by every command that touches stock.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Redis replicas that must hold a payment before it is answered as paid
    /// (Redis' WAIT, on a connection of its own, shared by concurrent payments):
    /// a paid hold then survives losing the master to a promoted replica (not a
    /// master restarted in place from old data, which the replica resyncs
    /// from: run masters with AOF, or let replicas take over). When
    /// fewer acknowledge in time the payment is answered 503 (it stands on the
    /// master; a retry waits again). 0: answered at once (a failover can lose
    /// the last moments of sales).
    #[arg(long, env = "HOLDFAST_CONFIRM_REPLICAS", default_value_t = 0, global = true,
          value_parser = clap::value_parser!(u32).range(0..=16))]
    pub confirm_replicas: u32,
    /// Longest wait for those acknowledgements, in milliseconds.
    #[arg(long, env = "HOLDFAST_CONFIRM_REPLICA_TIMEOUT_MS", default_value_t = 1_000, global = true,
          value_parser = clap::value_parser!(u64).range(10..=4_000))]
    pub confirm_replica_timeout_ms: u64,
    /// One-shard holds this process remembers (a few hundred bytes each), so that
    /// confirming or releasing a hold it made is one Redis call instead of two
    /// (a hold made by another server, or forgotten, is looked up first). 0:
    /// always look up.
    #[arg(
        long,
        env = "HOLDFAST_HOLD_CACHE",
        default_value_t = 200_000,
        global = true
    )]
    pub hold_cache: usize,
    /// Hash-tag shards SKUs are spread over in Redis. Fixed per deployment:
    /// changing it moves every SKU's keys.
    #[arg(long, env = "HOLDFAST_REDIS_SHARDS", default_value_t = holdfast_engine::keys::DEFAULT_SHARDS, global = true,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub redis_shards: u16,
    /// How long a hold lasts when the request names no TTL, in seconds.
    #[arg(long, env = "HOLDFAST_HOLD_TTL_SECS", default_value_t = 600, global = true,
          value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub hold_ttl_secs: u64,
    /// Longest hold a request may ask for, in seconds.
    #[arg(long, env = "HOLDFAST_MAX_HOLD_TTL_SECS", default_value_t = 3_600, global = true,
          value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub max_hold_ttl_secs: u64,
    /// Most units of one SKU in one reservation.
    #[arg(long, env = "HOLDFAST_MAX_QTY_PER_LINE", default_value_t = 10, global = true,
          value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub max_qty_per_line: i64,
    /// Failed dashboard sign-ins for one username from one client address per
    /// 15 minutes before even the right password waits (429) from there.
    #[arg(long, env = "HOLDFAST_LOGIN_FAILURES_PER_USER_AND_ADDRESS", default_value_t = holdfast_engine::users::LOGIN_FAILURES,
          global = true, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub login_failures_per_user_and_address: i64,
    /// Failed dashboard sign-ins for one username from all addresses per 15
    /// minutes before it waits (429) everywhere: stops guessing spread over
    /// many addresses.
    #[arg(long, env = "HOLDFAST_LOGIN_FAILURES_PER_USER", default_value_t = holdfast_engine::users::LOGIN_FAILURES_PER_USER,
          global = true, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub login_failures_per_user: i64,
    /// Failed dashboard sign-ins from one client address (any usernames) per
    /// 15 minutes before it waits (429).
    #[arg(long, env = "HOLDFAST_LOGIN_FAILURES_PER_ADDRESS", default_value_t = holdfast_engine::users::LOGIN_FAILURES_PER_ADDRESS,
          global = true, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub login_failures_per_address: i64,
    /// Most events one webhook payload may carry; a larger payload is
    /// dead-lettered whole.
    #[arg(long, env = "HOLDFAST_WEBHOOK_MAX_EVENTS", default_value_t = holdfast_engine::payload::DEFAULT_MAX_EVENTS,
          global = true, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub webhook_max_events: usize,
}

impl EngineArgs {
    /// Refuses rules that cannot work together: a default hold longer than
    /// the longest one allowed would refuse every reservation without a TTL.
    pub fn check(&self) -> Result<(), String> {
        if self.hold_ttl_secs > self.max_hold_ttl_secs {
            return Err(format!(
                "--hold-ttl-secs {} is longer than --max-hold-ttl-secs {}: every reservation \
                 without its own TTL would be refused",
                self.hold_ttl_secs, self.max_hold_ttl_secs
            ));
        }
        Ok(())
    }

    /// The engine configuration these flags describe.
    pub fn config(&self) -> holdfast_engine::EngineConfig {
        holdfast_engine::EngineConfig {
            shards: self.redis_shards,
            default_hold_ttl: std::time::Duration::from_secs(self.hold_ttl_secs),
            max_hold_ttl: std::time::Duration::from_secs(self.max_hold_ttl_secs),
            max_qty_per_line: self.max_qty_per_line,
            login_failures_per_user: self.login_failures_per_user,
            login_failures_per_user_and_address: self.login_failures_per_user_and_address,
            login_failures_per_address: self.login_failures_per_address,
            max_payload_events: self.webhook_max_events,
            confirm_replicas: self.confirm_replicas,
            confirm_replica_timeout: std::time::Duration::from_millis(
                self.confirm_replica_timeout_ms,
            ),
            hold_cache_entries: self.hold_cache,
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
    /// Folder holding the built site (`pkg/holdfast.js`, `.wasm`, `.css`);
    /// unused by a binary built with the site embedded (`scripts/run.sh --release`).
    #[arg(long, env = "LEPTOS_SITE_ROOT", default_value = "target/site")]
    pub site_root: String,
    /// Load the demo drop into PostgreSQL if it is not there yet (never overwrites),
    /// and warm any stock counters missing in Redis.
    #[arg(long, env = "HOLDFAST_DEMO", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue)]
    pub demo: bool,
    /// With `--demo`: the password of the demo users `admin`, `support` and
    /// `viewer` (created if missing, never changed).
    /// On a listen address that is not loopback, a password must be given.
    #[arg(long, env = "HOLDFAST_DEMO_PASSWORD", default_value = DEMO_PASSWORD)]
    pub demo_password: String,
    /// Most PostgreSQL connections this process opens.
    #[arg(long, env = "HOLDFAST_PG_MAX_CONNECTIONS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub pg_max_connections: u32,
    /// Pause between reaper passes, in milliseconds (holds past their deadline are
    /// returned within about this long).
    #[arg(long, env = "HOLDFAST_REAPER_INTERVAL_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub reaper_interval_ms: u64,
    /// Most overdue holds the reaper ends per shard per pass.
    #[arg(long, env = "HOLDFAST_REAPER_BATCH", default_value_t = 200,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub reaper_batch: usize,
    /// Seconds between scheduled reconciliation runs (0: never).
    #[arg(long, env = "HOLDFAST_RECONCILE_EVERY_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(0..=604_800))]
    pub reconcile_every_secs: u64,
    /// Let scheduled runs correct negative drift (stranded units) up, too.
    #[arg(long, env = "HOLDFAST_RECONCILE_CORRECT_UP", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue)]
    pub reconcile_correct_up: bool,
    /// Seconds between scheduled verifications (the truth check; its last result
    /// is in /metrics and on the dashboard); 0: never.
    #[arg(long, env = "HOLDFAST_VERIFY_EVERY_SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=604_800))]
    pub verify_every_secs: u64,
    /// Most stream entries per shard in one write-behind transaction.
    #[arg(long, env = "HOLDFAST_WRITE_BEHIND_BATCH", default_value_t = 2_000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub write_behind_batch: usize,
    /// While there is no backlog, the shortest time in milliseconds from one
    /// write-behind read to the next (after a full batch it reads at once):
    /// events gather into fewer, larger PostgreSQL transactions under a
    /// steady load, for at most this much more lag; 0: never wait.
    #[arg(long, env = "HOLDFAST_WRITE_BEHIND_GATHER_MS",
          default_value_t = holdfast_engine::record::DEFAULT_GATHER.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=1_000))]
    pub write_behind_gather_ms: u64,
    /// Threads the background workers (write-behind, reaper, ingestion lanes,
    /// reconciliation, verification) run on, apart from the request threads.
    #[arg(long, env = "HOLDFAST_BACKGROUND_THREADS", default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub background_threads: usize,
    /// Nice value added to the background threads' (0 to 19; 0: the request
    /// threads' priority). Where the CPUs are busy they then take what checkout
    /// leaves and lag instead of delaying requests; an idle CPU still runs them
    /// at once. 0 by default: on two cores shared with Redis and PostgreSQL,
    /// 10 did not lower checkout's p99 beyond noise and slowed the first
    /// second of a step to 8,000 shoppers/s in two of three runs
    /// (BENCHMARKS.md, 2026-12-07).
    #[arg(long, env = "HOLDFAST_BACKGROUND_NICE", default_value_t = 0,
          value_parser = clap::value_parser!(i32).range(0..=19))]
    pub background_nice: i32,
    /// Write-behind workers in this process, each recording its own share of
    /// the shards: while one commits in PostgreSQL another settles in Redis.
    /// Each holds a Redis connection, and a PostgreSQL one while it records a
    /// batch: fewer than `--pg-max-connections`, so the API always has one.
    #[arg(long, env = "HOLDFAST_WRITE_BEHIND_WORKERS",
          default_value_t = holdfast_engine::record::DEFAULT_WORKERS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub write_behind_workers: usize,
    /// Seconds a stream entry (a sale for the write-behind, a webhook for an
    /// ingestion lane) may stay pending on one server before another takes it
    /// over: how long a server that died mid-batch delays what it had read.
    /// Longer than a healthy batch ever takes, so a live server is never robbed.
    #[arg(long, env = "HOLDFAST_TAKEOVER_AFTER_SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub takeover_after_secs: u64,
    /// Webhook sources, `name=lane:secret` (lane `orders` or `feeds`; secret of 16+
    /// characters), comma-separated in the environment. None by default.
    #[arg(
        long = "ingest-source",
        env = "HOLDFAST_INGEST_SOURCES",
        value_delimiter = ','
    )]
    pub ingest_sources: Vec<String>,
    /// Most API requests per second per token (bursts of twice that); 0 for no limit.
    #[arg(long, env = "HOLDFAST_API_RATE", default_value_t = holdfast_engine::ratelimit::DEFAULT_TOKEN_RATE,
          value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub api_rate: u32,
    /// Most webhooks per second per source (bursts of twice that); 0 for no limit.
    #[arg(long, env = "HOLDFAST_INGEST_RATE", default_value_t = holdfast_engine::ratelimit::DEFAULT_SOURCE_RATE,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub ingest_rate: u32,
    /// How long a sell-out is remembered in memory, answering further attempts
    /// without Redis (cleared when the event feed shows stock coming back: the
    /// event's way there, plus up to --feed-gather-ms); 0 turns it off.
    #[arg(long, env = "HOLDFAST_SOLD_OUT_CACHE_MS", default_value_t = 2_000,
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub sold_out_cache_ms: u64,
    /// While events keep coming, the shortest time in milliseconds from one
    /// read of the event streams to the next (a backlog is read at once): the
    /// process's one reader (sold-out cache, badges, dashboards) costs Redis
    /// one read per this time instead of one per handful of events, and passes
    /// events on at most this much later; 0: never wait.
    #[arg(long, env = "HOLDFAST_FEED_GATHER_MS",
          default_value_t = crate::feed::DEFAULT_GATHER.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(0..=50))]
    pub feed_gather_ms: u64,
    /// Origins (`https://shop.example`) whose pages may embed live stock badges,
    /// comma-separated in the environment. This server's own pages always may.
    #[arg(
        long = "badge-origin",
        env = "HOLDFAST_BADGE_ORIGINS",
        value_delimiter = ','
    )]
    pub badge_origins: Vec<String>,
    /// Most live badge connections per client address.
    #[arg(long, env = "HOLDFAST_BADGE_MAX_CONNECTIONS_PER_CLIENT", default_value_t = 50,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub badge_max_connections_per_client: usize,
    /// A token `/metrics` requires (`Authorization: Bearer <token>`, as
    /// Prometheus' `authorization` setting sends it); unset: `/metrics` is
    /// open, so keep it on the monitoring network.
    #[arg(long, env = "HOLDFAST_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// Most SKUs one badge connection (or one poll) may follow.
    #[arg(long, env = "HOLDFAST_BADGE_MAX_SUBSCRIPTIONS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub badge_max_subscriptions: u64,
    /// Badge polls per second per client address (bursts of twice that); a
    /// socket's subscribe message counts as one.
    #[arg(long, env = "HOLDFAST_BADGE_POLLS_PER_SECOND", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub badge_polls_per_second: u32,
    /// Seconds a badge socket may stay silent (not even answering pings)
    /// before it is closed.
    #[arg(long, env = "HOLDFAST_BADGE_IDLE_TIMEOUT_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(5..=86_400))]
    pub badge_idle_timeout_secs: u64,
    /// Largest webhook body accepted, in bytes (413 above); every lane's byte
    /// cap must be at least this.
    #[arg(long, env = "HOLDFAST_WEBHOOK_MAX_BYTES", default_value_t = 2 * 1024 * 1024,
          value_parser = clap::value_parser!(u64).range(1_024..=64 * 1024 * 1024))]
    pub webhook_max_bytes: u64,
    /// Most payloads waiting per lane, `lane:count`, comma-separated in the
    /// environment (default orders:100000, feeds:20000).
    #[arg(long = "lane-cap", env = "HOLDFAST_LANE_CAPS", value_delimiter = ',')]
    pub lane_caps: Vec<String>,
    /// Most payload bytes waiting per lane, `lane:bytes`, comma-separated in
    /// the environment (default orders:67108864, feeds:268435456).
    #[arg(
        long = "lane-bytes-cap",
        env = "HOLDFAST_LANE_BYTE_CAPS",
        value_delimiter = ','
    )]
    pub lane_byte_caps: Vec<String>,
    /// Most events per second the `feeds` lane applies (bulk syncs must not crowd
    /// out checkout); 0 for no limit.
    #[arg(long, env = "HOLDFAST_FEEDS_RATE", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub feeds_rate: u32,
    /// Checkout calls a second on this server above which the `feeds` lane
    /// gives way to checkout (applies at most `--feeds-busy-rate` events a
    /// second until checkout has been quiet for a second); 0: it never gives way.
    #[arg(long, env = "HOLDFAST_FEEDS_YIELD_ABOVE", default_value_t = holdfast_engine::ingest::FEEDS_YIELD.above)]
    pub feeds_yield_above: u32,
    /// Most events a second the `feeds` lane applies while checkout is busy.
    #[arg(long, env = "HOLDFAST_FEEDS_BUSY_RATE", default_value_t = holdfast_engine::ingest::FEEDS_YIELD.rate,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub feeds_busy_rate: u32,
    /// Host names this server answers for (`shop.example`), comma-separated in
    /// the environment. IP addresses and `localhost` always work; a request for
    /// any other name is refused (421), which defeats DNS rebinding.
    #[arg(
        long = "public-host",
        env = "HOLDFAST_PUBLIC_HOSTS",
        value_delimiter = ','
    )]
    pub public_hosts: Vec<String>,
    /// Proxies (addresses or CIDR ranges, `10.0.0.0/8`) whose `X-Forwarded-For`
    /// or `Forwarded` header names the client, comma-separated in the
    /// environment. Every per-client limit uses that address. None by default:
    /// the TCP peer is the client.
    #[arg(
        long = "trusted-proxy",
        env = "HOLDFAST_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<String>,
    /// The dashboard is served over HTTPS (directly or by a TLS-terminating
    /// proxy): the session cookie becomes `__Host-holdfast_session` with
    /// `Secure`, and answers carry Strict-Transport-Security.
    #[arg(long, env = "HOLDFAST_SECURE_COOKIES", value_parser = BoolishValueParser::new(), action = ArgAction::SetTrue)]
    pub secure_cookies: bool,
    /// Seconds a client has to send a request's headers (also how long an idle
    /// keep-alive connection stays open).
    #[arg(long, env = "HOLDFAST_HEADER_READ_TIMEOUT_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub header_read_timeout_secs: u64,
    /// Seconds from a request's headers to its answer: the body must arrive
    /// and the answer start within it (408 otherwise).
    #[arg(long, env = "HOLDFAST_REQUEST_TIMEOUT_SECS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub request_timeout_secs: u64,
    /// Most client connections open at once, WebSockets included; more wait to
    /// be accepted. Lowered at start-up to what the open-file limit allows.
    #[arg(long, env = "HOLDFAST_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Most WebSockets (badges and dashboard tabs) open at once, out of
    /// --max-connections; past it a handshake is 503 with Retry-After. Unset:
    /// nine in ten of the connections, so requests always have a tenth.
    #[arg(long, env = "HOLDFAST_MAX_SOCKETS",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_sockets: Option<u64>,
    /// Most connections open at once from one client address (an IPv6 client
    /// counts as its /64; trusted proxies are exempt); more are closed at once.
    #[arg(long, env = "HOLDFAST_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections_per_address: u64,
    /// Largest API request body, in bytes (413 above; a 20-line cart is under
    /// 2 KiB).
    #[arg(long, env = "HOLDFAST_API_MAX_BODY_BYTES", default_value_t = crate::api::DEFAULT_BODY_LIMIT,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1_024..=1_048_576))]
    pub api_max_body_bytes: usize,
    /// Milliseconds within which every API and webhook request is answered
    /// (503 + `Retry-After` after; the work under an `Idempotency-Key` gets a
    /// sixth less, at most 500 ms less, to record its outcome).
    #[arg(long, env = "HOLDFAST_API_DEADLINE_MS", default_value_t = 3_000,
          value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub api_deadline_ms: u64,
    /// Checks of not-yet-known API tokens per client address per second
    /// (bursts of twice that), before any PostgreSQL lookup; a request with a
    /// token already being checked waits for that check and does not count.
    #[arg(long, env = "HOLDFAST_UNKNOWN_TOKENS_PER_SECOND", default_value_t = crate::http::auth::UNKNOWN_TOKENS_PER_ADDRESS,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub unknown_tokens_per_second: u32,
    /// Refused API token secrets remembered (answered without PostgreSQL; the
    /// oldest is forgotten first).
    #[arg(long, env = "HOLDFAST_REFUSED_TOKENS_REMEMBERED", default_value_t = holdfast_engine::tokens::REFUSED_REMEMBERED,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub refused_tokens_remembered: usize,
    /// Passwords hashed at once (each takes about 19 MiB and a thread); more
    /// sign-ins at the same moment are answered 429.
    #[arg(long, env = "HOLDFAST_PASSWORD_HASHES_AT_ONCE", default_value_t = holdfast_engine::users::DEFAULT_HASHES_AT_ONCE,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256))]
    pub password_hashes_at_once: usize,
    /// Seconds a WebSocket client (badge or dashboard) has to take one message
    /// before its socket is closed.
    #[arg(long, env = "HOLDFAST_SOCKET_SEND_TIMEOUT_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub socket_send_timeout_secs: u64,
    /// Largest message (and frame) a badge page may send, in bytes.
    #[arg(long, env = "HOLDFAST_BADGE_MAX_MESSAGE_BYTES", default_value_t = 4_096,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(256..=1_048_576))]
    pub badge_max_message_bytes: usize,
    /// Subscribe messages one badge socket may send at once; then
    /// `--badge-subscribes-per-second`.
    #[arg(long, env = "HOLDFAST_BADGE_SUBSCRIBE_BURST", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub badge_subscribe_burst: u32,
    /// Subscribe messages per second one badge socket may send after its burst.
    #[arg(long, env = "HOLDFAST_BADGE_SUBSCRIBES_PER_SECOND", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub badge_subscribes_per_second: u32,
    /// Largest message (and frame) a dashboard tab may send on `/live`, in bytes.
    #[arg(long, env = "HOLDFAST_LIVE_MAX_MESSAGE_BYTES", default_value_t = 16_384,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(256..=1_048_576))]
    pub live_max_message_bytes: usize,
    /// Seconds a dashboard socket may stay silent (not even answering pings)
    /// before it is closed.
    #[arg(long, env = "HOLDFAST_LIVE_IDLE_TIMEOUT_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(5..=86_400))]
    pub live_idle_timeout_secs: u64,
    /// Dashboard socket handshakes per client address per second (bursts of
    /// twice that), before any session lookup.
    #[arg(long, env = "HOLDFAST_LIVE_HANDSHAKES_PER_SECOND", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub live_handshakes_per_second: u32,
    /// Holdfast servers (`holdfast serve` processes) sharing this Redis and
    /// PostgreSQL, for the deployment checks (`holdfast doctor`, the
    /// operations page): PostgreSQL must fit that many pools, Redis that many
    /// servers' connections.
    #[arg(long, env = "HOLDFAST_SERVERS", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub servers: u32,
    /// Seconds one write to a client may wait (the client stopped reading
    /// an answer or a socket) before its connection is closed.
    #[arg(long, env = "HOLDFAST_WRITE_TIMEOUT_SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub write_timeout_secs: u64,
}

/// How often a socket silent for at most `idle` is pinged: at most
/// `default`, and at least twice within `idle`, so a client that answers
/// pings is never taken for gone.
pub fn ping_every(idle: std::time::Duration, default: std::time::Duration) -> std::time::Duration {
    default.min(idle / 2)
}

/// The published demo password: refused on a listen address other people can
/// reach.
pub const DEMO_PASSWORD: &str = "holdfast-demo";

impl ServeArgs {
    /// Refuses settings that would be unsafe together: the demo's published
    /// password on an address reachable from other machines.
    pub fn check(&self) -> Result<(), String> {
        let blank_env = std::env::var("HOLDFAST_METRICS_TOKEN").is_ok_and(|v| v.trim().is_empty());
        if self
            .metrics_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
            || blank_env
        {
            return Err(
                "--metrics-token (HOLDFAST_METRICS_TOKEN) is set but empty: /metrics would be \
                 open to anyone; give a token or unset it"
                    .into(),
            );
        }
        if self.api_deadline_ms > self.request_timeout_secs * 1_000 {
            return Err(format!(
                "--api-deadline-ms {} is longer than --request-timeout-secs {}: the connection \
                 would be cut before the API could answer",
                self.api_deadline_ms, self.request_timeout_secs
            ));
        }
        if self.write_behind_workers as u64 >= u64::from(self.pg_max_connections) {
            return Err(format!(
                "--write-behind-workers {} needs fewer than --pg-max-connections {}: each part \
                 holds a PostgreSQL connection while it records, and the API and warm-up need theirs",
                self.write_behind_workers, self.pg_max_connections
            ));
        }
        if self.demo && !self.listen.ip().is_loopback() && self.demo_password == DEMO_PASSWORD {
            return Err(format!(
                "--demo on {} would let anyone who can reach it sign in as admin with the published \
                 password; give --demo-password (HOLDFAST_DEMO_PASSWORD) or listen on 127.0.0.1",
                self.listen
            ));
        }
        Ok(())
    }

    /// The edge's settings these flags describe.
    pub fn edge(&self) -> Result<crate::http::edge::EdgeConfig, String> {
        use crate::http::edge::{Cidr, EdgeConfig};
        Ok(EdgeConfig {
            public_hosts: self
                .public_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            trusted_proxies: self
                .trusted_proxies
                .iter()
                .filter(|p| !p.trim().is_empty())
                .map(|p| Cidr::parse(p).map_err(|e| format!("--trusted-proxy {e}")))
                .collect::<Result<_, _>>()?,
            cookies: holdfast_app::server::guard::CookiePolicy {
                secure: self.secure_cookies,
            },
            header_read_timeout: std::time::Duration::from_secs(self.header_read_timeout_secs),
            request_timeout: std::time::Duration::from_secs(self.request_timeout_secs),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            max_sockets: self
                .max_sockets
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            max_connections_per_address: usize::try_from(self.max_connections_per_address)
                .unwrap_or(usize::MAX),
            write_timeout: std::time::Duration::from_secs(self.write_timeout_secs),
            api_max_body: self.api_max_body_bytes,
            api_deadline: crate::http::deadline::Deadline(std::time::Duration::from_millis(
                self.api_deadline_ms,
            )),
        })
    }

    /// What the deployment checks (`holdfast doctor`, the operations page)
    /// need to know of these settings and `global`'s services. Webhook
    /// sources are read exactly as `serve` reads them: whatever it would
    /// refuse, the checks report as failing.
    pub fn doctor_config(&self, global: &GlobalArgs) -> holdfast_engine::doctor::DoctorConfig {
        use crate::routes::ingest::IngestConfig;
        let webhook_sources = IngestConfig::parse(&self.ingest_sources)
            .map_err(|e| format!("--ingest-source {e}"))
            .map(|c| {
                c.sources
                    .into_iter()
                    .map(|(name, source)| (name, source.lane))
                    .collect()
            });
        holdfast_engine::doctor::DoctorConfig {
            redis_url: global.redis_url.clone(),
            database_url: global.database_url.clone(),
            pg_pool_size: self.pg_max_connections,
            write_behind_workers: self.write_behind_workers,
            servers: self.servers,
            webhook_sources,
            badge_origins: self.badge_origins.clone(),
            settings: global
                .engine
                .check()
                .and_then(|()| self.check())
                .and_then(|()| self.edge().map(drop))
                .and_then(|()| self.ingest().map(drop)),
        }
    }

    /// The webhook settings: sources, the largest body and the lanes' caps,
    /// checked together.
    pub fn ingest(&self) -> Result<crate::routes::ingest::IngestConfig, String> {
        crate::routes::ingest::IngestConfig::parse(&self.ingest_sources)
            .map_err(|e| format!("--ingest-source {e}"))?
            .with_max_body(usize::try_from(self.webhook_max_bytes).unwrap_or(usize::MAX))
            .and_then(|c| c.with_caps(&self.lane_caps, &self.lane_byte_caps))
    }

    /// `serve`'s settings from the environment and defaults alone, for when no
    /// subcommand was given.
    pub fn from_env() -> Self {
        Self::parse_from(["holdfast"])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `GlobalArgs` as a command of its own, to parse it alone.
    #[derive(Parser)]
    struct Global {
        #[command(flatten)]
        global: GlobalArgs,
    }

    #[test]
    fn worker_threads_are_one_per_core_unless_told() {
        let workers =
            |argv: &[&str]| Global::try_parse_from(argv).map(|g| g.global.runtime_workers());
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(workers(&["holdfast"]).unwrap(), cores);
        assert_eq!(workers(&["holdfast", "--worker-threads", "3"]).unwrap(), 3);
        assert!(
            workers(&["holdfast", "--worker-threads", "0"]).is_err(),
            "a runtime without workers runs nothing"
        );
    }

    #[test]
    fn the_published_demo_password_stays_on_loopback() {
        let args = |extra: &[&str]| {
            let mut argv = vec!["holdfast", "--demo"];
            argv.extend_from_slice(extra);
            ServeArgs::parse_from(argv)
        };
        assert!(args(&["--listen", "127.0.0.1:3000"]).check().is_ok());
        let open = args(&["--listen", "0.0.0.0:3000"]).check();
        assert!(open.unwrap_err().contains("--demo-password"));
        assert!(
            args(&[
                "--listen",
                "0.0.0.0:3000",
                "--demo-password",
                "holdfast-demo"
            ])
            .check()
            .is_err(),
            "naming the published password does not make it secret"
        );
        assert!(
            args(&[
                "--listen",
                "0.0.0.0:3000",
                "--demo-password",
                "a-private-one-42"
            ])
            .check()
            .is_ok()
        );
    }

    #[test]
    fn sockets_are_pinged_twice_within_their_allowed_silence() {
        use std::time::Duration;
        let default = Duration::from_secs(25);
        assert_eq!(ping_every(Duration::from_secs(60), default), default);
        assert_eq!(
            ping_every(Duration::from_secs(5), default),
            Duration::from_millis(2_500)
        );
    }

    #[test]
    fn an_api_deadline_past_the_request_timeout_is_refused() {
        let args = |ms: &str| {
            ServeArgs::parse_from([
                "holdfast",
                "--request-timeout-secs",
                "5",
                "--api-deadline-ms",
                ms,
            ])
        };
        assert!(args("5000").check().is_ok());
        assert!(
            args("5001")
                .check()
                .unwrap_err()
                .contains("--api-deadline-ms")
        );
    }

    #[test]
    fn write_behind_parts_leave_the_pool_a_connection() {
        let args = |parts: &str, pool: &str| {
            ServeArgs::parse_from([
                "holdfast",
                "--write-behind-workers",
                parts,
                "--pg-max-connections",
                pool,
            ])
        };
        assert!(ServeArgs::parse_from(["holdfast"]).check().is_ok());
        assert!(args("3", "4").check().is_ok());
        assert!(
            args("4", "4")
                .check()
                .unwrap_err()
                .contains("--write-behind-workers 4")
        );
    }

    #[test]
    fn edge_settings_are_parsed_and_bad_ranges_named() {
        let args = ServeArgs::parse_from([
            "holdfast",
            "--public-host",
            "Shop.Example",
            "--trusted-proxy",
            "10.0.0.0/8",
            "--secure-cookies",
        ]);
        let edge = args.edge().unwrap();
        assert_eq!(edge.public_hosts, vec!["shop.example".to_owned()]);
        assert!(edge.cookies.secure);
        assert!(edge.trusted_proxies[0].contains("10.9.9.9".parse().unwrap()));
        let bad = ServeArgs::parse_from(["holdfast", "--trusted-proxy", "10.0.0.0/99"]);
        assert!(bad.edge().unwrap_err().contains("--trusted-proxy"));
    }
}
