//! The operator commands behind `holdfast <command>`.

use std::time::Duration;

use anyhow::Context;
use holdfast_domain::text::thousands;
use holdfast_domain::{Lane, Scope};
use holdfast_engine::Backends;
use holdfast_engine::audit::{cli_actor, note};
use holdfast_engine::doctor::{CheckLevel, DoctorReport};
use holdfast_engine::reconcile::{ReconcileOptions, reconcile_all};
use holdfast_engine::tokens;
use holdfast_engine::users::SignIn;
use holdfast_engine::verify::{VerifyOptions, VerifyReport};
use holdfast_engine::warmup::{WarmOptions, warm_all};
use holdfast_engine::{ingest, postgres};
use holdfast_server::startup::{Application, connect_with};

use crate::config::{
    Cli, Command, DeadLetterCommand, DoctorArgs, GlobalArgs, LaneCommand, LockCommand,
    ReconcileArgs, ServeArgs, SplitArgs, TokenCommand, VerifyArgs, WarmArgs,
};
use crate::progress::{Progress, table};

/// Runs the command `cli` names (`serve` when none).
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Serve(args)) => serve(&cli.global, *args).await,
        None => serve(&cli.global, ServeArgs::from_env()).await,
        Some(Command::Warm(args)) => warm(&cli.global, args).await,
        Some(Command::Reconcile(args)) => reconcile(&cli.global, args).await,
        Some(Command::Verify(args)) => verify(&cli.global, args).await,
        Some(Command::Token(cmd)) => token(&cli.global, cmd).await,
        Some(Command::Lane(cmd)) => lane(&cli.global, cmd).await,
        Some(Command::DeadLetters(cmd)) => dead_letters(&cli.global, cmd).await,
        Some(Command::User(cmd)) => crate::user_commands::command(&cli.global, cmd).await,
        Some(Command::Lock(cmd)) => lock(&cli.global, cmd).await,
        Some(Command::Split(args)) => split(&cli.global, args).await,
        Some(Command::Drop(cmd)) => crate::drop_commands::command(&cli.global, cmd).await,
        Some(Command::Simulate(args)) => crate::simulate::run(&cli.global, args).await,
        Some(Command::Doctor(args)) => match doctor(&cli.global, &args).await? {
            0 => Ok(()),
            code => Err(Exit(code).into()),
        },
    }
}

/// A command that finished and printed its outcome, whose exit code is not 0:
/// `main` exits with it and prints nothing more (the command said why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit(pub u8);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit code {}", self.0)
    }
}

impl std::error::Error for Exit {}

/// Runs `holdfast doctor`: checks the deployment `global` and `args` describe,
/// prints the report and returns the exit code the worst line calls for
/// ([`crate::config::DOCTOR_EXIT_CODES`]).
pub async fn doctor(global: &GlobalArgs, args: &DoctorArgs) -> anyhow::Result<u8> {
    let config = args.serve.doctor_config(global);
    let report = holdfast_engine::doctor::run(&config).await;
    let code = doctor_exit_code(&report, args.strict);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_doctor(&report, code);
    }
    Ok(code)
}

/// The exit code for `report`: 2 when a line failed, 1 when one warned and
/// `strict`, 0 otherwise.
pub fn doctor_exit_code(report: &DoctorReport, strict: bool) -> u8 {
    match report.worst() {
        CheckLevel::Fail => 2,
        CheckLevel::Warn if strict => 1,
        _ => 0,
    }
}

/// Width of the finding column before it wraps.
const FINDING_WIDTH: usize = 88;

/// The report as a table: level, check, then the finding and, under it, what
/// to do; long text wraps within its column.
pub fn print_doctor(report: &DoctorReport, code: u8) {
    let check_width = report
        .checks
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let indent = " ".repeat(6 + check_width + 2);
    println!(
        "{:<6}{:<check_width$}  FINDING / WHAT TO DO",
        "LEVEL", "CHECK"
    );
    for c in &report.checks {
        let mut lines = wrap(&c.finding, FINDING_WIDTH);
        if !c.action.is_empty() {
            lines.extend(wrap(&format!("→ {}", c.action), FINDING_WIDTH));
        }
        for (i, text) in lines.iter().enumerate() {
            if i == 0 {
                println!("{:<6}{:<check_width$}  {text}", c.level.as_str(), c.name);
            } else {
                println!("{indent}{text}");
            }
        }
    }
    let count = |level| report.checks.iter().filter(|c| c.level == level).count();
    let verdict = match report.worst() {
        CheckLevel::Pass => "ready",
        CheckLevel::Warn => "ready, with the risks above",
        CheckLevel::Fail => "NOT READY: fix the failing lines before the drop",
    };
    println!(
        "{} pass, {} warn, {} fail: {verdict} (exit {code})",
        count(CheckLevel::Pass),
        count(CheckLevel::Warn),
        count(CheckLevel::Fail)
    );
}

/// `text` in lines of at most `width` characters, broken between words (a
/// longer word gets a line of its own).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for word in text.split_whitespace() {
        if !current.is_empty() && current.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(word);
    }
    if !current.is_empty() || lines.is_empty() {
        lines.push(current);
    }
    lines
}

/// `holdfast split SKU [--parts K]`: shows the SKU's parts, after changing
/// their count when asked (audited).
async fn split(global: &GlobalArgs, args: SplitArgs) -> anyhow::Result<()> {
    use holdfast_engine::SplitOutcome;
    let backends = connect(global, 2).await?;
    let engine = &backends.engine;
    if let Some(parts) = args.parts {
        match engine.set_parts(&backends.pg, &args.sku, parts).await? {
            SplitOutcome::Changed { from, to } => {
                note(
                    &backends.pg,
                    &cli_actor(),
                    "split_sku",
                    &args.sku,
                    serde_json::json!({ "from": from, "to": to }),
                )
                .await;
                println!("{} is now in {to} part(s) (was {from})", args.sku);
            }
            SplitOutcome::Unchanged => println!("{} already has {parts} part(s)", args.sku),
            SplitOutcome::Refused(why) => anyhow::bail!("not changed: {why}"),
            SplitOutcome::NotWarmed => anyhow::bail!(
                "{} has no counter in Redis: warm it first (holdfast warm)",
                args.sku
            ),
            SplitOutcome::Invalid(why) => anyhow::bail!("{why}"),
        }
    }
    let parts = engine.part_figures(&args.sku).await?;
    if parts.is_empty() {
        anyhow::bail!("{} has no counter in Redis", args.sku);
    }
    println!(
        "{:<6} {:>10} {:>10} {:>12} {:>8}",
        "part", "available", "reserved", "sold pending", "moving"
    );
    for (j, f) in parts.iter().enumerate() {
        println!(
            "{j:<6} {:>10} {:>10} {:>12} {:>8}",
            thousands(f.available),
            thousands(f.reserved),
            thousands(f.sold_pending),
            thousands(f.moving)
        );
    }
    Ok(())
}

async fn lock(global: &GlobalArgs, cmd: LockCommand) -> anyhow::Result<()> {
    let backends = connect(global, 2).await?;
    let engine = &backends.engine;
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
                .acquire_lock_above(
                    &name,
                    Duration::from_secs(ttl_secs),
                    postgres::last_fence(&backends.pg, &name).await?,
                )
                .await?
            {
                Some(lease) => {
                    note(
                        &backends.pg,
                        &cli_actor(),
                        "take_lock",
                        &name,
                        serde_json::json!({ "ttl_secs": ttl_secs, "fence": lease.fence }),
                    )
                    .await;
                    println!(
                        "lock {name} held for {ttl_secs} s with fencing token {}",
                        lease.fence
                    )
                }
                None => anyhow::bail!("lock {name} is held by someone else"),
            }
        }
        LockCommand::ForceRelease { name } => {
            if engine.force_release_lock(&name).await? {
                note(
                    &backends.pg,
                    &cli_actor(),
                    "force_release_lock",
                    &name,
                    serde_json::json!({}),
                )
                .await;
                println!("lock {name} released");
            } else {
                anyhow::bail!("lock {name} is not held");
            }
        }
    }
    Ok(())
}

async fn lane(global: &GlobalArgs, cmd: LaneCommand) -> anyhow::Result<()> {
    let backends = connect(global, 2).await?;
    let mut conn = backends.engine.connection();
    match cmd {
        LaneCommand::Status => {
            for s in ingest::statuses(&mut conn).await? {
                println!(
                    "{:<8} {:<8} backlog {:>8}  pending {:>6}",
                    s.lane,
                    s.state.as_str(),
                    thousands(s.backlog),
                    s.pending
                );
            }
        }
        LaneCommand::Pause { lane } => {
            let lane = Lane::parse(&lane).map_err(anyhow::Error::msg)?;
            ingest::pause(&mut conn, lane).await?;
            note(
                &backends.pg,
                &cli_actor(),
                "pause_lane",
                lane.as_str(),
                serde_json::json!({}),
            )
            .await;
            println!(
                "lane {lane} paused: payloads queue until it is resumed (or its cap is reached)"
            );
        }
        LaneCommand::Resume { lane } => {
            let lane = Lane::parse(&lane).map_err(anyhow::Error::msg)?;
            ingest::resume(&mut conn, lane).await?;
            note(
                &backends.pg,
                &cli_actor(),
                "resume_lane",
                lane.as_str(),
                serde_json::json!({}),
            )
            .await;
            println!("lane {lane} resumed");
        }
    }
    Ok(())
}

async fn dead_letters(global: &GlobalArgs, cmd: DeadLetterCommand) -> anyhow::Result<()> {
    let backends = connect(global, 2).await?;
    let mut conn = backends.engine.connection();
    match cmd {
        DeadLetterCommand::List { count } => {
            let letters = ingest::dead_letters(&mut conn, count).await?;
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
        DeadLetterCommand::Replay { id } => match ingest::replay(&mut conn, &id).await? {
            ingest::Replay::Requeued(new_id) => {
                note(
                    &backends.pg,
                    &cli_actor(),
                    "replay_dead_letter",
                    &id,
                    serde_json::json!({ "entry": new_id }),
                )
                .await;
                println!("dead letter {id} is back on its lane as {new_id}")
            }
            ingest::Replay::Unknown => anyhow::bail!("no dead letter {id}"),
            ingest::Replay::Cut(length) => anyhow::bail!(
                "dead letter {id} was kept cut short (its {length}-byte payload came while the \
                 dead letters were full): it cannot be replayed; ask its sender to send it again"
            ),
        },
    }
    Ok(())
}

async fn token(global: &GlobalArgs, cmd: TokenCommand) -> anyhow::Result<()> {
    let pg = postgres::connect_and_migrate(&global.database_url, 2).await?;
    match cmd {
        TokenCommand::Create { name, scopes } => {
            let scopes =
                Scope::parse_list(scopes.iter().map(String::as_str)).map_err(anyhow::Error::msg)?;
            anyhow::ensure!(
                !scopes.is_empty(),
                "give at least one scope: checkout, ingest, read or catalog"
            );
            let new = tokens::create(&pg, &name, &scopes).await?;
            note(
                &pg,
                &cli_actor(),
                "create_token",
                &name,
                serde_json::json!({ "id": new.info.id, "scopes": Scope::join(&scopes) }),
            )
            .await;
            println!(
                "token {} ({}) created with scopes {}",
                new.info.id,
                new.info.name,
                Scope::join(&new.info.scopes)
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
                    Scope::join(&t.scopes),
                    state
                );
            }
        }
        TokenCommand::Revoke { id } => {
            if tokens::revoke(&pg, id).await? {
                note(
                    &pg,
                    &cli_actor(),
                    "revoke_token",
                    &id.to_string(),
                    serde_json::json!({}),
                )
                .await;
                println!("token {id} revoked");
            } else {
                anyhow::bail!("no active token {id}");
            }
        }
    }
    Ok(())
}

/// Both backends, as every operator command connects to them.
pub(crate) async fn connect(
    global: &GlobalArgs,
    pg_max_connections: u32,
) -> anyhow::Result<Backends> {
    connect_with(global, pg_max_connections).await
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
        ("feed event guards restored", thousands(report.guards)),
        ("time", format!("{} ms", took.as_millis())),
    ]);
    Ok(())
}

async fn reconcile(global: &GlobalArgs, args: ReconcileArgs) -> anyhow::Result<()> {
    let backends = connect(global, 4).await?;
    let mut bar = Progress::new("reconciling");
    let options = ReconcileOptions {
        correct_up: args.correct_up,
        lease: Duration::from_secs(args.lease_secs),
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
        ("left for the next run", thousands(r.moved)),
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

async fn verify(global: &GlobalArgs, args: VerifyArgs) -> anyhow::Result<()> {
    let backends = connect(global, 4).await?;
    let options = VerifyOptions {
        max_lag: Duration::from_secs(args.max_lag_secs),
        ..VerifyOptions::default()
    };
    let report = holdfast_engine::verify::verify(&backends.engine, &backends.pg, &options).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_verify(&report);
    }
    if !report.passed() {
        anyhow::bail!("{} check(s) failed", report.violations());
    }
    Ok(())
}

/// The report as a table of checks, then a table per failing SKU.
pub fn print_verify(report: &VerifyReport) {
    for c in &report.checks {
        println!(
            "{:<4} {:<72} {}",
            if c.passed { "ok" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    if !report.skus.is_empty() {
        println!();
        println!("{:<20} {:<40} figures", "SKU", "check");
        for v in &report.skus {
            println!("{:<20} {:<40} {}", v.sku, v.check, v.figures);
        }
    }
    println!(
        "{} SKU(s) checked: {}",
        thousands(report.checked),
        if report.passed() {
            "every check held"
        } else {
            "VIOLATIONS"
        }
    );
}

async fn serve(global: &GlobalArgs, args: ServeArgs) -> anyhow::Result<()> {
    let app = Application::build(global, args).await?;
    match &app.sign_in {
        SignIn::Demo(password) => println!(
            "Demo sign-in: users admin, support, merchandiser and viewer, password '{password}' \
             (unless they existed before with other passwords)"
        ),
        SignIn::FirstAdmin(password) => {
            println!("First start: created the user 'admin' with the one-time password {password}");
            println!("Sign in at /login and choose your own password; it is not shown again.");
        }
        SignIn::Existing => {}
    }
    println!("Holdfast is serving at http://{}", app.addr());
    app.run_until(shutdown_signal())
        .await
        .context("the server stopped with an error")?;
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
