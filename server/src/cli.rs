//! The operator commands behind `holdfast <command>`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use std::sync::Arc;

use holdfast_engine::Backends;
use holdfast_engine::catalog;
use holdfast_engine::reaper::ReaperConfig;
use holdfast_engine::reconcile::{ReconcileOptions, reconcile_all};
use holdfast_engine::record::WriteBehindConfig;
use holdfast_engine::warmup::{WarmOptions, warm_all};
use tokio::net::TcpListener;

use holdfast_engine::tokens::{self, Scope};

use holdfast_engine::ingest::{LANES, LaneConfig};

use crate::config::{
    Cli, Command, DeadLetterCommand, GlobalArgs, LaneCommand, LockCommand, ReconcileArgs,
    ServeArgs, TokenCommand, WarmArgs,
};
use crate::progress::{Progress, table, thousands};
use crate::routes::ingest::IngestConfig;
use crate::state::{AppState, leptos_options};
use crate::workers::{WorkerConfig, WorkerStats, Workers};

/// Runs the command `cli` names (`serve` when none).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Serve(args)) => serve(&cli.global, args).await,
        None => serve(&cli.global, ServeArgs::from_env()).await,
        Some(Command::Warm(args)) => warm(&cli.global, args).await,
        Some(Command::Reconcile(args)) => reconcile(&cli.global, args).await,
        Some(Command::Token(cmd)) => token(&cli.global, cmd).await,
        Some(Command::Lane(cmd)) => lane(&cli.global, cmd).await,
        Some(Command::DeadLetters(cmd)) => dead_letters(&cli.global, cmd).await,
        Some(Command::User(cmd)) => crate::users::command(&cli.global, cmd).await,
        Some(Command::Lock(cmd)) => lock(&cli.global, cmd).await,
        Some(Command::Simulate(args)) => crate::simulate::run(&cli.global, args).await,
    }
}

async fn lock(global: &GlobalArgs, cmd: LockCommand) -> anyhow::Result<()> {
    let redis = holdfast_engine::kv::connect(&global.redis_url).await?;
    let engine = holdfast_engine::Engine::new(redis, global.engine.config());
    match cmd {
        LockCommand::List => {
            let locks = engine.list_locks().await?;
            if locks.is_empty() {
                println!("no lock is held");
            }
            for l in locks {
                println!(
                    "{:<24} holder {:<40} {:>7} ms left  fence {}",
                    l.name, l.holder, l.remaining_ms, l.fence
                );
            }
        }
        LockCommand::Take { name, ttl_secs } => {
            match engine
                .acquire_lock(&name, Duration::from_secs(ttl_secs))
                .await?
            {
                Some(lease) => println!(
                    "lock {name} held for {ttl_secs} s with fencing token {}",
                    lease.fence
                ),
                None => anyhow::bail!("lock {name} is held by someone else"),
            }
        }
        LockCommand::ForceRelease { name } => {
            if engine.force_release_lock(&name).await? {
                println!("lock {name} released");
            } else {
                anyhow::bail!("lock {name} is not held");
            }
        }
    }
    Ok(())
}

async fn lane(global: &GlobalArgs, cmd: LaneCommand) -> anyhow::Result<()> {
    let mut conn = holdfast_engine::kv::connect(&global.redis_url).await?;
    let check = |lane: &str| {
        if LANES.contains(&lane) {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "no lane '{lane}': use {}",
                LANES.join(" or ")
            ))
        }
    };
    match cmd {
        LaneCommand::Status => {
            for lane in LANES {
                let s = holdfast_engine::ingest::status(&mut conn, lane).await?;
                let state = if s.paused { "paused" } else { "running" };
                println!(
                    "{:<8} {:<8} backlog {:>8}  pending {:>6}",
                    s.lane,
                    state,
                    thousands(s.backlog),
                    s.pending
                );
            }
        }
        LaneCommand::Pause { lane } => {
            check(&lane)?;
            holdfast_engine::ingest::pause(&mut conn, &lane).await?;
            println!(
                "lane {lane} paused: payloads queue until it is resumed (or its cap is reached)"
            );
        }
        LaneCommand::Resume { lane } => {
            check(&lane)?;
            holdfast_engine::ingest::resume(&mut conn, &lane).await?;
            println!("lane {lane} resumed");
        }
    }
    Ok(())
}

async fn dead_letters(global: &GlobalArgs, cmd: DeadLetterCommand) -> anyhow::Result<()> {
    let mut conn = holdfast_engine::kv::connect(&global.redis_url).await?;
    match cmd {
        DeadLetterCommand::List { count } => {
            let letters = holdfast_engine::ingest::dead_letters(&mut conn, count).await?;
            if letters.is_empty() {
                println!("no dead letters");
            }
            for d in letters {
                println!(
                    "{}  {}/{}  {}\n    {}",
                    d.id, d.lane, d.source, d.reason, d.body
                );
            }
        }
        DeadLetterCommand::Replay { id } => {
            match holdfast_engine::ingest::replay(&mut conn, &id).await? {
                Some(new_id) => println!("dead letter {id} is back on its lane as {new_id}"),
                None => anyhow::bail!("no dead letter {id}"),
            }
        }
    }
    Ok(())
}

async fn token(global: &GlobalArgs, cmd: TokenCommand) -> anyhow::Result<()> {
    let pg = holdfast_engine::store::connect_and_migrate(&global.database_url, 2).await?;
    match cmd {
        TokenCommand::Create { name, scopes } => {
            let scopes = scopes
                .iter()
                .map(|s| {
                    Scope::parse(s.trim()).ok_or_else(|| {
                        anyhow::anyhow!("unknown scope '{s}': use checkout, ingest or read")
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let new = tokens::create(&pg, &name, &scopes).await?;
            println!(
                "token {} ({}) created with scopes {}",
                new.info.id,
                new.info.name,
                scope_list(&new.info.scopes)
            );
            println!("{}", new.secret);
            eprintln!("this secret is shown once; store it now (only its SHA-256 is kept)");
        }
        TokenCommand::List => {
            for t in tokens::list(&pg).await? {
                let state = t.revoked_at.map_or("active".to_owned(), |at| {
                    format!("revoked {}", at.format("%Y-%m-%d %H:%M"))
                });
                println!(
                    "{:>5}  {:<24} {:<24} {}",
                    t.id,
                    t.name,
                    scope_list(&t.scopes),
                    state
                );
            }
        }
        TokenCommand::Revoke { id } => {
            if tokens::revoke(&pg, id).await? {
                println!("token {id} revoked");
            } else {
                anyhow::bail!("no active token {id}");
            }
        }
    }
    Ok(())
}

fn scope_list(scopes: &[Scope]) -> String {
    scopes
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

async fn connect(global: &GlobalArgs, pg_max_connections: u32) -> anyhow::Result<Backends> {
    Ok(crate::startup::connect(
        &global.redis_url,
        &global.database_url,
        global.allow_evicting_redis,
        pg_max_connections,
        global.engine.config(),
    )
    .await?)
}

async fn warm(global: &GlobalArgs, args: WarmArgs) -> anyhow::Result<()> {
    let backends = connect(global, 4).await?;
    let mut bar = Progress::new("warming");
    let options = WarmOptions {
        force: args.force,
        ..WarmOptions::default()
    };
    let report = warm_all(&backends.engine, &backends.pg, options, |p| {
        bar.update(p.done, p.total)
    })
    .await?;
    let took = bar.finish();
    println!("warm-up finished");
    table(&[
        ("SKUs", thousands(report.skus)),
        ("counters written", thousands(report.warmed)),
        ("already warm (left alone)", thousands(report.existing)),
        ("time", format!("{} ms", took.as_millis())),
    ]);
    Ok(())
}

async fn reconcile(global: &GlobalArgs, args: ReconcileArgs) -> anyhow::Result<()> {
    let backends = connect(global, 4).await?;
    let mut bar = Progress::new("reconciling");
    let options = ReconcileOptions {
        correct_up: args.correct_up,
        ..ReconcileOptions::default()
    };
    let r = reconcile_all(&backends.engine, &backends.pg, &options, |p| {
        bar.update(p.done, p.total)
    })
    .await?;
    let took = bar.finish();
    println!(
        "reconciliation run {} finished (fencing token {})",
        r.run_id, r.fence
    );
    table(&[
        ("SKUs checked", thousands(r.checked)),
        ("drift found", thousands(r.drifted)),
        (
            "corrected down (could oversell)",
            thousands(r.corrected_down),
        ),
        ("corrected up (stranded)", thousands(r.corrected_up)),
        ("reported, left as is", thousands(r.reported)),
        ("moved meanwhile (next run)", thousands(r.moved)),
        ("not warmed", thousands(r.not_warmed)),
        ("time", format!("{} ms", took.as_millis())),
    ]);
    if r.reported > 0 {
        println!(
            "stranded units were left as is; run `holdfast reconcile --correct-up` to release them for sale"
        );
    }
    Ok(())
}

async fn serve(global: &GlobalArgs, args: ServeArgs) -> anyhow::Result<()> {
    let backends = connect(global, args.pg_max_connections).await?;
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
    crate::users::sign_in_help(
        &backends.pg,
        args.demo.then_some(args.demo_password.as_str()),
    )
    .await?;
    let bundle = Path::new(&args.site_root).join("pkg").join("holdfast.wasm");
    if !bundle.exists() {
        tracing::warn!(
            path = %bundle.display(),
            "the dashboard's WASM bundle is missing, so pages will not be interactive; \
             build it with `cargo leptos build` or start Holdfast with scripts/run.sh"
        );
    }
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let ingest = IngestConfig::parse(&args.ingest_sources)
        .map_err(|e| anyhow::anyhow!("--ingest-source {e}"))?;
    let stats = Arc::new(WorkerStats::new());
    let config = WorkerConfig {
        reaper: ReaperConfig {
            interval: Duration::from_millis(args.reaper_interval_ms),
            batch: args.reaper_batch,
        },
        write_behind: WriteBehindConfig {
            batch_max: args.write_behind_batch,
            ..WriteBehindConfig::default()
        },
        reconcile_every: (args.reconcile_every_secs > 0)
            .then(|| Duration::from_secs(args.reconcile_every_secs)),
        reconcile_correct_up: args.reconcile_correct_up,
        lanes: LANES
            .iter()
            .map(|lane| {
                let mut cfg = LaneConfig::default_for(lane);
                if *lane == "feeds" {
                    cfg.rate_per_sec = args.feeds_rate;
                }
                cfg
            })
            .collect(),
    };
    let workers = Workers::start(&backends, &global.redis_url, config, &stats).await?;
    let state = AppState {
        workers: stats,
        ingest: Arc::new(ingest),
        badges: Arc::new(crate::badge::BadgeHub::new(
            backends.engine.clone(),
            backends.pg.clone(),
            crate::badge::BadgeConfig {
                origins: args
                    .badge_origins
                    .iter()
                    .map(|o| o.trim().trim_end_matches('/').to_owned())
                    .collect(),
                max_connections_per_client: args.badge_max_connections_per_client,
                ..crate::badge::BadgeConfig::default()
            },
        )),
        api: Arc::new(crate::api::ApiState {
            sold_out: crate::api::soldout::SoldOutCache::new(Duration::from_millis(
                args.sold_out_cache_ms,
            )),
            ..crate::api::ApiState::with_limits(args.api_rate, args.ingest_rate)
        }),
        ..AppState::new(leptos_options(&args.site_root, addr), backends)
    };
    // The live hub reads lane rates from the workers' counters.
    let state = AppState {
        live: Arc::new(crate::live::LiveHub::new(
            state.backends.clone(),
            state.jobs.clone(),
            state.workers.clone(),
        )),
        ..state
    };
    let (stop_live, live_rx) = tokio::sync::watch::channel(false);
    let live = crate::start_live(&state, &global.redis_url, live_rx);
    println!("Holdfast is serving at http://{addr}");
    crate::serve(listener, crate::router(state), shutdown_signal()).await?;
    let _ = stop_live.send(true);
    for task in live {
        let _ = task.await;
    }
    workers.stop().await;
    tracing::info!("stopped");
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM, so in-flight requests drain before exit.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down");
}
