//! Drops from the command line (`holdfast drop …`): show and change a drop's
//! schedule, import and export a drop as a file, arm it and check its
//! readiness; each change written to the audit log.

use anyhow::Context;
use chrono::{DateTime, Utc};
use holdfast_engine::arm::{self, ArmOptions};
use holdfast_engine::audit::{cli_actor, note};
use holdfast_engine::drop_file::{self, Format, ImportOptions, ImportOutcome};
use holdfast_engine::schedule::{self, DropSchedule, ScheduleOutcome};

use crate::commands::Exit;
use crate::config::{DropCommand, GlobalArgs};

/// Reads a time as the command line takes it: RFC 3339 (`2026-12-01T09:00:00Z`,
/// `2026-12-01T10:00:00+01:00`), or `none` for no bound.
fn instant(flag: &str, value: &str) -> anyhow::Result<Option<DateTime<Utc>>> {
    if value.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let at = DateTime::parse_from_rfc3339(value).with_context(|| {
        format!("{flag} {value}: give a time like 2026-12-01T09:00:00Z (RFC 3339), or none")
    })?;
    Ok(Some(at.with_timezone(&Utc)))
}

/// A bound as the command prints it.
fn shown(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(
        || "none".to_owned(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
    )
}

/// Runs `holdfast drop …`.
pub async fn command(global: &GlobalArgs, cmd: DropCommand) -> anyhow::Result<()> {
    match cmd {
        DropCommand::Schedule {
            code,
            starts_at,
            ends_at,
        } => {
            let backends = crate::commands::connect(global, 2).await?;
            let Some(current) = schedule::drop_schedule(&backends.pg, &code).await? else {
                anyhow::bail!("no drop has the code '{code}'");
            };
            let wanted = DropSchedule {
                starts_at: match &starts_at {
                    Some(v) => instant("--starts-at", v)?,
                    None => current.starts_at,
                },
                ends_at: match &ends_at {
                    Some(v) => instant("--ends-at", v)?,
                    None => current.ends_at,
                },
            };
            match schedule::schedule_drop(&backends.engine, &backends.pg, &code, wanted).await? {
                ScheduleOutcome::Scheduled {
                    counters,
                    not_warmed,
                } => {
                    note(
                        &backends.pg,
                        &cli_actor(),
                        "schedule_drop",
                        &code,
                        serde_json::json!({
                            "starts_at": wanted.starts_at,
                            "ends_at": wanted.ends_at,
                        }),
                    )
                    .await;
                    println!(
                        "drop {code}: starts {}, ends {} (by Redis' clock); {counters} counter(s) follow it now{}",
                        shown(wanted.starts_at),
                        shown(wanted.ends_at),
                        if not_warmed > 0 {
                            format!(", {not_warmed} not warmed yet (warm-up writes theirs)")
                        } else {
                            String::new()
                        }
                    );
                    Ok(())
                }
                ScheduleOutcome::UnknownDrop => anyhow::bail!("no drop has the code '{code}'"),
                ScheduleOutcome::Invalid(why) => {
                    eprintln!("error: {why}; nothing changed");
                    Err(Exit(2).into())
                }
            }
        }
        DropCommand::Import {
            file,
            format,
            dry_run,
            reason,
        } => import(global, &file, format.as_deref(), dry_run, &reason).await,
        DropCommand::Export { code, format } => {
            let format = format_named(&format)?;
            let pg =
                holdfast_engine::postgres::connect_and_migrate(&global.database_url, 2).await?;
            let Some(sheet) = drop_file::export(&pg, &code).await? else {
                anyhow::bail!("no drop has the code '{code}'");
            };
            print!("{}", drop_file::render(&sheet, format));
            Ok(())
        }
        DropCommand::Arm { code, pause_feeds } => {
            let backends = crate::commands::connect(global, 2).await?;
            let options = ArmOptions { pause_feeds };
            let report = arm::arm(&backends.engine, &backends.pg, &code, options).await?;
            let Some(report) = report else {
                anyhow::bail!("no drop has the code '{code}'");
            };
            note(
                &backends.pg,
                &cli_actor(),
                "arm_drop",
                &code,
                serde_json::json!({ "pause_feeds": pause_feeds, "ready": report.ready() }),
            )
            .await;
            print_readiness(&report)
        }
        DropCommand::Ready { code } => {
            let backends = crate::commands::connect(global, 2).await?;
            let Some(report) = arm::readiness(&backends.engine, &backends.pg, &code).await? else {
                anyhow::bail!("no drop has the code '{code}'");
            };
            print_readiness(&report)
        }
        DropCommand::Report { code, csv } => {
            let pg =
                holdfast_engine::postgres::connect_and_migrate(&global.database_url, 2).await?;
            let Some(report) = holdfast_engine::report::drop_report(&pg, &code).await? else {
                anyhow::bail!("no drop has the code '{code}'");
            };
            if csv {
                print!("{}", report.to_csv());
            } else {
                print_report(&report);
            }
            Ok(())
        }
        DropCommand::Show { code } => {
            let pg =
                holdfast_engine::postgres::connect_and_migrate(&global.database_url, 2).await?;
            let Some(s) = schedule::drop_schedule(&pg, &code).await? else {
                anyhow::bail!("no drop has the code '{code}'");
            };
            println!(
                "drop {code}: starts {}, ends {}",
                shown(s.starts_at),
                shown(s.ends_at)
            );
            Ok(())
        }
    }
}

/// A file form named on the command line.
fn format_named(name: &str) -> anyhow::Result<Format> {
    Format::named(name).with_context(|| format!("--format {name}: use csv or json"))
}

/// Runs `holdfast drop import`: exit 2 (nothing changed) when the file is refused.
async fn import(
    global: &GlobalArgs,
    file: &str,
    format: Option<&str>,
    dry_run: bool,
    reason: &str,
) -> anyhow::Result<()> {
    let format = match format {
        Some(name) => format_named(name)?,
        None => Format::of_path(file).with_context(|| {
            format!(
                "{file}: say --format csv or --format json (the name does not end in .csv or .json)"
            )
        })?,
    };
    let text = if file == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?
    };
    let (sheet, lines) = match drop_file::parse(&text, format) {
        Ok(read) => read,
        Err(problems) => return refused(file, &problems),
    };
    let backends = crate::commands::connect(global, 2).await?;
    let actor = cli_actor();
    let options = ImportOptions {
        actor: &actor,
        reason,
        dry_run,
    };
    let report =
        match drop_file::import(&backends.engine, &backends.pg, &sheet, &lines, options).await? {
            ImportOutcome::Done(report) => report,
            ImportOutcome::Refused(problems) => return refused(file, &problems),
        };
    let verb = if dry_run { "would change" } else { "changed" };
    if report.changes.is_empty() {
        println!("drop {}: nothing to change; it matches {file}", report.code);
    } else {
        println!(
            "drop {}: {verb} {} thing(s):",
            report.code,
            report.changes.len()
        );
        for c in &report.changes {
            println!("  {c}");
        }
    }
    if !report.not_in_file.is_empty() {
        println!(
            "  left in the drop as they are (not in the file): {}",
            report.not_in_file.join(", ")
        );
    }
    for warning in &report.warnings {
        println!("  warning: {warning}");
    }
    if dry_run {
        println!("dry run: nothing was written");
    } else if report.stock_changes_applied > 0 || report.counters_warmed > 0 {
        println!(
            "live counters: {} created, {} stock change(s) applied",
            report.counters_warmed, report.stock_changes_applied
        );
    }
    Ok(())
}

/// Prints why a file was refused and exits 2.
fn refused(file: &str, problems: &[holdfast_domain::sheet::Problem]) -> anyhow::Result<()> {
    eprintln!("error: {file} was not imported; nothing changed:");
    for p in problems {
        eprintln!("  {p}");
    }
    Err(Exit(2).into())
}

/// Prints a drop's report as a table.
fn print_report(report: &holdfast_domain::report::DropReport) {
    println!(
        "drop {} ({}): starts {}, ends {}",
        report.code,
        report.name,
        report.starts_at.as_deref().unwrap_or("none"),
        report.ends_at.as_deref().unwrap_or("none")
    );
    println!(
        "{:<16} {:>7} {:>7} {:>7} {:>9} {:>8} {:>8} {:>7} {:>5} {:>5} {:>9} {:>6} {:>9} {:>10}",
        "sku",
        "stock",
        "sold",
        "holds",
        "confirmed",
        "released",
        "support",
        "expired",
        "open",
        "late",
        "shortfall",
        "peak/s",
        "tries/s",
        "sold out"
    );
    for s in &report.skus {
        println!(
            "{:<16} {:>7} {:>7} {:>7} {:>9} {:>8} {:>8} {:>7} {:>5} {:>5} {:>9} {:>6} {:>9} {:>10}",
            s.sku,
            s.stock,
            s.units_sold,
            s.holds,
            s.confirmed,
            s.released_by_shoppers,
            s.released_by_support,
            s.expired,
            s.open,
            s.late_payments,
            s.shortfalls,
            s.peak_holds_per_second,
            s.peak_attempts_per_second,
            s.sold_out_after_secs
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1} s"))
        );
    }
}

/// Prints a drop's readiness as a table; exits 1 when it is not ready.
fn print_readiness(report: &holdfast_domain::readiness::Readiness) -> anyhow::Result<()> {
    for done in &report.armed {
        println!("armed: {done}");
    }
    for line in &report.lines {
        println!(
            "{:<5} {:<36} {}",
            if line.ok { "ok" } else { "NOT" },
            line.name,
            line.finding
        );
    }
    if report.ready() {
        println!("drop {}: ready", report.code);
        Ok(())
    } else {
        println!("drop {}: NOT ready (see the lines marked NOT)", report.code);
        Err(Exit(1).into())
    }
}
