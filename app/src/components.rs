//! Small pieces the pages share: error text, numbers, the connection badge,
//! charts, progress bars and the role gate.

use leptos::prelude::*;

use crate::dto::live::Sample;
use crate::dto::ops::{JobState, JobView};
use crate::dto::people::Me;
use crate::live::{Conn, Live};
use holdfast_domain::{Permission, Role};

/// The message of a server-function error as the server wrote it; a network
/// failure reads as one.
pub fn error_text(e: &ServerFnError) -> String {
    match e {
        ServerFnError::ServerError(m) => m.clone(),
        ServerFnError::Request(_) | ServerFnError::Response(_) => {
            "The server could not be reached. Check the connection and try again.".into()
        }
        other => other.to_string(),
    }
}

pub use holdfast_domain::text::thousands;

/// Milliseconds as `2h 05m`, `1m 05s` or `12s`.
pub fn duration(ms: i64) -> String {
    let s = (ms.max(0) + 999) / 1_000;
    if s >= 3_600 {
        format!("{}h {:02}m", s / 3_600, s % 3_600 / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// An RFC 3339 time shortened to `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn short_time(rfc3339: &str) -> String {
    rfc3339.get(..19).unwrap_or(rfc3339).replace('T', " ")
}

/// The signed-in user, provided by [`crate::Authed`].
pub fn me() -> Me {
    use_context::<Me>().unwrap_or(Me {
        username: String::new(),
        role: Role::Viewer,
        must_change_password: false,
    })
}

/// Where a drop is in its schedule, ticking: "Starts in 1h 02m", "Open for
/// 3m 12s", "Ended 5m 00s ago" (by this browser's clock; Redis decides the
/// real instant).
#[component]
pub fn DropClock(
    /// When the drop opens, Unix ms.
    starts_at_ms: Option<i64>,
    /// When it closes, Unix ms.
    ends_at_ms: Option<i64>,
) -> impl IntoView {
    let live = expect_context::<Live>();
    let text = move || {
        let now = live.now_ms.get();
        match (starts_at_ms, ends_at_ms) {
            (_, Some(end)) if now >= end => format!("Ended {} ago", duration(now - end)),
            (Some(start), _) if now < start => format!("Starts in {}", duration(start - now)),
            (Some(start), _) => format!("Open for {}", duration(now - start)),
            (None, _) => "Open (no start set)".to_owned(),
        }
    };
    view! { <p class="drop-clock" data-clock="drop">{text}</p> }
}

/// A success or error line for the last result of an action.
#[component]
pub fn Outcome(
    /// The action's last result.
    value: Signal<Option<Result<String, ServerFnError>>>,
) -> impl IntoView {
    move || match value.get() {
        Some(Ok(m)) => view! { <p class="notice ok" role="status">{m}</p> }.into_any(),
        Some(Err(e)) => {
            view! { <p class="notice error" role="alert">{error_text(&e)}</p> }.into_any()
        }
        None => ().into_any(),
    }
}

/// The live connection's state.
#[component]
pub fn ConnBadge() -> impl IntoView {
    let live = expect_context::<Live>();
    let text = move || match live.conn.get() {
        Conn::Connecting => "connecting…".to_owned(),
        Conn::Live => "live".to_owned(),
        Conn::Reconnecting(n) => format!("reconnecting (attempt {n})…"),
    };
    let class = move || match live.conn.get() {
        Conn::Live => "conn live",
        Conn::Connecting => "conn connecting",
        Conn::Reconnecting(_) => "conn lost",
    };
    view! { <span class=class role="status" aria-live="polite" data-conn=text>{text}</span> }
}

/// An SVG line of `available` over the last `window_ms` (or since the first
/// sample, when that is shorter, but at least a minute).
#[component]
pub fn Sparkline(
    /// Samples, oldest first.
    samples: Signal<Vec<Sample>>,
    /// Width in pixels.
    #[prop(default = 160)]
    width: u32,
    /// Height in pixels.
    #[prop(default = 32)]
    height: u32,
    /// How far back the chart reaches.
    #[prop(default = 10 * 60 * 1_000)]
    window_ms: i64,
    /// What the chart shows, for screen readers.
    #[prop(into)]
    label: String,
) -> impl IntoView {
    let live = expect_context::<Live>();
    let points = move || {
        let now = live.now_ms.get();
        let data = samples.get();
        // Shows what there is: from one minute up to the whole window.
        let window_ms = data
            .first()
            .map_or(window_ms, |f| (now - f.at_ms).clamp(60_000, window_ms));
        let max = data.iter().map(|s| s.available).max().unwrap_or(0).max(1) as f64;
        let (w, h) = (f64::from(width), f64::from(height) - 2.0);
        let x = |t: i64| ((t - (now - window_ms)) as f64 / window_ms as f64 * w).clamp(0.0, w);
        let y = |v: i64| 1.0 + h - (v as f64 / max * h);
        let mut out = String::new();
        let mut prev: Option<i64> = None;
        for s in &data {
            // Steps, not slopes: a counter jumps, it does not glide.
            if let Some(p) = prev {
                out.push_str(&format!("{:.1},{:.1} ", x(s.at_ms), y(p)));
            }
            out.push_str(&format!("{:.1},{:.1} ", x(s.at_ms), y(s.available)));
            prev = Some(s.available);
        }
        if let Some(p) = prev {
            out.push_str(&format!("{w:.1},{:.1}", y(p)));
        }
        out
    };
    view! {
        <svg class="spark" role="img" aria-label=label width=width height=height viewBox=format!("0 0 {width} {height}")>
            <polyline points=points fill="none" stroke="currentColor" stroke-width="1.5"/>
        </svg>
    }
}

/// A job's progress bar and state line.
#[component]
pub fn JobBar(
    /// The job as last reported.
    job: JobView,
) -> impl IntoView {
    let pct = job.percent();
    let kind = match job.kind {
        crate::dto::ops::JobKind::Warmup => "Warm-up",
        crate::dto::ops::JobKind::Reconcile => "Reconciliation",
    };
    let (state, class) = match &job.state {
        JobState::Running => (format!("{} of {} SKUs", job.done, job.total), "job running"),
        JobState::Finished { summary } => (summary.clone(), "job finished"),
        JobState::Failed { error } => (error.clone(), "job failed"),
    };
    view! {
        <div class=class data-job=job.id>
            <div class="job-head">
                <strong>{format!("{kind} #{}", job.id)}</strong>
                <span class="muted">{format!(" by {}", job.started_by)}</span>
                <span class="pct">{format!("{pct}%")}</span>
            </div>
            <div class="bar" role="progressbar" aria-valuemin="0" aria-valuemax="100" aria-valuenow=pct aria-label=format!("{kind} progress")>
                <div class="fill" style=format!("width: {pct}%")></div>
            </div>
            <p class="job-state">{state}</p>
        </div>
    }
}

/// Renders `children` only for users whose role may do `need`.
#[component]
pub fn IfAllowed(
    /// What the children let a user do.
    need: Permission,
    /// What only those users see.
    children: ChildrenFn,
) -> impl IntoView {
    let allowed = me().may(need);
    move || allowed.then(|| children())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_durations_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
        assert_eq!(duration(0), "0s");
        assert_eq!(
            duration(1),
            "1s",
            "a countdown rounds up, never shows 0 early"
        );
        assert_eq!(duration(65_000), "1m 05s");
        assert_eq!(duration(7_500_000), "2h 05m");
        assert_eq!(
            short_time("2026-11-29T21:05:03.123+00:00"),
            "2026-11-29 21:05:03"
        );
    }
}
