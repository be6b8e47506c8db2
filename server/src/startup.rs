//! Building the application once: connect to Redis and PostgreSQL (with checks
//! that fail in one readable line), load the demo drop when asked, start the
//! background workers, assemble the state and the router, and serve until told
//! to stop. `holdfast serve` and the tests use the same [`Application`].

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::Uri;
use axum::response::Response;
use holdfast_app::{App, shell};
use holdfast_domain::Lane;
use holdfast_engine::ingest::LaneConfig;
use holdfast_engine::pace::Yield;
use holdfast_engine::reaper::ReaperConfig;
use holdfast_engine::record::WriteBehindConfig;
use holdfast_engine::redis_conn::{self, EvictionCheck};
use holdfast_engine::users::{self, SignIn};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{Backends, EngineConfig, EngineError, catalog, postgres, redact_url};
use leptos::prelude::provide_context;
use leptos_axum::{AxumRouteListing, LeptosRoutes, generate_route_list};
use tokio::net::TcpListener;
use tower_http::trace::TraceLayer;

use crate::background::{Background, BackgroundConfig};
use crate::badge::BadgeConfig;
use crate::config::{GlobalArgs, ServeArgs};
use crate::http::deadline::Deadline;
use crate::http::edge::{ConnectionSlot, EdgeConfig};
use crate::http::per_address::PerAddress;
use crate::live::hub::LiveConfig;
use crate::state::{AppState, StateOptions, leptos_options};
use crate::workers::{WorkerConfig, WorkerStats, Workers};
use crate::{api, badge, live, routes};

/// Connects to Redis (checking its eviction policy) and PostgreSQL (creating the
/// database and migrating it), in that order.
pub async fn connect(
    redis_url: &str,
    database_url: &str,
    allow_evicting_redis: bool,
    pg_max_connections: u32,
    engine: EngineConfig,
) -> Result<Backends, EngineError> {
    let mut redis = redis_conn::connect(redis_url).await?;
    match redis_conn::check_eviction_policy(&mut redis, redis_url, allow_evicting_redis).await? {
        EvictionCheck::Safe(policy) => tracing::debug!(%policy, "Redis eviction policy is safe"),
        EvictionCheck::Overridden(policy) => tracing::warn!(
            %policy,
            url = %redact_url(redis_url),
            "Redis may evict stock counters; running anyway because --allow-evicting-redis was given"
        ),
        EvictionCheck::Unknown(reason) => tracing::warn!(
            %reason,
            "could not read Redis' maxmemory-policy; make sure it is noeviction"
        ),
    }
    let acks = engine.confirm_replicas > 0;
    let pg = postgres::connect_and_migrate(database_url, pg_max_connections).await?;
    let mut backends = Backends::new(pg, redis, engine);
    // A cluster whose master just died answers errors until a replica takes
    // over (a few seconds): wait for it rather than refuse to start.
    let patience = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match backends.engine.check_layout().await {
            Err(EngineError::Redis(e))
                if backends.redis.is_cluster() && tokio::time::Instant::now() < patience =>
            {
                tracing::warn!(error = %e, "Redis Cluster not ready yet (a failover under way?); retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => break other?,
        }
    }
    if acks {
        // WAIT blocks its connection: the acknowledgements get their own.
        let conn = redis_conn::connect(redis_url).await?;
        backends.engine = backends.engine.with_replica_acks(conn);
    }
    Ok(backends)
}

/// [`connect`] with the settings every command shares.
pub async fn connect_with(
    global: &GlobalArgs,
    pg_max_connections: u32,
) -> anyhow::Result<Backends> {
    Ok(connect(
        &global.redis_url,
        &global.database_url,
        global.allow_evicting_redis,
        pg_max_connections,
        global.engine.config(),
    )
    .await?)
}

/// The pages' route list, rendered once per process.
///
/// Listing the routes renders the app with resource loading suppressed, and
/// leptos keeps that switch in one process-wide flag (leptos issue 4773): a page
/// whose resource is first polled while another router in the same process is
/// being built waits for it forever, so the request ends in the 408 after the
/// request timeout. The list depends only on the app's code, so it is built once.
fn page_routes() -> Vec<AxumRouteListing> {
    static ROUTES: OnceLock<Vec<AxumRouteListing>> = OnceLock::new();
    ROUTES.get_or_init(|| generate_route_list(App)).clone()
}

/// Builds the whole HTTP surface: health probes, the API, webhooks, badges,
/// metrics, the live socket, the Leptos pages and server functions, and the
/// static site (WASM, JS, CSS, assets).
pub fn router(state: AppState) -> Router {
    let routes = page_routes();
    let backends = state.backends.clone();
    let jobs = state.jobs.clone();
    let verified = state.workers.verify.clone();
    let options = state.leptos.clone();
    let cookies = state.edge.cookies;
    let edge = state.edge.clone();
    let http_metrics = state.http_metrics.clone();
    let doctor = state.doctor.clone();
    let server_fn_bodies =
        crate::http::server_fns::ServerFnBodies::new(state.backends.clone(), state.edge.cookies);
    Router::new()
        .route("/live", axum::routing::get(live::ws::live))
        .merge(routes::health::routes())
        .merge(api::routes(
            state.edge.api_max_body,
            state.edge.api_deadline,
            Deadline::bulk(state.edge.request_timeout),
        ))
        .merge(routes::ingest::routes(state.edge.api_deadline))
        .merge(routes::metrics::routes())
        .merge(badge::routes::routes())
        .merge(routes::demo::routes())
        .leptos_routes_with_context(
            &state,
            routes,
            move || {
                provide_context(backends.clone());
                provide_context(jobs.clone());
                provide_context(verified.clone());
                provide_context(cookies);
                if let Some(doctor) = &doctor {
                    provide_context(doctor.clone());
                }
            },
            move || shell(options.clone()),
        )
        .route_layer(axum::middleware::from_fn(crate::http::observe::note_route))
        .fallback(site_or_page)
        .layer(axum::middleware::from_fn_with_state(
            server_fn_bodies,
            crate::http::server_fns::bounded_bodies,
        ))
        .layer(axum::middleware::from_fn(
            crate::http::server_fns::caller_errors,
        ))
        .layer(axum::middleware::from_fn_with_state(
            edge,
            crate::http::edge::edge,
        ))
        .layer(axum::middleware::from_fn_with_state(
            http_metrics,
            crate::http::observe::observe,
        ))
        .layer(TraceLayer::new_for_http())
        .layer(axum::middleware::from_fn(
            crate::http::request_id::request_id,
        ))
        .with_state(state)
}

/// The router's fallback: a file of the site embedded in this binary, or else
/// Leptos' own (a file under `--site-root`, or the "not found" page).
async fn site_or_page(uri: Uri, state: State<AppState>, req: Request<Body>) -> Response {
    if let Some(file) = crate::http::site::serve(req.method(), uri.path(), req.headers()) {
        return file;
    }
    leptos_axum::file_and_error_handler::<AppState, _>(shell)(uri, state, req).await
}

/// Connections the kernel completes and queues before the server accepts
/// them. The step at a drop's start brings thousands at once: with the
/// common 1,024 the queue overflowed on a 2-core machine, and each dropped
/// handshake cost its shopper a second or more (TCP's retransmission). The
/// kernel caps it at `net.core.somaxconn` (4,096 on current Linux).
const LISTEN_BACKLOG: u32 = 4_096;

/// A listener on `addr` with [`LISTEN_BACKLOG`].
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `router` on `listener` until `shutdown` completes, then drains
/// in-flight requests (for at most [`DRAIN`]).
///
/// The listener applies `edge`'s connection limits: HTTP/1.1 only (TLS ends at
/// a proxy, and cleartext HTTP/2 would escape the header-read timeout); a
/// client must send its request headers within the header-read timeout (which
/// also closes a keep-alive connection idle that long); at most
/// `max_connections` are open at once, WebSockets included (past that, new
/// clients wait in the accept queue), and at most `max_connections_per_address`
/// from one address other than a trusted proxy (more are closed at once); a
/// write that cannot progress for `write_timeout` (the client stopped
/// reading) closes its connection.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    edge: &EdgeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper::server::conn::http1;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceExt;

    // hyper's HTTP/1 server itself (not the version-sniffing one, which waits
    // for a first byte with no timeout): the header-read timeout runs from the
    // moment a connection opens, so a connection that never sends is closed.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(edge.header_read_timeout)
        .max_header_size(MAX_HEAD)
        .max_buf_size(MAX_HEAD);
    // Told when to stop; each connection holds a clone of `open` while it runs.
    let (stopping, stop_rx) = tokio::sync::watch::channel(false);
    let open = Arc::new(());
    let max = usable_connections(edge.max_connections);
    let permits = Arc::new(tokio::sync::Semaphore::new(max));
    let sockets = Arc::new(tokio::sync::Semaphore::new(
        crate::http::edge::socket_share(max, edge.max_sockets),
    ));
    let per_address = Arc::new(PerAddress::default());
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let address = crate::http::edge::limit_key(peer.ip());
        let counted = if edge.trusts(peer.ip()) {
            None
        } else {
            match per_address.take(address, edge.max_connections_per_address) {
                Some(place) => Some(place),
                // Over its share: closed at once, so one client cannot hold
                // every place.
                None => continue,
            }
        };
        let _ = stream.set_nodelay(true);
        // A bounded send buffer: the kernel wakes a blocked write when half of
        // it has drained, so a client that reads slowly but steadily shows
        // progress well within the write deadline (an autotuned buffer of
        // megabytes would wake it only after seconds), and one that stopped
        // reading holds at most this much memory in the kernel.
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(SEND_BUFFER);
        // Held by this connection and by any WebSocket it becomes.
        let slot = ConnectionSlot {
            held: Arc::new((permit, counted)),
            sockets: sockets.clone(),
        };
        let held = slot.clone();
        // Handlers see the peer as `ConnectInfo`, as with axum's own server.
        let service = router.clone().map_request(
            move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req.extensions_mut().insert(slot.clone());
                req
            },
        );
        let connection = builder
            .serve_connection(
                TokioIo::new(crate::http::write_deadline::WriteDeadline::new(
                    stream,
                    edge.write_timeout,
                )),
                TowerToHyperService::new(service),
            )
            .with_upgrades();
        let (mut stop_rx, running) = (stop_rx.clone(), open.clone());
        tokio::spawn(async move {
            tokio::pin!(connection);
            let stop = async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            };
            // Errors here are clients going away or timing out: nothing to report.
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stop => {
                    // Finish the request in flight, then close.
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(held);
            drop(running);
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    let drained = tokio::time::timeout(DRAIN, async {
        while Arc::strong_count(&open) > 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!("some connections were still open after the drain period");
    }
    Ok(())
}

/// The most a request's line and headers may take (larger: 431), and about
/// the most a connection's read buffer grows to while it waits for them.
/// hyper's own bound is about 400 KiB, which slow senders on thousands of
/// connections could hold at once.
const MAX_HEAD: usize = 64 * 1024;

/// Each client connection's kernel send buffer, in bytes (the kernel doubles
/// it for its own bookkeeping).
const SEND_BUFFER: usize = 256 * 1024;

/// `wanted`, lowered (with a warning) to what the process's open-file limit
/// leaves after a reserve for Redis, PostgreSQL and files: past it, accepting
/// fails before the cap ever applies.
fn usable_connections(wanted: usize) -> usize {
    const RESERVE: usize = 256;
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_owned))
        })
        .and_then(|v| v.parse::<usize>().ok());
    match soft {
        Some(soft) if soft.saturating_sub(RESERVE) < wanted => {
            let usable = soft.saturating_sub(RESERVE).max(1);
            tracing::warn!(
                wanted,
                usable,
                open_file_limit = soft,
                "the connection cap is above what the open-file limit allows; using the lower figure \
                 (raise the limit with `ulimit -n` to allow more)"
            );
            usable
        }
        _ => wanted.max(1),
    }
}

/// Longest wait for open requests to finish at shutdown.
pub const DRAIN: Duration = Duration::from_secs(10);

/// Starts the live side of a server over `state`: the event feed (one stream
/// reader for the process), the listener that clears the sold-out cache when
/// stock comes back, the badge hub and the dashboards' live hub. All stop when
/// `stop` turns `true`.
pub fn start_live(
    state: &AppState,
    redis_url: &str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let feed = state.feed.clone();
    let keys = state.backends.engine.keyspace();
    let events = feed.subscribe();
    let badge_events = feed.subscribe();
    let live_events = feed.subscribe();
    vec![
        tokio::spawn(feed.run(redis_url.to_owned(), keys, stopped(stop.clone()))),
        tokio::spawn(api::soldout::clear_on_restock(
            events,
            state.api.sold_out.clone(),
            stopped(stop.clone()),
        )),
        tokio::spawn(
            state
                .badges
                .clone()
                .run(badge_events, stopped(stop.clone())),
        ),
        tokio::spawn(
            state
                .live
                .clone()
                .run(redis_url.to_owned(), live_events, stopped(stop)),
        ),
    ]
}

/// A built Holdfast server: connected, workers running, listening; call
/// [`Application::run_until`] to serve.
pub struct Application {
    listener: TcpListener,
    addr: SocketAddr,
    state: AppState,
    workers: Workers,
    redis_url: String,
    /// How people sign in first (demo users, or a one-time admin password).
    pub sign_in: SignIn,
}

impl Application {
    /// Connects, prepares the database (demo drop and users when asked), starts
    /// the workers and binds the listener.
    pub async fn build(global: &GlobalArgs, args: ServeArgs) -> anyhow::Result<Self> {
        global.engine.check().map_err(anyhow::Error::msg)?;
        args.check().map_err(anyhow::Error::msg)?;
        let edge = args.edge().map_err(anyhow::Error::msg)?;
        if !users::set_hashes_at_once(args.password_hashes_at_once) {
            tracing::warn!(
                "--password-hashes-at-once is ignored: this process hashed passwords already"
            );
        }
        let backends = connect_with(global, args.pg_max_connections).await?;
        if args.demo {
            let load = catalog::load_demo_drop(&backends.pg).await?;
            // The demo should sell at once: warm whatever counters are missing.
            let warm = warm_all(
                &backends.engine,
                &backends.pg,
                WarmOptions::default(),
                |_| {},
            )
            .await?;
            tracing::info!(
                inserted = load.inserted,
                skus = load.total,
                counters_warmed = warm.warmed,
                "demo drop loaded"
            );
        }
        // Stock changes an import recorded but could not apply (Redis down, the
        // process killed) go now; failing here is not fatal: the next import or start applies them.
        match holdfast_engine::drop_file::apply_pending_stock(&backends.engine, &backends.pg).await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                applied = n,
                "stock changes left pending by an import applied"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "could not apply the stock changes an import left pending; the next import or start will"
            ),
        }
        let sign_in = users::prepare_sign_in(
            &backends.pg,
            args.demo.then_some(args.demo_password.as_str()),
        )
        .await?;
        let bundle = Path::new(&args.site_root).join("pkg").join("holdfast.wasm");
        if crate::http::site::embedded() {
            tracing::info!("serving the site embedded in this binary (--site-root is not used)");
        } else if !bundle.exists() {
            tracing::warn!(
                path = %bundle.display(),
                "the dashboard's WASM bundle is missing, so pages will not be interactive; \
                 build it with scripts/run.sh (or `cargo leptos build`)"
            );
        }
        let listener =
            listen(args.listen).with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        let options = StateOptions {
            api_rate: args.api_rate,
            ingest_rate: args.ingest_rate,
            sold_out_ttl: Duration::from_millis(args.sold_out_cache_ms),
            feed_gather: Duration::from_millis(args.feed_gather_ms),
            ingest: args.ingest().map_err(anyhow::Error::msg)?,
            badge: BadgeConfig {
                origins: args
                    .badge_origins
                    .iter()
                    .map(|o| o.trim().trim_end_matches('/').to_owned())
                    .collect(),
                max_connections_per_client: args.badge_max_connections_per_client,
                max_subscriptions: usize::try_from(args.badge_max_subscriptions).unwrap_or(20),
                polls_per_second: args.badge_polls_per_second,
                idle_timeout: Duration::from_secs(args.badge_idle_timeout_secs),
                ping_every: crate::config::ping_every(
                    Duration::from_secs(args.badge_idle_timeout_secs),
                    BadgeConfig::default().ping_every,
                ),
                max_message: args.badge_max_message_bytes,
                subscribe_burst: args.badge_subscribe_burst,
                resubscribe_every: Duration::from_secs(1) / args.badge_subscribes_per_second,
                send_timeout: Duration::from_secs(args.socket_send_timeout_secs),
            },
            live: LiveConfig {
                max_message: args.live_max_message_bytes,
                idle_timeout: Duration::from_secs(args.live_idle_timeout_secs),
                ping_every: crate::config::ping_every(
                    Duration::from_secs(args.live_idle_timeout_secs),
                    LiveConfig::default().ping_every,
                ),
                handshakes_per_second: args.live_handshakes_per_second,
                send_timeout: Duration::from_secs(args.socket_send_timeout_secs),
            },
            doctor: Some(Arc::new(args.doctor_config(global))),
            demo_shop_sells: args.demo,
            intake_redis: Some(redis_conn::connect(&global.redis_url).await?),
            unknown_tokens_per_second: args.unknown_tokens_per_second,
            refused_tokens_remembered: args.refused_tokens_remembered,
            edge,
            metrics: routes::metrics::MetricsAccess(
                args.metrics_token
                    .as_deref()
                    .filter(|t| !t.is_empty())
                    .map(Arc::from),
            ),
        };
        let stats = Arc::new(WorkerStats::new());
        let background = Background::start(BackgroundConfig {
            threads: args.background_threads,
            nice: args.background_nice,
        })
        .context("cannot start the background workers' threads")?;
        let workers = Workers::start(
            &backends,
            &global.redis_url,
            worker_config(&args),
            &stats,
            Some(background),
        )
        .await?;
        // With the site embedded nothing is served from disk: a file under a
        // `target/site` in the working directory (or an old bundle there) must
        // not be reachable. The root names a path that cannot exist.
        let site_root = if crate::http::site::embedded() {
            crate::http::site::NO_DISK_ROOT
        } else {
            args.site_root.as_str()
        };
        let state = AppState::build(leptos_options(site_root, addr), backends, stats, options);
        Ok(Self {
            listener,
            addr,
            state,
            workers,
            redis_url: global.redis_url.clone(),
            sign_in,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes, then drains requests and stops the live
    /// feeds and the workers.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (stop_live, live_rx) = tokio::sync::watch::channel(false);
        let live = start_live(&self.state, &self.redis_url, live_rx);
        let edge = self.state.edge.clone();
        let served = serve(self.listener, router(self.state), &edge, shutdown).await;
        let _ = stop_live.send(true);
        for task in live {
            let _ = task.await;
        }
        self.workers.stop().await;
        served
    }
}

/// The workers' settings from `serve`'s flags.
fn worker_config(args: &ServeArgs) -> WorkerConfig {
    WorkerConfig {
        reaper: ReaperConfig {
            interval: Duration::from_millis(args.reaper_interval_ms),
            batch: args.reaper_batch,
        },
        write_behind: WriteBehindConfig {
            batch_max: args.write_behind_batch,
            workers: args.write_behind_workers,
            gather: Duration::from_millis(args.write_behind_gather_ms),
            claim_idle: Duration::from_secs(args.takeover_after_secs),
            ..WriteBehindConfig::default()
        },
        reconcile_every: (args.reconcile_every_secs > 0)
            .then(|| Duration::from_secs(args.reconcile_every_secs)),
        reconcile_correct_up: args.reconcile_correct_up,
        verify_every: (args.verify_every_secs > 0)
            .then(|| Duration::from_secs(args.verify_every_secs)),
        lanes: Lane::ALL
            .iter()
            .map(|lane| {
                let mut cfg = LaneConfig::default_for(*lane);
                cfg.claim_idle = Duration::from_secs(args.takeover_after_secs);
                if *lane == Lane::Feeds {
                    cfg.rate_per_sec = args.feeds_rate;
                    cfg.yields = (args.feeds_yield_above > 0).then_some(Yield {
                        above: args.feeds_yield_above,
                        rate: args.feeds_busy_rate,
                    });
                }
                cfg
            })
            .collect(),
    }
}

/// Serves `state` on `listener` in the background for as long as the runtime
/// lives, with the live side (event feed, badges, dashboards) reading the Redis
/// at `live_from` when given. For tests and benchmarks, which build their own
/// state over private backing services.
pub async fn spawn_in_background(listener: TcpListener, state: AppState, live_from: Option<&str>) {
    if let Some(redis_url) = live_from {
        let (stop, rx) = tokio::sync::watch::channel(false);
        start_live(&state, redis_url, rx);
        // Live until the runtime ends.
        std::mem::forget(stop);
    }
    let edge = state.edge.clone();
    tokio::spawn(
        async move { serve(listener, router(state), &edge, std::future::pending()).await },
    );
    if live_from.is_some() {
        // Give the feed a moment to position itself at the streams' end.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
