//! A drop's report as a page of its own (`/report?drop=code`): printable, with
//! its CSV to download. Any signed-in user may read it.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api::drops::load_drop_report;
use crate::components::error_text;
use holdfast_domain::report::{DropReport, TimelinePoint};

/// `text` as a `data:` URL of `mime`, for a download link.
fn data_url(mime: &str, text: &str) -> String {
    let mut url = format!("data:{mime};charset=utf-8,");
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            url.push(b as char);
        } else {
            url.push_str(&format!("%{b:02X}"));
        }
    }
    url
}

/// The report page.
#[component]
pub fn ReportPage() -> impl IntoView {
    let query = use_query_map();
    let report = Resource::new(
        move || query.with(|q| q.get("drop").unwrap_or_default()),
        load_drop_report,
    );
    view! {
        <section class="panel report-page">
            <Suspense fallback=|| view! { <p class="muted">"Loading the report…"</p> }>
                {move || Suspend::new(async move {
                    match report.await {
                        Ok(report) => view! {
                            <h1>{format!("Report: {}", report.name)}</h1>
                            <ReportView report/>
                            <button type="button" class="no-print" onclick="window.print()">"Print"</button>
                        }.into_any(),
                        Err(e) => view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any(),
                    }
                })}
            </Suspense>
        </section>
    }
}

/// A drop's report: its window, a table per SKU, and its CSV to download.
#[component]
pub fn ReportView(
    /// The report.
    report: DropReport,
) -> impl IntoView {
    let csv = report.to_csv();
    let download = data_url("text/csv", &csv);
    let file = format!("{}-report.csv", report.code);
    let page = format!("/report?drop={}", report.code);
    view! {
        <p class="muted">{format!(
            "{} ({}): starts {}, ends {}. From PostgreSQL: holds appear once written behind.",
            report.name, report.code,
            report.starts_at.clone().unwrap_or_else(|| "at once".into()),
            report.ends_at.clone().unwrap_or_else(|| "never".into())
        )}</p>
        <div class="table-wrap"><table class="report">
            <thead><tr>
                <th scope="col">"SKU"</th><th scope="col">"Stock"</th><th scope="col">"Sold"</th>
                <th scope="col">"Holds"</th><th scope="col">"Confirmed"</th><th scope="col">"Released"</th>
                <th scope="col">"By support"</th><th scope="col">"Expired"</th><th scope="col">"Open"</th>
                <th scope="col">"Late payments"</th><th scope="col">"Shortfalls"</th>
                <th scope="col">"Peak holds/s"</th><th scope="col">"Peak attempts/s"</th>
                <th scope="col">"Sold out after"</th>
            </tr></thead>
            <tbody>{report.skus.into_iter().map(|s| { let sku = s.sku.clone(); view! {
                <tr data-sku=sku>
                    <td class="sku">{s.sku}</td><td>{s.stock}</td><td data-field="units_sold">{s.units_sold}</td>
                    <td>{s.holds}</td><td>{s.confirmed}</td><td>{s.released_by_shoppers}</td>
                    <td>{s.released_by_support}</td><td>{s.expired}</td><td>{s.open}</td>
                    <td>{s.late_payments}</td><td>{s.shortfalls}</td><td>{s.peak_holds_per_second}</td>
                    <td data-field="peak_attempts_per_second">{s.peak_attempts_per_second}</td>
                    <td>{s.sold_out_after_secs.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} s"))}</td>
                </tr>
            }}).collect_view()}</tbody>
        </table></div>
        <TimelineChart points=report.timeline.clone() bucket_secs=report.timeline_bucket_secs/>
        <p class="controls no-print">
            <a href=download download=file>"Download CSV"</a>
            <a href=page>"Printable page"</a>
        </p>
    }
}

/// The report's timeline as bars: holds taken (light) and units sold (dark)
/// per bucket, over the drop.
#[component]
fn TimelineChart(
    /// The buckets, oldest first.
    points: Vec<TimelinePoint>,
    /// A bucket's width in seconds.
    bucket_secs: i64,
) -> impl IntoView {
    let (width, height) = (900.0_f64, 160.0_f64);
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return view! { <p class="muted">"No holds yet: the timeline starts with the first."</p> }
            .into_any();
    };
    let bucket_ms = (bucket_secs.max(1) * 1_000) as f64;
    let span = (last.at_ms - first.at_ms) as f64 + bucket_ms;
    let top = points
        .iter()
        .map(|p| p.holds.max(p.units_sold))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let bar = (width * bucket_ms / span).max(1.0);
    let x = |at: i64| (at - first.at_ms) as f64 / span * width;
    let y = |n: i64| height - n as f64 / top * height;
    let unit = if bucket_secs == 1 { "second" } else { "minute" };
    let label = format!("Holds taken and units sold per {unit} over the drop (highest: {top})");
    view! {
        <figure class="timeline">
            <svg role="img" aria-label=label.clone() width=width height=height viewBox=format!("0 0 {width} {height}")>
                {points.iter().map(|p| view! {
                    <rect class="holds" x=x(p.at_ms) y=y(p.holds) width=bar height=height - y(p.holds)/>
                    <rect class="sold" x=x(p.at_ms) y=y(p.units_sold) width=bar height=height - y(p.units_sold)/>
                }).collect_view()}
            </svg>
            <figcaption class="muted">{label}</figcaption>
        </figure>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    #[test]
    fn data_urls_escape_what_a_url_cannot_hold() {
        assert_eq!(
            super::data_url("text/csv", "a,b\n1 é"),
            "data:text/csv;charset=utf-8,a%2Cb%0A1%20%C3%A9"
        );
    }
}
