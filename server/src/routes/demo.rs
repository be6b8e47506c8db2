//! The demo shop: `GET /demo/shop`, a plain shop page that embeds the stock
//! badges the way any merchant would, with one script tag; and, when the server
//! runs the demo (`--demo`), a shopper's whole path on it: hold a unit, watch
//! the hold count down, pay or release it. The buttons call this small demo
//! backend (`/demo/shop/hold`, `/pay`, `/release`), which runs the same engine
//! operations the checkout API runs, as a shop's own backend would with its
//! token; the dashboard shows the sale as it happens. Without `--demo` those
//! three answer 404: a public page must never move real stock. With it, only
//! the demo drop's SKUs, one shopper per client address (so per-buyer limits
//! hold), and a few purchases per address per minute.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use holdfast_app::server::guard::{ClientIp, same_origin};
use holdfast_domain::{ConfirmOutcome, ReleaseOutcome, ReserveOutcome, ReserveRequest};
use holdfast_engine::{Backends, catalog, checkout};
use serde::Deserialize;

use holdfast_engine::ratelimit::{Limit, RateLimiter};

/// How long a demo hold lasts: long enough to pay, short enough to watch one
/// expire.
pub const DEMO_HOLD: Duration = Duration::from_secs(120);

/// Purchases one client address may make per minute in the demo shop.
pub const PURCHASES_PER_MINUTE: f64 = 6.0;

/// Largest body a demo call accepts (an id or a SKU code).
const MAX_BODY: usize = 1_024;

/// The demo shop's state: whether it may sell, and its per-address pace.
#[derive(Clone)]
pub struct DemoShop {
    /// PostgreSQL and Redis.
    pub backends: Backends,
    /// Whether the buy path is on (the server runs the demo).
    pub selling: bool,
    /// Whether the site is served over HTTPS (the `Origin` must say so).
    pub secure: bool,
    /// Demo calls per client address.
    pub per_address: Arc<RateLimiter>,
    /// Purchases per client address.
    pub purchases: Arc<RateLimiter>,
    /// The demo drop's SKUs, read once: nothing else may be sold here.
    pub skus: Arc<tokio::sync::OnceCell<std::collections::HashSet<String>>>,
}

impl DemoShop {
    /// The shop over `backends`; it sells only when `selling`, to pages of
    /// this site (served over HTTPS when `secure`).
    pub fn new(backends: Backends, selling: bool, secure: bool) -> Self {
        Self {
            backends,
            selling,
            secure,
            per_address: Arc::new(RateLimiter::new(Limit::per_second(5))),
            purchases: Arc::new(RateLimiter::new(Limit {
                per_sec: PURCHASES_PER_MINUTE / 60.0,
                burst: PURCHASES_PER_MINUTE,
            })),
            skus: Arc::default(),
        }
    }
}

/// The demo shop routes.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    DemoShop: FromRef<S>,
{
    Router::new()
        .route("/demo/shop", get(shop))
        .route("/demo/shop/hold", post(hold))
        .route("/demo/shop/pay", post(pay))
        .route("/demo/shop/release", post(release))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
}

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn shop(State(shop): State<DemoShop>) -> Html<String> {
    let skus = catalog::drop_skus(&shop.backends.pg, catalog::DEMO_DROP)
        .await
        .unwrap_or_default();
    let button = |sku: &str| {
        if shop.selling {
            format!(
                r#"<button type="button" class="hold" data-sku="{}">Add to cart</button>"#,
                esc(sku)
            )
        } else {
            String::new()
        }
    };
    let cards: String = skus
        .iter()
        .map(|s| {
            format!(
                r#"<article class="card"><h2>{}</h2><p class="sku">{}</p><holdfast-stock sku="{}"></holdfast-stock>{}</article>"#,
                esc(&s.title),
                esc(&s.sku),
                esc(&s.sku),
                button(&s.sku)
            )
        })
        .collect();
    let empty = if skus.is_empty() {
        "<p>No demo drop loaded: start Holdfast with --demo.</p>"
    } else {
        ""
    };
    let cart = if shop.selling {
        r#"<aside id="cart" aria-live="polite"><h2>Cart</h2><p class="empty">Nothing held yet: add something to the cart.</p><ul></ul></aside>
<script src="/demo-shop.js" defer></script>"#
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
.card h2{{font-size:1.05rem;margin:0 0 .25rem}}.sku{{color:#5b6472;font-size:.85rem;margin:0 0 .75rem}}
.card button{{margin-top:.75rem}}#cart{{max-width:1100px;margin:0 auto 2rem;padding:1rem 1.5rem;background:#fff;border:1px solid #e4e6ea;border-radius:10px}}
#cart li{{margin:.5rem 0}}#cart .note{{color:#5b6472}}</style>
</head><body><header><strong>Demo shop</strong> · live stock from Holdfast</header>
<main>{cards}{empty}</main>{cart}
<script src="/widget.js" async></script></body></html>"#
    ))
}

/// A call to the demo backend (anything else the page sends is ignored: the
/// shopper is the client address, which the caller cannot choose).
#[derive(Debug, Deserialize)]
struct HoldBody {
    sku: String,
}

/// A call about one reservation.
#[derive(Debug, Deserialize)]
struct ReservationBody {
    reservation_id: String,
}

/// The refusal, unless the demo sells, the call comes from this site's own
/// page (`Origin`), and the address is within its pace.
fn refusal(shop: &DemoShop, headers: &HeaderMap, client: Option<&ClientIp>) -> Option<Response> {
    refusal_within(shop, headers, client, &shop.per_address)
}

/// [`refusal`], pacing the address with `limiter`.
fn refusal_within(
    shop: &DemoShop,
    headers: &HeaderMap,
    client: Option<&ClientIp>,
    limiter: &RateLimiter,
) -> Option<Response> {
    if !shop.selling {
        return Some(StatusCode::NOT_FOUND.into_response());
    }
    if !same_origin(headers, shop.secure) {
        return Some((StatusCode::FORBIDDEN, "cross-site call refused").into_response());
    }
    let who = client.map_or_else(String::new, |ClientIp(ip)| ip.to_string());
    limiter.check(&who).err().map(|secs| {
        (
            StatusCode::TOO_MANY_REQUESTS,
            [(axum::http::header::RETRY_AFTER, secs.to_string())],
            "slow down",
        )
            .into_response()
    })
}

fn engine_failed(e: holdfast_engine::EngineError) -> Response {
    tracing::warn!(error = %e, "demo shop: the engine call failed");
    (StatusCode::SERVICE_UNAVAILABLE, "try again shortly").into_response()
}

/// `POST /demo/shop/hold`: holds one unit of a demo SKU for [`DEMO_HOLD`],
/// for the shopper at the client's address.
async fn hold(
    State(shop): State<DemoShop>,
    client: Option<Extension<ClientIp>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let client = client.as_deref();
    if let Some(refused) = refusal(&shop, &headers, client) {
        return refused;
    }
    let Ok(body) = serde_json::from_slice::<HoldBody>(&body) else {
        return (StatusCode::BAD_REQUEST, "send {\"sku\": \"…\"}").into_response();
    };
    let skus = match shop
        .skus
        .get_or_try_init(|| async {
            catalog::drop_skus(&shop.backends.pg, catalog::DEMO_DROP)
                .await
                .map(|list| list.into_iter().map(|s| s.sku).collect())
        })
        .await
    {
        Ok(skus) => skus,
        Err(e) => return engine_failed(e),
    };
    if !skus.contains(&body.sku) {
        return (
            StatusCode::NOT_FOUND,
            "the demo shop sells only the demo drop",
        )
            .into_response();
    }
    let shopper = client.map_or_else(|| "unknown".to_owned(), |ClientIp(ip)| ip.to_string());
    let request = ReserveRequest {
        buyer: Some(format!("demo-{shopper}")),
        ttl_ms: Some(DEMO_HOLD.as_millis() as u64),
        ..ReserveRequest::single(
            format!("demo-{}", uuid::Uuid::new_v4().simple()),
            body.sku,
            1,
        )
    };
    match shop.backends.engine.reserve(&request).await {
        Ok(outcome) => {
            let status = match outcome {
                ReserveOutcome::Reserved { .. } => StatusCode::CREATED,
                ReserveOutcome::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
                ReserveOutcome::NotWarmed { .. } => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::CONFLICT,
            };
            (status, Json(outcome)).into_response()
        }
        Err(e) => engine_failed(e),
    }
}

/// How a demo hold ends.
#[derive(Debug, Clone, Copy)]
enum End {
    /// The payment went through: confirm.
    Pay,
    /// The shopper gave it back.
    Release,
}

/// `POST /demo/shop/pay`: confirms a demo hold (the payment went through).
async fn pay(
    State(shop): State<DemoShop>,
    client: Option<Extension<ClientIp>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    end_hold(End::Pay, &shop, client.as_deref(), &headers, &body).await
}

/// `POST /demo/shop/release`: gives a demo hold back.
async fn release(
    State(shop): State<DemoShop>,
    client: Option<Extension<ClientIp>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    end_hold(End::Release, &shop, client.as_deref(), &headers, &body).await
}

/// Ends a demo hold (never one the checkout API made: 404). A purchase is
/// also paced per address ([`PURCHASES_PER_MINUTE`]): a sale here is for
/// good, so one address cannot buy the demo drop out in seconds.
async fn end_hold(
    end: End,
    shop: &DemoShop,
    client: Option<&ClientIp>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let limiter = match end {
        End::Pay => &shop.purchases,
        End::Release => &shop.per_address,
    };
    if let Some(refused) = refusal_within(shop, headers, client, limiter) {
        return refused;
    }
    let Ok(body) = serde_json::from_slice::<ReservationBody>(body) else {
        return (StatusCode::BAD_REQUEST, "send {\"reservation_id\": \"…\"}").into_response();
    };
    let id = body.reservation_id.as_str();
    if !id.starts_with("demo-") {
        return StatusCode::NOT_FOUND.into_response();
    }
    let answer = match end {
        End::Pay => checkout::confirm_payment(&shop.backends, id, None)
            .await
            .map(|(o, _)| {
                let ok = matches!(
                    o,
                    ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed
                );
                (
                    if ok {
                        StatusCode::OK
                    } else {
                        StatusCode::CONFLICT
                    },
                    Json(o).into_response(),
                )
            }),
        End::Release => shop.backends.engine.release(id).await.map(|o| {
            let known = !matches!(o, ReleaseOutcome::Unknown);
            (
                if known {
                    StatusCode::OK
                } else {
                    StatusCode::NOT_FOUND
                },
                Json(o).into_response(),
            )
        }),
    };
    match answer {
        Ok((status, mut response)) => {
            *response.status_mut() = status;
            response
        }
        Err(e) => engine_failed(e),
    }
}
