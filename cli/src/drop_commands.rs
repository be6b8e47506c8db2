//! Drops from the command line (`holdfast drop …`): show and change a drop's
//! schedule, each change written to the audit log.

use anyhow::Context;
use chrono::{DateTime, Utc};
use holdfast_engine::audit::{cli_actor, note};
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
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
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
