//! An SVG plot of a rehearsal: attempts and decisions per second, and reserve
//! latency (p50, p99) per second, over the simulated drop. Hand-written SVG, so
//! the benchmark suite needs no plotting tool.

use std::fmt::Write;

use super::Report;

const W: f64 = 900.0;
const PANEL: f64 = 220.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 50.0;
const GAP: f64 = 60.0;

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|m| *m >= v)
        .unwrap_or(10.0 * p)
}

fn line(points: &[(f64, f64)], color: &str, out: &mut String) {
    let pts: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    let _ = write!(
        out,
        r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
        pts.join(" ")
    );
}

fn panel(
    out: &mut String,
    y0: f64,
    title: &str,
    unit: &str,
    series: &[(&str, &str, Vec<f64>)],
    seconds: usize,
) {
    let max = nice_max(
        series
            .iter()
            .flat_map(|s| s.2.iter().copied())
            .fold(0.0, f64::max),
    );
    let plot_w = W - LEFT - RIGHT;
    let x = |i: usize| LEFT + plot_w * i as f64 / seconds.max(1) as f64;
    let y = |v: f64| y0 + PANEL - PANEL * (v / max);
    let _ = write!(
        out,
        r#"<text x="{LEFT}" y="{}" font-size="14" font-weight="600">{title}</text>"#,
        y0 - 10.0
    );
    for k in 0..=4 {
        let v = max * f64::from(k) / 4.0;
        let yy = y(v);
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#dde1e7\"/><text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{} {unit}</text>",
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            if max >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        );
    }
    let step = (seconds / 10).max(1);
    for i in (0..=seconds).step_by(step) {
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{i}s</text>"#,
            x(i),
            y0 + PANEL + 16.0
        );
    }
    for (n, (name, color, values)) in series.iter().enumerate() {
        let pts: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (x(i) + plot_w / seconds.max(1) as f64 / 2.0, y(*v)))
            .collect();
        line(&pts, color, out);
        let _ = write!(
            out,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="3" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="12">{name}</text>"#,
            W - RIGHT - 260.0 + n as f64 * 130.0,
            y0 - 16.0,
            W - RIGHT - 244.0 + n as f64 * 130.0,
            y0 - 11.0
        );
    }
}

/// The plot of `r` as an SVG document.
pub fn svg(r: &Report) -> String {
    let t = &r.timeline;
    let seconds = t.len().max(1);
    let height = TOP + 2.0 * PANEL + GAP + 60.0;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"#
    );
    let _ = write!(
        out,
        r#"<text x="{LEFT}" y="24" font-size="16" font-weight="700">Drop rehearsal: {} shoppers, {} units, {} sold; p99 {:.1} ms</text>"#,
        r.shoppers, r.units, r.sold_units, r.p99_ms
    );
    panel(
        &mut out,
        TOP + 20.0,
        "Throughput",
        "/s",
        &[
            (
                "attempts/s",
                "#0b6e4f",
                t.iter().map(|s| s.attempts as f64).collect(),
            ),
            (
                "decided/s",
                "#a15c00",
                t.iter().map(|s| s.decided as f64).collect(),
            ),
        ],
        seconds,
    );
    panel(
        &mut out,
        TOP + 20.0 + PANEL + GAP,
        "Reserve latency (from scheduled arrival)",
        "ms",
        &[
            ("p50", "#0b6e4f", t.iter().map(|s| s.p50_ms).collect()),
            ("p99", "#b42318", t.iter().map(|s| s.p99_ms).collect()),
        ],
        seconds,
    );
    out.push_str("</svg>\n");
    out
}
