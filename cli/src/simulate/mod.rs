//! `holdfast simulate`: rehearse a drop against a running Holdfast through its
//! public HTTP API, watch it live in the terminal, then check the truth in Redis
//! and PostgreSQL and say, with an exit code, whether it held.
//!
//! The run gets a SKU of its own (`SIM-…`, in the drop `rehearsal`, so the
//! dashboard shows it) stocked with `--units`, so its checks cannot be disturbed
//! by other traffic; and, without `--token`, a temporary API token it revokes at
//! the end.

pub mod checks;
pub mod load;
pub mod plot;

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use holdfast_engine::tokens::{self, Scope};
use serde::Serialize;

use crate::config::{GlobalArgs, SimulateArgs};
use load::{Behaviour, Second, Slot, Tally, Target};

/// The drop simulated SKUs belong to.
pub const DROP: &str = "rehearsal";

/// Everything a run measured and concluded, as `--json` writes it.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The SKU sold.
    pub sku: String,
    /// Units on sale.
    pub units: i64,
    /// Shoppers who arrived.
    pub shoppers: u64,
    /// Reservation attempts (a shopper may try twice).
    pub attempts: u64,
    /// Holds granted.
    pub held: u64,
    /// Units the API confirmed as sold.
    pub sold_units: u64,
    /// Holds paid for.
    pub confirmed: u64,
    /// Holds released by shoppers.
    pub released: u64,
    /// Holds left to expire.
    pub abandoned: u64,
    /// Payments refused because the hold had expired.
    pub late_payments: u64,
    /// Releases that found the hold already expired.
    pub late_releases: u64,
    /// Refusals: sold out, per-buyer limit.
    pub rejected_sold_out: u64,
    /// Refusals for the per-buyer limit.
    pub rejected_limit: u64,
    /// Same-key retries sent.
    pub retries: u64,
    /// Transport failures and unexpected answers.
    pub errors: u64,
    /// Reserve latency over the whole run, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Seconds from the first to the last scheduled arrival.
    pub arrival_secs: f64,
    /// Milliseconds from the last scheduled arrival until every attempt was
    /// answered.
    pub decided_ms_after_last_arrival: u64,
    /// Second by second.
    pub timeline: Vec<Second>,
    /// The first two seconds, a tenth of a second at a time.
    pub first_seconds: Vec<Slot>,
    /// The truth checks.
    pub checks: Vec<checks::Check>,
    /// Whether every check passed.
    pub passed: bool,
}

fn behaviour(args: &SimulateArgs) -> Behaviour {
    Behaviour {
        shoppers: args.shoppers,
        peak_rps: args.peak_rps,
        peak_secs: args.peak_secs,
        decay_secs: args.decay_secs,
        confirm: args.confirm,
        abandon: args.abandon,
        think: Duration::from_millis(args.think_ms),
        hold_ttl: Duration::from_secs(args.hold_ttl_secs),
        retry: args.retry,
        repeat: args.repeat,
        max_qty: args.per_buyer_limit.max(1),
        seed: args.seed,
        connections: args.connections as usize,
    }
}

/// Runs `holdfast simulate`; fails (non-zero exit) when a truth check fails.
pub async fn run(global: &GlobalArgs, args: SimulateArgs) -> anyhow::Result<()> {
    if args.confirm + args.abandon > 1.0 {
        anyhow::bail!("--confirm plus --abandon is more than 1 (the rest release their holds)");
    }
    let backends = holdfast_server::startup::connect_with(global, 4).await?;
    let bases: Vec<String> = args
        .url
        .iter()
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect();
    let Some(base) = bases.first().cloned() else {
        anyhow::bail!("--url needs at least one server");
    };
    for base in &bases {
        reqwest::get(format!("{base}/healthz"))
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| {
                format!(
                    "Holdfast does not answer at {base}; start it (scripts/run.sh) or pass --url"
                )
            })?;
    }

    let run_id = format!("sim{}", chrono::Utc::now().format("%H%M%S%3f"));
    let sku = args
        .sku
        .clone()
        .unwrap_or_else(|| format!("SIM-{}", &run_id[3..]));
    checks::create_sku(&backends, &sku, args.units, args.per_buyer_limit).await?;
    let (token, temporary) = match &args.token {
        Some(t) => (t.clone(), None),
        None => {
            let t = tokens::create(
                &backends.pg,
                &format!("simulate {run_id}"),
                &[Scope::Checkout, Scope::Read],
            )
            .await?;
            (t.secret, Some(t.info.id))
        }
    };
    let start_ids = checks::stream_position(&backends, &sku).await?;
    let b = behaviour(&args);
    let arrival_secs = load::schedule(&b).last().copied().unwrap_or(0.0);
    eprintln!(
        "simulating {} shoppers for {} units of {sku}: peak {}/s for {} s, decaying over {} s (about {:.0} s of arrivals)",
        b.shoppers, args.units, b.peak_rps, b.peak_secs, b.decay_secs, arrival_secs
    );
    eprintln!("watch it live on the dashboard: {base}/?drop={DROP}");

    let tally = Arc::new(Tally::default());
    let gate = (args.connections > 0).then(|| {
        Arc::new(tokio::sync::Semaphore::new(
            args.connections as usize * bases.len(),
        ))
    });
    let target = Target::new(bases, &token, sku.clone(), run_id.clone(), gate)?;
    let view = tokio::spawn(live_view(
        tally.clone(),
        b.shoppers,
        backends.clone(),
        sku.clone(),
    ));
    let last_arrival = load::run(target, b.clone(), tally.clone()).await;
    view.abort();
    eprintln!();
    let decided_ms = (tally.last_decided_us.load(Ordering::Relaxed) / 1_000)
        .saturating_sub(last_arrival.as_millis() as u64);

    eprintln!(
        "waiting for holds to end and the write-behind to catch up (at most {} s)…",
        args.settle_secs
    );
    let outcome = checks::run_all(
        &backends,
        &sku,
        args.units,
        args.per_buyer_limit,
        &tally,
        &start_ids,
        Duration::from_secs(args.settle_secs),
    )
    .await?;
    if let Some(id) = temporary {
        tokens::revoke(&backends.pg, id).await?;
    }
    let lat = tally.sorted_latencies();
    let report = Report {
        sku,
        units: args.units,
        shoppers: args.shoppers,
        attempts: tally.attempts.load(Ordering::Relaxed),
        held: tally.held.load(Ordering::Relaxed),
        sold_units: tally.sold_units.load(Ordering::Relaxed),
        confirmed: tally.confirmed.load(Ordering::Relaxed),
        released: tally.released.load(Ordering::Relaxed),
        abandoned: tally.abandoned.load(Ordering::Relaxed),
        late_payments: tally.late.load(Ordering::Relaxed),
        late_releases: tally.late_releases.load(Ordering::Relaxed),
        rejected_sold_out: tally.sold_out.load(Ordering::Relaxed),
        rejected_limit: tally.limited.load(Ordering::Relaxed),
        retries: tally.retries.load(Ordering::Relaxed),
        errors: tally.errors.load(Ordering::Relaxed),
        p50_ms: load::percentile(&lat, 0.50),
        p99_ms: load::percentile(&lat, 0.99),
        arrival_secs,
        decided_ms_after_last_arrival: decided_ms,
        timeline: tally.seconds(),
        first_seconds: tally.slots(),
        passed: outcome.iter().all(|c| c.passed),
        checks: outcome,
    };
    print_report(&report, &tally);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::svg(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("plot written to {}", path.display());
    }
    if !report.passed {
        anyhow::bail!(
            "{} of {} truth checks failed",
            report.checks.iter().filter(|c| !c.passed).count(),
            report.checks.len()
        );
    }
    Ok(())
}

/// Prints progress twice a second (one updating line on a terminal, a line every
/// two seconds otherwise) until aborted.
async fn live_view(
    tally: Arc<Tally>,
    shoppers: u64,
    backends: holdfast_engine::Backends,
    sku: String,
) {
    let tty = std::io::stderr().is_terminal();
    let every = Duration::from_millis(if tty { 500 } else { 2_000 });
    let started = Instant::now();
    let mut before = (0u64, Instant::now());
    loop {
        tokio::time::sleep(every).await;
        let attempts = tally.attempts.load(Ordering::Relaxed);
        let rate = (attempts - before.0) as f64 / before.1.elapsed().as_secs_f64().max(0.001);
        before = (attempts, Instant::now());
        let figures = backends.engine.figures(&sku).await.ok().flatten();
        // The last two seconds only: sorting the whole run twice a second would
        // stall the shoppers sharing this runtime.
        let lat = tally.recent_latencies(2);
        let line = format!(
            "{:>5.1}s  {:>3}% of shoppers  {:>6.0} attempts/s  reserved {:>5}  sold {:>5}  available {:>5}  rejected {:>6}  recent p50 {:>6.2} ms  p99 {:>7.2} ms",
            started.elapsed().as_secs_f64(),
            tally.arrived.load(Ordering::Relaxed) * 100 / shoppers.max(1),
            rate,
            figures.map_or(0, |f| f.reserved),
            tally.sold_units.load(Ordering::Relaxed),
            figures.map_or(0, |f| f.available),
            tally.sold_out.load(Ordering::Relaxed) + tally.limited.load(Ordering::Relaxed),
            load::percentile(&lat, 0.5),
            load::percentile(&lat, 0.99),
        );
        let mut err = std::io::stderr().lock();
        if tty {
            let _ = write!(err, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }
}

fn print_report(r: &Report, tally: &Tally) {
    println!();
    println!("Drop rehearsal of {} ({} units)", r.sku, r.units);
    println!(
        "  shoppers {}, attempts {}, retries {}",
        r.shoppers, r.attempts, r.retries
    );
    println!(
        "  held {}, sold {} units ({} paid, {} late payments), {} released ({} more too late: expired), {} abandoned",
        r.held,
        r.sold_units,
        r.confirmed,
        r.late_payments,
        r.released,
        r.late_releases,
        r.abandoned
    );
    println!(
        "  refused: {} sold out, {} over the per-buyer limit; {} errors",
        r.rejected_sold_out, r.rejected_limit, r.errors
    );
    println!(
        "  reserve latency p50 {:.2} ms, p99 {:.2} ms; all attempts answered {} ms after the last arrival",
        r.p50_ms, r.p99_ms, r.decided_ms_after_last_arrival
    );
    for s in tally
        .samples
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
    {
        println!("  e.g. {s}");
    }
    println!();
    for c in &r.checks {
        println!(
            "  [{}] {}: {}",
            if c.passed { "pass" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    println!();
    println!(
        "{}",
        if r.passed {
            "All truth checks passed."
        } else {
            "Some truth checks FAILED."
        }
    );
}
