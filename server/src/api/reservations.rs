//! `/api/v1/reservations`: create (one SKU or a cart), read, confirm, release.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use holdfast_app::dto::api::{CreateReservation, ErrorBody, LineView, ReservationView};
use holdfast_domain::{ErrorCode, Scope};
use holdfast_engine::checkout;
use holdfast_engine::idempotency::{KeyUse, fingerprint};
use holdfast_engine::request_fingerprint;
use holdfast_engine::{
    ConfirmOutcome, Hold, HoldState, Line, ReleaseOutcome, ReserveOutcome, ReserveRequest,
};

use super::{ApiState, idempotent};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, JsonText, json_text};
use crate::http::rfc3339;

/// `hold` as the API shows it; `available_after` (each SKU's `available` right
/// after the hold was made) only on the answer that made it.
fn view(hold: &Hold, available_after: &[(String, i64)]) -> ReservationView {
    ReservationView {
        id: hold.reservation_id.clone(),
        state: hold.state.as_str().into(),
        expires_at: (hold.state == HoldState::Held)
            .then(|| rfc3339(hold.expires_at_ms))
            .flatten(),
        lines: hold
            .lines
            .iter()
            .map(|l| LineView {
                sku: l.sku.clone(),
                qty: l.qty,
                available_after: available_after
                    .iter()
                    .find(|(s, _)| *s == l.sku)
                    .map(|(_, a)| *a),
            })
            .collect(),
        buyer: hold.buyer.clone(),
    }
}

fn json(status: StatusCode, body: &impl serde::Serialize) -> (StatusCode, JsonText) {
    (status, json_text(body))
}

/// `POST /api/v1/reservations`: 201 held (a retry gets the same 201 and body), 409
/// sold out, 503 not warmed.
#[utoipa::path(
    post, path = "/api/v1/reservations", tag = "reservations",
    request_body = CreateReservation,
    params(("Idempotency-Key" = String, Header, description = "Names the reservation; a retry with the same key and request gets the first answer again (status and body), for 24 hours")),
    responses(
        (status = 201, description = "Held (or a retry of the request that held it: the same answer)", body = ReservationView),
        (status = 400, description = "No Idempotency-Key, or malformed JSON", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token lacks the scope", body = ErrorBody),
        (status = 409, description = "Sold out (with what is left), per-buyer limit, the drop not started yet (`not_started`, with `starts_at`) or ended (`ended`, with `ended_at`), or same key in progress", body = ErrorBody),
        (status = 413, description = "Body over 16 KiB"),
        (status = 422, description = "Invalid field; the key was used for another request; or `buyer_required`: a line's SKU has a per-buyer limit and no `buyer` was given", body = ErrorBody),
        (status = 429, description = "Rate limited", body = ErrorBody),
        (status = 503, description = "Counter not warmed (never a 409), or a backend unavailable", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn create(
    State(state): State<ApiState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = caller.require(Scope::Checkout) {
        return e.into_response();
    }
    let key = match idempotent::key(&headers) {
        Ok(Some(key)) => key,
        Ok(None) => {
            return ApiError::new(
                ErrorCode::IdempotencyKeyRequired,
                "send an Idempotency-Key header: it names the reservation, so a retry never holds stock twice",
            )
            .field("Idempotency-Key")
            .into_response();
        }
        Err(e) => return e.into_response(),
    };
    let rid = checkout::reservation_id(caller.0.id, &key);
    let request = match parse(&body, rid) {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    if !state.backends.engine.spans_shards(&request) {
        // One shard: the script's hold record is the key's record (one round trip).
        return idempotent::run_atomic(&state, reserve(&state, request, false)).await;
    }
    // A cart over several shards takes a script per shard: the key is claimed
    // first, so a second attempt cannot race the first between its parts. The
    // same request is what the script counts as one (lines and buyer).
    let same = request_fingerprint(&request);
    let fp = fingerprint("POST", "/api/v1/reservations", same.as_bytes());
    // Never answered from memory: the store keeps a cart's answer for its key,
    // and a memory answer would claim nothing in Redis.
    let work = |_| reserve(&state, request, true);
    idempotent::run(&state, caller.0.id, Some(key), fp, work).await
}

/// The reservation `body` asks for, named `rid`.
fn parse(body: &[u8], rid: String) -> Result<ReserveRequest, ApiError> {
    let req: CreateReservation = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            ErrorCode::BadRequest,
            format!("the body is not a valid reservation request: {e}"),
        )
    })?;
    let lines = match (req.sku, req.qty, req.lines) {
        (Some(sku), qty, None) => vec![Line {
            sku,
            qty: qty.unwrap_or(1),
        }],
        (None, None, Some(lines)) => lines
            .into_iter()
            .map(|l| Line {
                sku: l.sku,
                qty: l.qty,
            })
            .collect(),
        (None, Some(_), None) => return Err(ApiError::invalid("sku", "qty needs a sku")),
        (None, None, None) => return Err(ApiError::invalid("sku", "give sku and qty, or lines")),
        _ => {
            return Err(ApiError::invalid(
                "lines",
                "give either sku and qty, or lines, not both",
            ));
        }
    };
    Ok(ReserveRequest {
        reservation_id: rid,
        lines,
        buyer: req.buyer,
        ttl_ms: req.ttl_ms,
    })
}

/// Makes the reservation. `ask_redis`: the sold-out cache must not answer.
async fn reserve(
    state: &ApiState,
    request: ReserveRequest,
    ask_redis: bool,
) -> Result<(StatusCode, JsonText), ApiError> {
    let engine = &state.backends.engine;
    // Shed load after a sell-out: answer from memory while the SKU is known
    // empty, without the reserve script. The answer is kept in the id's claim
    // (one command), so a retry gets it again; an id this request already holds
    // or was refused under gets its own answer from Redis, whichever server
    // made it and however that answer was lost.
    let known_empty = request
        .lines
        .iter()
        .find(|l| !ask_redis && state.sold_out.is_sold_out(&l.sku));
    let from_memory = match known_empty {
        Some(line) => engine.refuse_from_memory(&request, &line.sku).await?,
        None => None,
    };
    let outcome = match from_memory {
        Some(outcome) => {
            state.sold_out.answered();
            outcome
        }
        None => engine.reserve(&request).await?,
    };
    // An attempt at stock, for the drop report's peak per second: a decision
    // was made about these SKUs (not an unknown SKU, a bad or reused key).
    if !matches!(
        outcome,
        ReserveOutcome::NotWarmed { .. }
            | ReserveOutcome::Invalid(_)
            | ReserveOutcome::Conflict { .. }
    ) {
        for line in &request.lines {
            engine.attempts().note(&line.sku);
        }
    }
    match outcome {
        // A retry answers what the first attempt did, from the hold's record.
        ReserveOutcome::Reserved {
            reservation_id,
            expires_at_ms,
            available_after,
        }
        | ReserveOutcome::AlreadyReserved {
            reservation_id,
            expires_at_ms,
            available_after,
            ..
        } => {
            let hold = Hold {
                reservation_id,
                state: HoldState::Held,
                lines: request.lines,
                buyer: request.buyer,
                expires_at_ms,
                created_at_ms: 0,
            };
            Ok(json(StatusCode::CREATED, &view(&hold, &available_after)))
        }
        ReserveOutcome::SoldOut {
            sku,
            available,
            replayed,
        } => {
            // An earlier refusal replayed says nothing about stock now.
            if available == 0 && !replayed {
                state.sold_out.mark(&sku);
            }
            Err(ApiError::sold_out(&sku, available))
        }
        ReserveOutcome::NotWarmed { sku } => Err(ApiError::not_warmed(&sku)),
        ReserveOutcome::NotStarted { sku, starts_at_ms } => {
            Err(ApiError::not_started(&sku, starts_at_ms))
        }
        ReserveOutcome::Ended { sku, ended_at_ms } => Err(ApiError::ended(&sku, ended_at_ms)),
        ReserveOutcome::Conflict { .. } => Err(ApiError::new(
            ErrorCode::IdempotencyKeyReused,
            "this reservation id was used for a different request; use a new Idempotency-Key",
        )
        .field("Idempotency-Key")),
        ReserveOutcome::LimitExceeded { sku, limit, already } => Err(ApiError::new(
            ErrorCode::BuyerLimitReached,
            format!("{sku} is limited to {limit} per buyer and this buyer already holds or bought {already}"),
        )
        .sku(sku)),
        ReserveOutcome::BuyerRequired { sku, limit } => Err(ApiError::new(
            ErrorCode::BuyerRequired,
            format!("{sku} is limited to {limit} per buyer: name the buyer (`buyer`) so the limit can be counted"),
        )
        .field("buyer")
        .sku(sku)),
        ReserveOutcome::Invalid(inv) => Err(ApiError::invalid(&inv.field, inv.message)),
    }
}

/// For confirm and release: the token's scope and ownership, and the optional
/// `Idempotency-Key` with the request's fingerprint.
fn action_guard(
    caller: &Caller,
    id: &str,
    action: &str,
    headers: &HeaderMap,
) -> Result<Option<KeyUse>, ApiError> {
    caller.require(Scope::Checkout)?;
    own(caller, id)?;
    Ok(idempotent::key(headers)?.map(|key| {
        let path = format!("/api/v1/reservations/{id}/{action}");
        KeyUse::new(caller.0.id, &key, &fingerprint("POST", &path, b""))
    }))
}

/// The reservation as the action left it (`shown`, read in the action's own
/// calls), or else as the system of record has it, answered with 200.
async fn shown_or_current(
    state: &ApiState,
    id: &str,
    shown: Option<Hold>,
) -> Result<(StatusCode, JsonText), ApiError> {
    if let Some(hold) = shown {
        return Ok(json(StatusCode::OK, &view(&hold, &[])));
    }
    let hold = checkout::find_reservation(&state.backends, id).await?;
    let hold = hold.ok_or_else(|| ApiError::not_found(format!("no reservation {id}")))?;
    Ok(json(StatusCode::OK, &view(&hold, &[])))
}

/// A token only sees the reservations it made.
fn own(caller: &Caller, id: &str) -> Result<(), ApiError> {
    if checkout::made_by(id, caller.0.id) {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("no reservation {id}")))
    }
}

/// `GET /api/v1/reservations/{id}`.
#[utoipa::path(
    get, path = "/api/v1/reservations/{id}", tag = "reservations",
    params(("id" = String, Path, description = "The reservation id")),
    responses(
        (status = 200, description = "The reservation", body = ReservationView),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token lacks the scope", body = ErrorBody),
        (status = 404, description = "No such reservation for this token", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn get(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<ReservationView>, ApiError> {
    if !caller.0.allows(Scope::Read) {
        caller.require(Scope::Checkout)?;
    }
    own(&caller, &id)?;
    let hold = checkout::find_reservation(&state.backends, &id).await?;
    hold.map(|h| Json(view(&h, &[])))
        .ok_or_else(|| ApiError::not_found(format!("no reservation {id}")))
}

/// `POST /api/v1/reservations/{id}/confirm`: 200 confirmed, 410 when the hold had
/// ended (a late payment: a remediation record is written), 404 unknown.
#[utoipa::path(
    post, path = "/api/v1/reservations/{id}/confirm", tag = "reservations",
    params(
        ("id" = String, Path, description = "The reservation id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional; kept in the hold: the same key again gets the same answer, the same key on this reservation's release is refused (422)"),
    ),
    responses(
        (status = 200, description = "Confirmed (now or before)", body = ReservationView),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token lacks the scope", body = ErrorBody),
        (status = 404, description = "No such reservation for this token", body = ErrorBody),
        (status = 410, description = "The hold had ended, or Redis lost it (`hold_expired`, `reservation_lost`): no stock taken, remediation recorded", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for this reservation's release (`idempotency_key_reused`): nothing done", body = ErrorBody),
        (status = 503, description = "A backend is unavailable, or the payment waits for Redis replicas (`unavailable`, with Retry-After)", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn confirm(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let key = match action_guard(&caller, &id, "confirm", &headers) {
        Ok(key) => key,
        Err(e) => return e.into_response(),
    };
    let work = async {
        match checkout::confirm_payment(&state.backends, &id, key.as_ref()).await? {
            (ConfirmOutcome::Confirmed | ConfirmOutcome::AlreadyConfirmed, shown) => {
                shown_or_current(&state, &id, shown).await
            }
            (ConfirmOutcome::Expired { state: ended }, _) => Err(ApiError::new(
                ErrorCode::HoldExpired,
                format!(
                    "the hold was {} before payment was confirmed; no stock was taken. \
                         A remediation record was written: refund or re-reserve",
                    ended.as_str()
                ),
            )),
            (ConfirmOutcome::Unknown, _) => {
                Err(ApiError::not_found(format!("no reservation {id}")))
            }
            (ConfirmOutcome::Lost, _) => Err(ApiError::new(
                ErrorCode::ReservationLost,
                format!(
                    "reservation {id} was lost by the stock store before payment was confirmed; \
                     no stock was taken. A remediation record was written: refund or re-reserve"
                ),
            )),
        }
    };
    idempotent::run_atomic(&state, work).await
}

/// `POST /api/v1/reservations/{id}/release`: 200 (released now or already ended), 404 unknown.
#[utoipa::path(
    post, path = "/api/v1/reservations/{id}/release", tag = "reservations",
    params(
        ("id" = String, Path, description = "The reservation id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Optional; kept in the hold: the same key again gets the same answer, the same key on this reservation's confirm is refused (422)"),
    ),
    responses(
        (status = 200, description = "Released (now or before)", body = ReservationView),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "The token lacks the scope", body = ErrorBody),
        (status = 404, description = "No such reservation for this token", body = ErrorBody),
        (status = 409, description = "A cart's confirmation is being decided (`busy`, with Retry-After)", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used for this reservation's confirm (`idempotency_key_reused`): nothing done", body = ErrorBody),
    ),
    security(("token" = []))
)]
pub async fn release(
    State(state): State<ApiState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let key = match action_guard(&caller, &id, "release", &headers) {
        Ok(key) => key,
        Err(e) => return e.into_response(),
    };
    let work = async {
        let engine = &state.backends.engine;
        match engine.release_showing(&id, key.as_ref()).await? {
            (ReleaseOutcome::Released | ReleaseOutcome::AlreadyGone { .. }, shown) => {
                shown_or_current(&state, &id, shown).await
            }
            (ReleaseOutcome::Unknown, _) => {
                Err(ApiError::not_found(format!("no reservation {id}")))
            }
        }
    };
    idempotent::run_atomic(&state, work).await
}
