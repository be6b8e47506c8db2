//! Drops from the dashboard: import a drop file with a preview, export one,
//! arm a drop and check its readiness, read its report, through the engine's rules.

use leptos::prelude::*;

use holdfast_domain::readiness::Readiness;
use holdfast_domain::report::DropReport;
use holdfast_domain::sheet::ImportOutcome;

/// The answer for a drop code nothing has: 404, said plainly.
#[cfg(feature = "ssr")]
fn no_drop(code: &str) -> ServerFnError {
    crate::server::guard::refuse(
        http::StatusCode::NOT_FOUND,
        format!("No drop has the code '{}'.", code.trim()),
    )
}

/// The answer for a file form other than CSV or JSON: 400.
#[cfg(feature = "ssr")]
fn not_a_form(format: &str) -> ServerFnError {
    crate::server::guard::refuse(
        http::StatusCode::BAD_REQUEST,
        format!("'{format}' is not a file form: csv or json"),
    )
}

/// Imports a drop file's `text` (`format`: csv or json) as its author
/// (`dry_run`: reports the changes, writes nothing). A refused file is an
/// answer (its problems), not an error.
#[server(endpoint = "import_drop")]
pub async fn import_drop(
    text: String,
    format: String,
    dry_run: bool,
    reason: String,
) -> Result<ImportOutcome, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::drop_file::{self, Format};

    use crate::server::guard;

    let caller = guard::authorize(Permission::EditDrops).await?;
    let format = Format::named(&format).ok_or_else(|| not_a_form(&format))?;
    let (sheet, lines) = match drop_file::parse(&text, format) {
        Ok(read) => read,
        Err(problems) => return Ok(ImportOutcome::Refused(problems)),
    };
    let reason = match reason.trim() {
        "" => "dashboard import",
        given => given,
    };
    // Runs to its end even if the tab is closed meanwhile.
    drop_file::import_to_the_end(
        caller.backends.clone(),
        sheet,
        lines,
        caller.user.username.clone(),
        reason.to_owned(),
        dry_run,
    )
    .await
    .map_err(guard::internal("Importing the drop"))
}

/// Drop `code` as a file of `format` (csv or json).
#[server(endpoint = "export_drop")]
pub async fn export_drop(code: String, format: String) -> Result<String, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::drop_file::{self, Format};

    use crate::server::guard;

    let caller = guard::authorize(Permission::EditDrops).await?;
    let format = Format::named(&format).ok_or_else(|| not_a_form(&format))?;
    let sheet = drop_file::export(&caller.backends.pg, code.trim())
        .await
        .map_err(guard::internal("Exporting the drop"))?
        .ok_or_else(|| no_drop(&code))?;
    Ok(drop_file::render(&sheet, format))
}

/// Drop `code`'s readiness, read without changing anything.
#[server(endpoint = "drop_readiness")]
pub async fn drop_readiness(code: String) -> Result<Readiness, ServerFnError> {
    use holdfast_domain::Permission;

    use crate::server::guard;

    let caller = guard::authorize(Permission::View).await?;
    holdfast_engine::arm::readiness(&caller.backends.engine, &caller.backends.pg, code.trim())
        .await
        .map_err(guard::internal("Checking the drop"))?
        .ok_or_else(|| no_drop(&code))
}

/// Arms drop `code` (warms its counters, writes its schedule and limits,
/// pauses the feeds lane when `pause_feeds`) and answers its readiness.
#[server(endpoint = "arm_drop")]
pub async fn arm_drop(code: String, pause_feeds: bool) -> Result<Readiness, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::arm::{self, ArmOptions};

    use crate::server::guard;

    let caller = guard::authorize(Permission::EditDrops).await?;
    if pause_feeds && !caller.user.role.may(Permission::Operate) {
        return Err(guard::refuse(
            http::StatusCode::FORBIDDEN,
            "Pausing the feeds lane is for operators (they resume it too); arm without it, or ask an admin.",
        ));
    }
    let code = code.trim().to_owned();
    let report = arm::arm(
        &caller.backends.engine,
        &caller.backends.pg,
        &code,
        ArmOptions { pause_feeds },
    )
    .await
    .map_err(guard::internal("Arming the drop"))?
    .ok_or_else(|| no_drop(&code))?;
    guard::audit(
        &caller,
        "arm_drop",
        &code,
        serde_json::json!({ "pause_feeds": pause_feeds, "ready": report.ready() }),
    )
    .await;
    Ok(report)
}

/// Drop `code`'s report: per SKU, what sold and how every hold ended.
#[server(endpoint = "drop_report")]
pub async fn load_drop_report(code: String) -> Result<DropReport, ServerFnError> {
    use holdfast_domain::Permission;

    use crate::server::guard;

    let caller = guard::authorize(Permission::View).await?;
    holdfast_engine::report::drop_report(&caller.backends.pg, code.trim())
        .await
        .map_err(guard::internal("Reading the report"))?
        .ok_or_else(|| no_drop(&code))
}
