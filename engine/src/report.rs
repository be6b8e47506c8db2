//! A drop's report, from PostgreSQL alone (holds and how they ended, orders,
//! remediations, the audit log: all written behind from the event streams), so
//! it reads the same on any server and after Redis is gone.
//!
//! The drop's holds are those of its SKUs taken in its window (from `starts_at`
//! to `ends_at`, either open when not set). Units sold are the units of those
//! holds that were confirmed. "Sold out after" is the time from the start (or
//! the first hold) to the hold that took the last unit sold, once units sold
//! reach the SKU's stock.

use chrono::{DateTime, SecondsFormat, Utc};
use holdfast_domain::report::{DropReport, SkuReport, TimelinePoint};
use sqlx::PgPool;

use crate::error::EngineError;

/// The drop's SKUs (`d`) and their holds taken in its window (`h`, with
/// `by_support` for those support released), for `WITH`: `$1` the drop's code,
/// `$2` and `$3` its start and end (either may be `NULL`).
const HOLDS_OF_DROP: &str = "
    d AS (SELECT sku, position FROM drop_skus WHERE drop_code = $1),
    h AS (SELECT h.*, (a.subject IS NOT NULL) AS by_support
            FROM holds h JOIN d ON d.sku = h.sku
            LEFT JOIN (SELECT DISTINCT subject FROM audit_log WHERE action = 'release_hold') a
                   ON a.subject = h.reservation_id
           WHERE ($2::timestamptz IS NULL OR h.created_at >= $2)
             AND ($3::timestamptz IS NULL OR h.created_at < $3))";

#[derive(sqlx::FromRow)]
struct Row {
    sku: String,
    title: String,
    stock: i64,
    units_sold: i64,
    holds: i64,
    confirmed: i64,
    released_by_shoppers: i64,
    released_by_support: i64,
    expired: i64,
    open: i64,
    late_payments: i64,
    shortfalls: i64,
    peak_holds_per_second: i64,
    peak_attempts_per_second: i64,
    sold_out_after_secs: Option<f64>,
}

/// Drop `code`'s report; `None` when there is no such drop.
pub async fn drop_report(pg: &PgPool, code: &str) -> Result<Option<DropReport>, EngineError> {
    let Some((name, schedule)) = crate::schedule::named_drop(pg, code).await? else {
        return Ok(None);
    };
    let (starts_at, ends_at) = (schedule.starts_at, schedule.ends_at);
    let rows: Vec<Row> = sqlx::query_as(
        &format!("WITH {HOLDS_OF_DROP},
         agg AS (SELECT sku,
                        count(*) AS holds,
                        count(*) FILTER (WHERE end_state = 'confirmed') AS confirmed,
                        count(*) FILTER (WHERE end_state = 'released' AND NOT by_support) AS released_by_shoppers,
                        count(*) FILTER (WHERE end_state = 'released' AND by_support) AS released_by_support,
                        count(*) FILTER (WHERE end_state = 'expired') AS expired,
                        count(*) FILTER (WHERE ended_at IS NULL) AS open,
                        coalesce(sum(qty) FILTER (WHERE end_state = 'confirmed'), 0)::bigint AS units_sold,
                        coalesce(sum(oversold_units), 0)::bigint AS shortfalls,
                        min(created_at) AS first_hold
                   FROM h GROUP BY sku),
         peak AS (SELECT sku, max(n) AS peak
                    FROM (SELECT sku, count(*) AS n FROM h
                           GROUP BY sku, date_trunc('second', created_at)) x
                   GROUP BY sku),
         tries AS (SELECT t.sku, max(t.n) AS peak
                     FROM attempts t JOIN d ON d.sku = t.sku
                    WHERE ($2::timestamptz IS NULL OR t.at >= date_trunc('second', $2))
                      AND ($3::timestamptz IS NULL OR t.at < $3)
                    GROUP BY t.sku),
         rem AS (SELECT h.sku, count(*) AS late
                   FROM h JOIN remediations r ON r.reservation_id = h.reservation_id
                  WHERE r.kind = 'late_payment'
                  GROUP BY h.sku),
         run AS (SELECT sku, created_at,
                        sum(qty) OVER (PARTITION BY sku ORDER BY created_at, reservation_id) AS sold
                   FROM h WHERE end_state = 'confirmed'),
         s AS (SELECT sku, title, stock_declared AS stock
                 FROM skus WHERE sku IN (SELECT sku FROM d)),
         out AS (SELECT r.sku, min(r.created_at) AS at
                   FROM run r JOIN s ON s.sku = r.sku
                  WHERE s.stock > 0 AND r.sold >= s.stock GROUP BY r.sku)
         SELECT s.sku, s.title, s.stock,
                coalesce(agg.units_sold, 0) AS units_sold,
                coalesce(agg.holds, 0) AS holds,
                coalesce(agg.confirmed, 0) AS confirmed,
                coalesce(agg.released_by_shoppers, 0) AS released_by_shoppers,
                coalesce(agg.released_by_support, 0) AS released_by_support,
                coalesce(agg.expired, 0) AS expired,
                coalesce(agg.open, 0) AS open,
                coalesce(rem.late, 0) AS late_payments,
                coalesce(agg.shortfalls, 0) AS shortfalls,
                coalesce(peak.peak, 0) AS peak_holds_per_second,
                coalesce(tries.peak, 0) AS peak_attempts_per_second,
                extract(epoch FROM out.at - coalesce($2, agg.first_hold))::float8 AS sold_out_after_secs
           FROM d JOIN s ON s.sku = d.sku
           LEFT JOIN agg ON agg.sku = d.sku
           LEFT JOIN peak ON peak.sku = d.sku
           LEFT JOIN tries ON tries.sku = d.sku
           LEFT JOIN rem ON rem.sku = d.sku
           LEFT JOIN out ON out.sku = d.sku
          ORDER BY d.position, d.sku"),
    )
    .bind(code)
    .bind(starts_at)
    .bind(ends_at)
    .fetch_all(pg)
    .await?;
    let span: Option<f64> = sqlx::query_scalar(&format!(
        "WITH {HOLDS_OF_DROP} SELECT extract(epoch FROM max(created_at) - min(created_at))::float8 FROM h"
    ))
    .bind(code)
    .bind(starts_at)
    .bind(ends_at)
    .fetch_one(pg)
    .await?;
    let bucket: i64 = if span.unwrap_or(0.0) <= 600.0 { 1 } else { 60 };
    let timeline: Vec<(i64, i64, i64)> = sqlx::query_as(&format!(
        "WITH {HOLDS_OF_DROP}
         SELECT (floor(extract(epoch FROM created_at) / $4) * $4 * 1000)::bigint AS at_ms,
                count(*) AS holds,
                coalesce(sum(qty) FILTER (WHERE end_state = 'confirmed'), 0)::bigint AS sold
           FROM h GROUP BY 1 ORDER BY 1"
    ))
    .bind(code)
    .bind(starts_at)
    .bind(ends_at)
    .bind(bucket)
    .fetch_all(pg)
    .await?;
    let shown = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true));
    Ok(Some(DropReport {
        code: code.to_owned(),
        name,
        starts_at: shown(starts_at),
        ends_at: shown(ends_at),
        skus: rows
            .into_iter()
            .map(|r| SkuReport {
                sku: r.sku,
                title: r.title,
                stock: r.stock,
                units_sold: r.units_sold,
                holds: r.holds,
                confirmed: r.confirmed,
                released_by_shoppers: r.released_by_shoppers,
                released_by_support: r.released_by_support,
                expired: r.expired,
                open: r.open,
                late_payments: r.late_payments,
                shortfalls: r.shortfalls,
                peak_holds_per_second: r.peak_holds_per_second,
                peak_attempts_per_second: r.peak_attempts_per_second,
                sold_out_after_secs: r.sold_out_after_secs,
            })
            .collect(),
        timeline: timeline
            .into_iter()
            .map(|(at_ms, holds, units_sold)| TimelinePoint {
                at_ms,
                holds,
                units_sold,
            })
            .collect(),
        timeline_bucket_secs: bucket,
    }))
}
