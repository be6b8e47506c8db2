//! A drop as a file: import (checked first, previewed by a dry run, written all
//! or nothing) and export. `holdfast drop import|export` and
//! `PUT|GET /api/v1/drops/{code}` both come here.
//!
//! An import is declarative: the drop gets the file's name, schedule and SKUs
//! (SKUs of the drop the file leaves out stay in it, listed in the report).
//! A SKU's `stock` is the units the drop is given ([`holdfast_domain::sheet::SheetSku::stock`]):
//! a new SKU starts with that many on hand; a change of it for an existing SKU
//! is recorded with the import's transaction as a pending stock change and then
//! applied to the live counter by `delta.lua` (source `import`), the path a
//! feed's delta takes, so open holds, owed units and the ledger stay right. The
//! write-behind records it in the ledger under the change's event id, and only
//! then is it marked applied. A change cut short after the commit (Redis down
//! or losing its data, the process killed) is applied by the servers' stock
//! changes worker within seconds, or by the next import ([`apply_pending_stock`]);
//! until then `holdfast verify` and a drop's readiness show it as waiting.

use chrono::{DateTime, SecondsFormat, Utc};
pub use holdfast_domain::sheet::ImportOutcome;
use holdfast_domain::sheet::{
    Change, DEFAULT_LOW_STOCK_THRESHOLD, DropSheet, ImportReport, MAX_SKUS, Problem, SheetSku,
};
use sqlx::PgPool;

use crate::engine::{Engine, valid_sku};
use crate::error::EngineError;
use crate::schedule::{DropSchedule, lock_drop, push_settings, shared_with_scheduled};
use crate::stock::DeltaOutcome;
use crate::warmup::warm_list;

/// Largest drop file read, in bytes (10,000 SKUs of CSV fit in about
/// 1.5 MiB): the API's `PUT` takes no larger body, and [`parse`] refuses
/// larger text whatever brought it.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;

/// The ledger source of stock changes made by imports.
pub const SOURCE: &str = "import";

/// Most units a file may give one SKU: far beyond any drop, and well inside what
/// Redis' Lua (whose numbers are doubles) counts exactly.
pub const MAX_STOCK: i64 = 1_000_000_000_000;

/// Why text holding a NUL character is refused.
const NUL: &str = "holds a NUL character, which cannot be stored";

/// The two forms a drop file takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One row per SKU under a header ([`holdfast_domain::sheet::CSV_COLUMNS`]).
    Csv,
    /// A [`DropSheet`] object.
    Json,
}

impl Format {
    /// The form called `name` (`csv`, `json`, any case).
    pub fn named(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "csv" => Some(Self::Csv),
            "json" => Some(Self::Json),
            _ => None,
        }
    }

    /// The form a file's name says (`.csv`, `.json`), if it says one.
    pub fn of_path(path: &str) -> Option<Self> {
        let lower = path.to_ascii_lowercase();
        if lower.ends_with(".csv") {
            Some(Self::Csv)
        } else if lower.ends_with(".json") {
            Some(Self::Json)
        } else {
            None
        }
    }
}

/// A file's text as a sheet, with the line each SKU was on (CSV; empty for
/// JSON, whose problems name paths), or every problem found reading it.
pub fn parse(text: &str, format: Format) -> Result<(DropSheet, Vec<u64>), Vec<Problem>> {
    if text.len() > MAX_FILE_BYTES {
        return Err(vec![Problem {
            line: None,
            column: String::new(),
            message: format!("a drop file has at most {MAX_FILE_BYTES} bytes"),
        }]);
    }
    match format {
        Format::Csv => {
            let (sheet, lines, mut problems) = holdfast_domain::sheet::parse_csv_partly(text)?;
            if problems.is_empty() {
                return Ok((sheet, lines));
            }
            // The rest of the file's problems too, each place once.
            if let Err(more) = check(&sheet, &lines) {
                for p in more {
                    if !problems
                        .iter()
                        .any(|q| q.line == p.line && q.column == p.column)
                    {
                        problems.push(p);
                    }
                }
            }
            problems.sort_by_key(|p| p.line);
            Err(problems)
        }
        Format::Json => serde_json::from_str::<DropSheet>(text.trim_start_matches('\u{feff}'))
            .map(|sheet| (sheet, Vec::new()))
            .map_err(|e| {
                vec![Problem {
                    line: Some(e.line() as u64),
                    column: format!("character {}", e.column()),
                    message: e.to_string(),
                }]
            }),
    }
}

/// `sheet` as a file of `format`.
pub fn render(sheet: &DropSheet, format: Format) -> String {
    match format {
        Format::Csv => holdfast_domain::sheet::to_csv(sheet),
        Format::Json => {
            let mut text = serde_json::to_string_pretty(sheet).unwrap_or_default();
            text.push('\n');
            text
        }
    }
}

/// Where a problem with a sheet's field is: a CSV line and column, or a JSON path.
struct Locate<'a> {
    lines: &'a [u64],
    first_line: Option<u64>,
}

impl Locate<'_> {
    fn drop_field(&self, column: &str, json: &str, message: String) -> Problem {
        match self.first_line {
            Some(line) => Problem {
                line: Some(line),
                column: column.into(),
                message,
            },
            None => Problem {
                line: None,
                column: json.into(),
                message,
            },
        }
    }

    fn sku_field(&self, index: usize, column: &str, message: String) -> Problem {
        match self.lines.get(index) {
            Some(line) => Problem {
                line: Some(*line),
                column: column.into(),
                message,
            },
            None => Problem {
                line: None,
                column: format!("skus[{index}].{column}"),
                message,
            },
        }
    }
}

/// Whether `code` is a drop code PostgreSQL accepts: lower-case letters,
/// digits and `-`, starting with a letter or digit, at most 64.
pub fn valid_drop_code(code: &str) -> bool {
    let mut chars = code.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && code.len() <= 64
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// A time as a file gives it (RFC 3339).
fn instant(value: &Option<String>) -> Result<Option<DateTime<Utc>>, String> {
    match value.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => DateTime::parse_from_rfc3339(v)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|_| format!("'{v}' is not a time like 2026-12-01T09:00:00Z (RFC 3339)")),
    }
}

/// A time as files and reports show it: to the second, or finer when it was
/// given finer (so an export imported back is the same instant).
fn shown(at: Option<DateTime<Utc>>) -> Option<String> {
    at.map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

/// Every problem with `sheet`'s values (`lines`: each SKU's CSV line, empty for
/// JSON), and its schedule when it has none.
pub fn check(sheet: &DropSheet, lines: &[u64]) -> Result<DropSchedule, Vec<Problem>> {
    let at = Locate {
        lines,
        first_line: lines.first().copied(),
    };
    let mut problems = Vec::new();
    if !valid_drop_code(&sheet.code) {
        problems.push(at.drop_field(
            "drop",
            "code",
            format!(
                "'{}' is not a drop code: lower-case letters, digits and '-', at most 64",
                sheet.code
            ),
        ));
    }
    if sheet.name.chars().count() > 200 {
        problems.push(at.drop_field("drop_name", "name", "at most 200 characters".into()));
    }
    if sheet.name.contains('\0') {
        problems.push(at.drop_field("drop_name", "name", NUL.into()));
    }
    let mut schedule = DropSchedule::default();
    match instant(&sheet.starts_at) {
        Ok(t) => schedule.starts_at = t,
        Err(m) => problems.push(at.drop_field("starts_at", "starts_at", m)),
    }
    match instant(&sheet.ends_at) {
        Ok(t) => schedule.ends_at = t,
        Err(m) => problems.push(at.drop_field("ends_at", "ends_at", m)),
    }
    schedule = schedule.to_millis();
    if let Some(why) = schedule.problem() {
        // Name the bound at fault: the start out of range, else the end.
        let field = if why.starts_with("the start") {
            "starts_at"
        } else {
            "ends_at"
        };
        problems.push(at.drop_field(field, field, why.into()));
    }
    if sheet.skus.is_empty() {
        problems.push(at.drop_field("sku", "skus", "a drop needs at least one SKU".into()));
    }
    if sheet.skus.len() > MAX_SKUS {
        problems.push(at.drop_field("sku", "skus", format!("at most {MAX_SKUS} SKUs")));
    }
    let mut seen = std::collections::HashMap::new();
    for (i, s) in sheet.skus.iter().enumerate() {
        let mut bad =
            |column: &str, message: String| problems.push(at.sku_field(i, column, message));
        if !valid_sku(&s.sku) {
            bad(
                "sku",
                format!(
                    "'{}' is not a SKU code: letters, digits and . _ -, at most 64",
                    s.sku
                ),
            );
        } else if let Some(first) = seen.insert(s.sku.clone(), i) {
            let first = lines
                .get(first)
                .map_or_else(|| format!("skus[{first}]"), |l| format!("line {l}"));
            bad(
                "sku",
                format!("{} is listed twice (first at {first})", s.sku),
            );
        }
        let text = |v: &str| !v.trim().is_empty() && v.chars().count() <= 200;
        if !text(&s.product) {
            bad("product", "required: 1 to 200 characters".into());
        }
        if s.variant
            .as_deref()
            .is_some_and(|v| v.chars().count() > 200)
        {
            bad("variant", "at most 200 characters".into());
        }
        // A blank title falls back to the product and variant, which together
        // may be too long for one.
        if s.title_or_default().chars().count() > 200 {
            let given = s.title.as_deref().is_some_and(|t| !t.trim().is_empty());
            bad(
                "title",
                if given {
                    "at most 200 characters".into()
                } else {
                    "the product and variant make a title over 200 characters: give a shorter title"
                        .into()
                },
            );
        }
        for (column, value) in [
            ("sku", Some(s.sku.as_str())),
            ("product", Some(s.product.as_str())),
            ("variant", s.variant.as_deref()),
            ("title", s.title.as_deref()),
        ] {
            if value.is_some_and(|v| v.contains('\0')) {
                bad(column, NUL.into());
            }
        }
        if !(0..=MAX_STOCK).contains(&s.stock) {
            bad(
                "stock",
                format!("the units the drop is given: a whole number from 0 to {MAX_STOCK}"),
            );
        }
        if s.per_buyer_limit.is_some_and(|n| n < 1) {
            bad(
                "per_buyer_limit",
                "at least 1, or blank for no limit".into(),
            );
        }
        if s.low_stock_threshold.is_some_and(|n| n < 0) {
            bad("low_stock_threshold", "at least 0".into());
        }
    }
    if problems.is_empty() {
        Ok(schedule)
    } else {
        Err(problems)
    }
}

/// Who imports, why, and whether for real.
#[derive(Debug, Clone, Copy)]
pub struct ImportOptions<'a> {
    /// The audit actor (a dashboard user, `cli:<user>`, `token:<name>`).
    pub actor: &'a str,
    /// Why, for the audit log and each stock change.
    pub reason: &'a str,
    /// Report what would change and change nothing.
    pub dry_run: bool,
}

/// A SKU as PostgreSQL has it, in the file's terms.
#[derive(sqlx::FromRow)]
struct Current {
    sku: String,
    product: String,
    variant: Option<String>,
    title: String,
    stock: i64,
    per_buyer_limit: Option<i32>,
    low_stock_threshold: i32,
    /// Units on hand now (the stock given, moved by feeds, less units sold).
    on_hand: i64,
    /// Units sold so far, as recorded.
    sold_recorded: i64,
}

/// A change of `field` of `sku` (or of the drop, without a SKU).
fn change(
    what: &str,
    sku: Option<&str>,
    field: Option<&str>,
    from: Option<String>,
    to: Option<String>,
) -> Change {
    Change {
        what: what.into(),
        sku: sku.map(str::to_owned),
        field: field.map(str::to_owned),
        from,
        to,
    }
}

/// Imports `sheet` (checked by [`check`]; `lines` as there): all of it in one
/// PostgreSQL transaction, then the live counters (new ones warmed, stock
/// changes applied, schedule and limits set). A failure after the commit is an
/// error; importing again converges.
pub async fn import(
    engine: &Engine,
    pg: &PgPool,
    sheet: &DropSheet,
    lines: &[u64],
    options: ImportOptions<'_>,
) -> Result<ImportOutcome, EngineError> {
    let schedule = match check(sheet, lines) {
        Ok(s) => s,
        Err(problems) => return Ok(ImportOutcome::Refused(problems)),
    };
    if options.reason.contains('\0') {
        return Ok(ImportOutcome::Refused(vec![Problem {
            line: None,
            column: "reason".into(),
            message: format!("the reason {NUL}"),
        }]));
    }
    let code = sheet.code.as_str();
    let skus: Vec<String> = sheet.skus.iter().map(|s| s.sku.clone()).collect();
    let mut tx = pg.begin().await?;
    // The drop first (another import of it or its schedule waits), then every
    // SKU it will hold: the file's and those it keeps from before. An import
    // or schedule of another drop sharing any of them waits (or is waited
    // for): both cannot take one new SKU as new, nor schedule it in two drops.
    lock_drop(&mut tx, code, &[]).await?;
    let kept: Vec<String> = sqlx::query_scalar("SELECT sku FROM drop_skus WHERE drop_code = $1")
        .bind(code)
        .fetch_all(&mut *tx)
        .await?;
    let mut held = skus.clone();
    held.extend(kept);
    held.sort();
    held.dedup();
    lock_drop(&mut tx, code, &held).await?;
    type DropRow = (String, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
    let drop: Option<DropRow> =
        sqlx::query_as("SELECT name, starts_at, ends_at FROM drops WHERE code = $1 FOR UPDATE")
            .bind(code)
            .fetch_optional(&mut *tx)
            .await?;
    let current: Vec<Current> = sqlx::query_as(
        "SELECT sku, product, variant, title, stock_declared AS stock,
                per_buyer_limit, low_stock_threshold, on_hand, sold_recorded
           FROM skus WHERE sku = ANY($1) ORDER BY sku FOR UPDATE",
    )
    .bind(&skus)
    .fetch_all(&mut *tx)
    .await?;
    let current: std::collections::HashMap<&str, &Current> =
        current.iter().map(|c| (c.sku.as_str(), c)).collect();
    let members: Vec<(String, i32)> = sqlx::query_as(
        "SELECT sku, position FROM drop_skus WHERE drop_code = $1 ORDER BY position, sku",
    )
    .bind(code)
    .fetch_all(&mut *tx)
    .await?;

    if schedule.starts_at.is_some() || schedule.ends_at.is_some() {
        let mut all = skus.clone();
        all.extend(members.iter().map(|(s, _)| s.clone()));
        if let Some(why) = shared_with_scheduled(&mut *tx, code, &all).await? {
            let at = Locate {
                lines,
                first_line: lines.first().copied(),
            };
            return Ok(ImportOutcome::Refused(vec![at.drop_field(
                "starts_at",
                "starts_at",
                why,
            )]));
        }
    }

    let mut changes = Vec::new();
    let name = match (&drop, sheet.name.trim()) {
        (None, "") => code.to_owned(),
        (Some((old, _, _)), "") => old.clone(),
        (_, given) => given.to_owned(),
    };
    match &drop {
        None => changes.push(change("create_drop", None, None, None, Some(name.clone()))),
        Some((old, _, _)) if *old != name => changes.push(change(
            "drop_field",
            None,
            Some("name"),
            Some(old.clone()),
            Some(name.clone()),
        )),
        Some(_) => {}
    }
    let (old_start, old_end) = drop.as_ref().map_or((None, None), |d| (d.1, d.2));
    for (field, old, new) in [
        ("starts_at", old_start, schedule.starts_at),
        ("ends_at", old_end, schedule.ends_at),
    ] {
        if old != new {
            changes.push(change(
                "drop_field",
                None,
                Some(field),
                shown(old),
                shown(new),
            ));
        }
    }
    let member_position: std::collections::HashMap<&str, i32> =
        members.iter().map(|(s, p)| (s.as_str(), *p)).collect();
    let mut stock_moves: Vec<(String, i64)> = Vec::new();
    let mut warnings = Vec::new();
    let mut reordered = false;
    for (i, s) in sheet.skus.iter().enumerate() {
        let sku = s.sku.as_str();
        let title = s.title_or_default();
        let threshold = s.low_stock_threshold.unwrap_or(DEFAULT_LOW_STOCK_THRESHOLD);
        let Some(old) = current.get(sku) else {
            changes.push(change(
                "add_sku",
                Some(sku),
                None,
                None,
                Some(s.stock.to_string()),
            ));
            continue;
        };
        match member_position.get(sku) {
            None => changes.push(change("join_drop", Some(sku), None, None, None)),
            Some(p) if *p != i as i32 => reordered = true,
            Some(_) => {}
        }
        let variant = s.variant.clone().filter(|v| !v.trim().is_empty());
        let num = |v: Option<i32>| v.map(|n| n.to_string());
        for (field, from, to) in [
            (
                "product",
                Some(old.product.clone()),
                Some(s.product.trim().to_owned()),
            ),
            ("variant", old.variant.clone(), variant),
            ("title", Some(old.title.clone()), Some(title)),
            (
                "per_buyer_limit",
                num(old.per_buyer_limit),
                num(s.per_buyer_limit),
            ),
            (
                "low_stock_threshold",
                Some(old.low_stock_threshold.to_string()),
                Some(threshold.to_string()),
            ),
        ] {
            if from != to {
                changes.push(change("sku_field", Some(sku), Some(field), from, to));
            }
        }
        if old.stock != s.stock {
            changes.push(change(
                "stock",
                Some(sku),
                None,
                Some(old.stock.to_string()),
                Some(s.stock.to_string()),
            ));
            stock_moves.push((sku.to_owned(), s.stock - old.stock));
            let short = -(old.on_hand + s.stock - old.stock);
            if short > 0 {
                warnings.push(format!(
                    "{sku}: a stock of {} leaves {short} of the {} unit(s) already sold without \
                     stock: they become an oversell to refund or source",
                    s.stock, old.sold_recorded
                ));
            }
        }
    }
    if reordered {
        changes.push(change("drop_field", None, Some("order"), None, None));
    }
    let listed: std::collections::HashSet<&str> = skus.iter().map(String::as_str).collect();
    let not_in_file: Vec<String> = members
        .iter()
        .filter(|(s, _)| !listed.contains(s.as_str()))
        .map(|(s, _)| s.clone())
        .collect();
    let mut report = ImportReport {
        code: code.to_owned(),
        dry_run: options.dry_run,
        changes,
        not_in_file,
        warnings,
        stock_changes_applied: 0,
        counters_warmed: 0,
    };
    if options.dry_run || report.changes.is_empty() {
        tx.rollback().await?;
        if !options.dry_run {
            // Nothing to write; what an earlier import left pending still goes.
            finish(engine, pg, code, &skus, &mut report).await?;
        }
        return Ok(ImportOutcome::Done(report));
    }

    sqlx::query(
        "INSERT INTO drops (code, name, starts_at, ends_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (code) DO UPDATE SET name = $2, starts_at = $3, ends_at = $4",
    )
    .bind(code)
    .bind(&name)
    .bind(schedule.starts_at)
    .bind(schedule.ends_at)
    .execute(&mut *tx)
    .await?;
    write_skus(&mut tx, &sheet.skus).await?;
    sqlx::query(
        "INSERT INTO drop_skus (drop_code, sku, position)
         SELECT $1, t.sku, t.position FROM UNNEST($2::text[], $3::int[]) AS t(sku, position)
         ON CONFLICT (drop_code, sku) DO UPDATE SET position = excluded.position
          WHERE drop_skus.position <> excluded.position",
    )
    .bind(code)
    .bind(&skus)
    .bind((0..skus.len() as i32).collect::<Vec<i32>>())
    .execute(&mut *tx)
    .await?;
    if !stock_moves.is_empty() {
        let (sku, delta): (Vec<String>, Vec<i64>) = stock_moves.into_iter().unzip();
        let ids: Vec<String> = sku
            .iter()
            .map(|_| format!("{SOURCE}:{}", uuid::Uuid::new_v4()))
            .collect();
        sqlx::query(
            "INSERT INTO stock_changes (event_id, sku, delta, actor, reason)
             SELECT t.id, t.sku, t.delta, $4, $5
               FROM UNNEST($1::text[], $2::text[], $3::bigint[]) AS t(id, sku, delta)",
        )
        .bind(&ids)
        .bind(&sku)
        .bind(&delta)
        .bind(options.actor)
        .bind(options.reason)
        .execute(&mut *tx)
        .await?;
    }
    crate::audit::record(
        &mut *tx,
        options.actor,
        "import_drop",
        code,
        serde_json::json!({
            "reason": options.reason,
            "changes": report.changes.len(),
            "skus": skus.len(),
            "first_changes": report.changes.iter().take(50).map(|c| c.to_string()).collect::<Vec<_>>(),
        }),
    )
    .await?;
    tx.commit().await?;
    finish(engine, pg, code, &skus, &mut report)
        .await
        .map_err(|e| EngineError::SavedNotLive(Box::new(e)))?;
    Ok(ImportOutcome::Done(report))
}

/// Drop imports one process runs at once ([`import_to_the_end`]); past it, a
/// new one is [`EngineError::Busy`]. An import runs on after its caller has
/// gone, so without a bound callers who send a file and hang up could start
/// imports without end, each waiting for the drop's lock with a PostgreSQL
/// connection of the pool.
pub const IMPORTS_AT_ONCE: usize = 2;

/// [`import`] run to its end even if the caller stops waiting (an HTTP
/// request past its deadline, a browser tab closed): a sent file is then wholly
/// imported or wholly refused, never cut between its commit and the live side.
/// At most [`IMPORTS_AT_ONCE`] run at once in a process, those whose callers
/// left included.
pub async fn import_to_the_end(
    backends: crate::Backends,
    sheet: DropSheet,
    lines: Vec<u64>,
    actor: String,
    reason: String,
    dry_run: bool,
) -> Result<ImportOutcome, EngineError> {
    let place = backends.imports.clone().try_acquire_owned().map_err(|_| {
        EngineError::Busy(format!(
            "{IMPORTS_AT_ONCE} drop imports are running on this server already; \
             try again when one has finished"
        ))
    })?;
    tokio::spawn(async move {
        let _place = place;
        let options = ImportOptions {
            actor: &actor,
            reason: &reason,
            dry_run,
        };
        import(&backends.engine, &backends.pg, &sheet, &lines, options).await
    })
    .await
    .map_err(|e| EngineError::UnexpectedReply(format!("the import stopped: {e}")))?
}

/// Writes the file's SKUs (new ones with their stock on hand; existing ones'
/// descriptive fields and declared stock, never their on-hand count).
async fn write_skus(tx: &mut sqlx::PgConnection, skus: &[SheetSku]) -> Result<(), EngineError> {
    let col = |f: &dyn Fn(&SheetSku) -> String| skus.iter().map(f).collect::<Vec<String>>();
    let variants: Vec<Option<String>> = skus
        .iter()
        .map(|s| s.variant.clone().filter(|v| !v.trim().is_empty()))
        .collect();
    sqlx::query(
        "INSERT INTO skus (sku, product, variant, title, on_hand, stock_declared, per_buyer_limit, low_stock_threshold)
         SELECT t.sku, t.product, t.variant, t.title, t.stock, t.stock, t.lim, t.low
           FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::int[])
                AS t(sku, product, variant, title, stock, lim, low)
         ON CONFLICT (sku) DO UPDATE
            SET product = excluded.product, variant = excluded.variant, title = excluded.title,
                stock_declared = excluded.stock_declared, per_buyer_limit = excluded.per_buyer_limit,
                low_stock_threshold = excluded.low_stock_threshold, updated_at = now()
          WHERE (skus.product, skus.variant, skus.title, skus.stock_declared, skus.per_buyer_limit,
                 skus.low_stock_threshold)
                IS DISTINCT FROM (excluded.product, excluded.variant, excluded.title,
                 excluded.stock_declared, excluded.per_buyer_limit, excluded.low_stock_threshold)",
    )
    .bind(col(&|s| s.sku.clone()))
    .bind(col(&|s| s.product.trim().to_owned()))
    .bind(variants)
    .bind(col(&|s| s.title_or_default()))
    .bind(skus.iter().map(|s| s.stock).collect::<Vec<i64>>())
    .bind(skus.iter().map(|s| s.per_buyer_limit).collect::<Vec<Option<i32>>>())
    .bind(
        skus.iter()
            .map(|s| s.low_stock_threshold.unwrap_or(DEFAULT_LOW_STOCK_THRESHOLD))
            .collect::<Vec<i32>>(),
    )
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The live side of an import, after its commit: counters for SKUs that have
/// none, pending stock changes, and the drop's schedule and limits.
async fn finish(
    engine: &Engine,
    pg: &PgPool,
    code: &str,
    skus: &[String],
    report: &mut ImportReport,
) -> Result<(), EngineError> {
    report.counters_warmed = warm_list(engine, pg, skus).await?.warmed;
    report.stock_changes_applied = apply_pending_stock(engine, pg).await?;
    push_settings(engine, pg, code).await?;
    Ok(())
}

/// Applies every pending stock change to its live counter and returns how
/// many moved a counter now. A change stays pending until the ledger has it
/// (then it is marked applied): applied in Redis but lost with Redis' data
/// before the write-behind recorded it, it is applied again to the counter
/// warm-up rebuilt from PostgreSQL, which does not count it; applied and still
/// in Redis, `delta.lua`'s event guard makes the retry a no-op. A SKU without a
/// counter is warmed first. One change Redis refuses (a script error) is
/// logged and skipped, so it cannot hold back the others; Redis unreachable is
/// an error. The servers run this every few seconds, and after each import.
pub async fn apply_pending_stock(engine: &Engine, pg: &PgPool) -> Result<u64, EngineError> {
    sqlx::query(
        "UPDATE stock_changes c SET applied_at = now()
          WHERE c.applied_at IS NULL
            AND EXISTS (SELECT 1 FROM ledger l WHERE l.source = $1 AND l.event_id = c.event_id)",
    )
    .bind(SOURCE)
    .execute(pg)
    .await?;
    let pending: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT event_id, sku, delta FROM stock_changes
          WHERE applied_at IS NULL ORDER BY created_at, event_id LIMIT 10000",
    )
    .fetch_all(pg)
    .await?;
    let mut applied = 0;
    for (event_id, sku, delta) in pending {
        let apply = || engine.apply_delta(&sku, delta, SOURCE, &event_id);
        let outcome = match apply().await {
            Ok(DeltaOutcome::NotWarmed) => {
                warm_list(engine, pg, std::slice::from_ref(&sku)).await?;
                apply().await
            }
            other => other,
        };
        match outcome {
            Ok(DeltaOutcome::Applied { .. }) => applied += 1,
            // Applied before (the ledger will have it), or a SKU PostgreSQL
            // no longer knows: left pending, and shown as such.
            Ok(DeltaOutcome::Duplicate | DeltaOutcome::NotWarmed) => {}
            Err(e) if e.code() == holdfast_domain::ErrorCode::Unavailable => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, event_id, sku, delta, "a stock change could not be applied; skipped");
            }
        }
    }
    Ok(applied)
}

/// Stock changes of `skus` (all SKUs when `None`) not yet in the ledger and
/// older than `older_than`: `(how many, age of the oldest in ms)`.
pub async fn pending_stock(
    pg: &PgPool,
    skus: Option<&[String]>,
    older_than: std::time::Duration,
) -> Result<(i64, i64), EngineError> {
    Ok(sqlx::query_as(
        "SELECT count(*), coalesce((extract(epoch FROM now() - min(created_at)) * 1000)::bigint, 0)
           FROM stock_changes
          WHERE applied_at IS NULL AND ($1::text[] IS NULL OR sku = ANY($1))
            AND created_at < now() - make_interval(secs => $2)",
    )
    .bind(skus)
    .bind(older_than.as_secs_f64())
    .fetch_one(pg)
    .await?)
}

/// Drop `code` as a file; `None` when there is no such drop.
pub async fn export(pg: &PgPool, code: &str) -> Result<Option<DropSheet>, EngineError> {
    let Some((name, schedule)) = crate::schedule::named_drop(pg, code).await? else {
        return Ok(None);
    };
    let rows: Vec<Current> = sqlx::query_as(
        "SELECT s.sku, s.product, s.variant, s.title,
                s.stock_declared AS stock,
                s.per_buyer_limit, s.low_stock_threshold, s.on_hand, s.sold_recorded
           FROM drop_skus d JOIN skus s ON s.sku = d.sku
          WHERE d.drop_code = $1 ORDER BY d.position, s.sku",
    )
    .bind(code)
    .fetch_all(pg)
    .await?;
    Ok(Some(DropSheet {
        code: code.to_owned(),
        name,
        starts_at: shown(schedule.starts_at),
        ends_at: shown(schedule.ends_at),
        skus: rows
            .into_iter()
            .map(|r| SheetSku {
                sku: r.sku,
                product: r.product,
                variant: r.variant,
                title: Some(r.title),
                stock: r.stock,
                per_buyer_limit: r.per_buyer_limit,
                low_stock_threshold: Some(r.low_stock_threshold),
            })
            .collect(),
    }))
}
