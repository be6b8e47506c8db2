//! From the engine's types to the DTOs the pages receive.

use holdfast_engine::audit::AuditEntry;
use holdfast_engine::events::Event;
use holdfast_engine::locks::LockInfo;
use holdfast_engine::model::{Figures, Hold};
use holdfast_engine::reconcile::{RunSummary, SkuDrift};
use holdfast_engine::remediation::Remediation;
use holdfast_engine::tokens::TokenInfo;
use holdfast_engine::users::User;
use holdfast_engine::{Backends, EngineError};

use crate::dto::holds::{HoldLineView, HoldView, RemediationView};
use crate::dto::live::{EventView, SkuLive};
use crate::dto::ops::{LockView, RunView};
use crate::dto::people::{AuditView, Me, TokenView, UserView};

/// The signed-in user.
pub fn me(user: &User) -> Me {
    Me {
        username: user.username.clone(),
        role: user.role,
        must_change_password: user.must_change_password,
    }
}

/// A user for the admin list.
pub fn user_view(user: User) -> UserView {
    UserView {
        username: user.username,
        role: user.role,
        must_change_password: user.must_change_password,
        created_at: user.created_at.to_rfc3339(),
    }
}

/// A token without its secret.
pub fn token_view(t: TokenInfo) -> TokenView {
    TokenView {
        id: t.id,
        name: t.name,
        scopes: t.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
        created_at: t.created_at.to_rfc3339(),
        revoked: t.revoked_at.is_some(),
    }
}

/// An audit entry.
pub fn audit_view(e: AuditEntry) -> AuditView {
    AuditView {
        id: e.id,
        actor: e.actor,
        action: e.action,
        subject: e.subject,
        detail: e.detail.to_string(),
        at: e.created_at.to_rfc3339(),
    }
}

/// A hold.
pub fn hold_view(h: Hold) -> HoldView {
    HoldView {
        reservation_id: h.reservation_id,
        state: h.state.as_str().to_owned(),
        lines: h
            .lines
            .into_iter()
            .map(|l| HoldLineView {
                sku: l.sku,
                qty: l.qty,
            })
            .collect(),
        buyer: h.buyer,
        expires_at_ms: h.expires_at_ms,
        created_at_ms: h.created_at_ms,
    }
}

/// A stream event.
pub fn event_view(e: &Event) -> EventView {
    EventView {
        id: e.id.clone(),
        kind: serde_json::to_value(e.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        sku: e.sku.clone(),
        qty: e.qty,
        reservation_id: e.reservation_id.clone(),
        available: e.available,
        at_ms: e.at_ms,
    }
}

/// A held lock.
pub fn lock_view(l: LockInfo) -> LockView {
    LockView {
        name: l.name,
        holder: l.holder,
        remaining_ms: l.remaining_ms,
        fence: l.fence,
    }
}

/// A remediation record.
pub fn remediation_view(r: Remediation) -> RemediationView {
    RemediationView {
        reservation_id: r.reservation_id,
        hold_state: r.hold_state,
        reason: r.reason,
        kind: r.kind,
        status: r.status,
        created_at: r.created_at.to_rfc3339(),
    }
}

/// A reconciliation run.
pub fn run_view(r: RunSummary) -> RunView {
    RunView {
        id: r.id,
        trigger: r.trigger,
        started_at: r.started_at.to_rfc3339(),
        finished: r.finished_at.is_some(),
        checked: r.skus_checked,
        drifted: r.drifted,
        corrected: r.corrected,
    }
}

/// Live figures from Redis' counters and the drift measurement.
pub fn sku_live(sku: &str, figures: Option<&Figures>, drift: Option<&SkuDrift>) -> SkuLive {
    let d = drift.map_or(0, |d| d.drift);
    match figures {
        Some(f) => SkuLive {
            sku: sku.to_owned(),
            available: f.available,
            reserved: f.reserved,
            sold_pending: f.sold_pending,
            owed: f.owed,
            sold: f.sold,
            open_holds: f.open_holds,
            drift: d,
            warmed: true,
        },
        None => SkuLive {
            sku: sku.to_owned(),
            available: 0,
            reserved: 0,
            sold_pending: 0,
            owed: 0,
            sold: 0,
            open_holds: 0,
            drift: d,
            warmed: false,
        },
    }
}

/// Current figures and drift of `skus`, in the same order.
pub async fn figures_of(backends: &Backends, skus: &[String]) -> Result<Vec<SkuLive>, EngineError> {
    let drifts = holdfast_engine::reconcile::measure(&backends.engine, &backends.pg, skus).await?;
    let figures = backends.engine.figures_many(skus).await?;
    Ok(skus
        .iter()
        .zip(&figures)
        .map(|(sku, f)| sku_live(sku, f.as_ref(), drifts.iter().find(|d| &d.sku == sku)))
        .collect())
}
