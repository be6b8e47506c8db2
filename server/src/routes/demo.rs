//! `GET /demo/shop`: a plain shop page that embeds the stock badges the way any
//! merchant would, with one script tag: for trying the widget and for the
//! end-to-end tests.

use axum::Router;
use axum::extract::State;
use axum::response::Html;
use axum::routing::get;
use holdfast_engine::catalog;

use axum::extract::FromRef;
use holdfast_engine::Backends;

/// The demo shop route.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Backends: FromRef<S>,
{
    Router::new().route("/demo/shop", get(shop))
}

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn shop(State(backends): State<Backends>) -> Html<String> {
    let skus = catalog::drop_skus(&backends.pg, catalog::DEMO_DROP)
        .await
        .unwrap_or_default();
    let cards: String = skus
        .iter()
        .map(|s| {
            format!(
                r#"<article class="card"><h2>{}</h2><p class="sku">{}</p><holdfast-stock sku="{}"></holdfast-stock></article>"#,
                esc(&s.title),
                esc(&s.sku),
                esc(&s.sku)
            )
        })
        .collect();
    let empty = if skus.is_empty() {
        "<p>No demo drop loaded: start Holdfast with --demo.</p>"
    } else {
        ""
    };
    Html(format!(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>Demo shop · Holdfast badges</title>
<style>body{{font-family:system-ui,sans-serif;margin:0;background:#fafafa;color:#16181d}}
header{{padding:1rem 1.5rem;background:#fff;border-bottom:1px solid #e4e6ea}}
main{{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:1rem;padding:1.5rem;max-width:1100px;margin:auto}}
.card{{background:#fff;border:1px solid #e4e6ea;border-radius:10px;padding:1rem}}
.card h2{{font-size:1.05rem;margin:0 0 .25rem}}.sku{{color:#5b6472;font-size:.85rem;margin:0 0 .75rem}}</style>
</head><body><header><strong>Demo shop</strong> · live stock from Holdfast</header>
<main>{cards}{empty}</main>
<script src="/widget.js" async></script></body></html>"#
    ))
}
