//! The operator commands behind `holdfast <command>`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use holdfast_engine::catalog;
use holdfast_engine::reaper::ReaperConfig;
use tokio::net::TcpListener;

use crate::config::{Cli, Command, GlobalArgs, ServeArgs};
use crate::state::{AppState, leptos_options};

/// Runs the command `cli` names (`serve` when none).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Serve(args)) => serve(&cli.global, args).await,
        None => serve(&cli.global, ServeArgs::from_env()).await,
    }
}

async fn serve(global: &GlobalArgs, args: ServeArgs) -> anyhow::Result<()> {
    let backends = crate::startup::connect(
        &global.redis_url,
        &global.database_url,
        global.allow_evicting_redis,
        args.pg_max_connections,
        global.engine.config(),
    )
    .await?;
    if args.demo {
        let load = catalog::load_demo_drop(&backends.pg).await?;
        tracing::info!(
            inserted = load.inserted,
            skus = load.total,
            "demo drop loaded"
        );
    }
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
    let workers = crate::workers::Workers::start(
        &backends,
        ReaperConfig {
            interval: Duration::from_millis(args.reaper_interval_ms),
            batch: args.reaper_batch,
        },
    );
    let state = AppState {
        leptos: leptos_options(&args.site_root, addr),
        backends,
    };
    println!("Holdfast is serving at http://{addr}");
    crate::serve(listener, crate::router(state), shutdown_signal()).await?;
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
