//! Webhook ingestion: lanes, pausing them, and dead letters.

use leptos::prelude::*;
use serde::{Deserialize, Serialize};

use crate::dto::ops::{DeadLetterView, LaneView};

/// Lanes and the newest dead letters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IngestionView {
    /// Each lane.
    pub lanes: Vec<LaneView>,
    /// Newest first, at most 100.
    pub dead_letters: Vec<DeadLetterView>,
}

/// Lanes and dead letters now.
#[server(endpoint = "ingestion_status")]
pub async fn ingestion_status() -> Result<IngestionView, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::ingest;

    use crate::server::guard;

    let caller = guard::authorize(Permission::View).await?;
    let internal = guard::internal("Reading the ingestion lanes");
    let mut conn = caller.backends.engine.connection();
    let lanes = ingest::statuses(&mut conn)
        .await
        .map_err(&internal)?
        .iter()
        .map(|s| LaneView::new(s, 0.0))
        .collect();
    let dead_letters = ingest::dead_letters(&mut conn, 100)
        .await
        .map_err(&internal)?
        .into_iter()
        .map(|d| DeadLetterView {
            id: d.id,
            lane: d.lane,
            source: d.source,
            reason: d.reason,
            body: d.body,
        })
        .collect();
    Ok(IngestionView {
        lanes,
        dead_letters,
    })
}

/// Pauses or resumes a lane's consumers (admin). Webhooks keep being accepted
/// into the lane while it is paused.
#[server(endpoint = "set_lane_paused")]
pub async fn set_lane_paused(lane: String, paused: bool) -> Result<String, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::ingest;

    use crate::server::guard;

    let caller = guard::authorize(Permission::Operate).await?;
    let lane = holdfast_domain::Lane::parse(&lane)
        .map_err(|e| guard::refuse(http::StatusCode::BAD_REQUEST, format!("{e}.")))?;
    let mut conn = caller.backends.engine.connection();
    let internal = guard::internal("Changing the lane");
    if paused {
        ingest::pause(&mut conn, lane).await.map_err(&internal)?;
    } else {
        ingest::resume(&mut conn, lane).await.map_err(&internal)?;
    }
    let action = if paused { "pause_lane" } else { "resume_lane" };
    guard::audit(&caller, action, lane.as_str(), serde_json::json!({})).await;
    Ok(format!(
        "Lane {lane} {}.",
        if paused { "paused" } else { "resumed" }
    ))
}

/// Puts a dead letter back on its lane (admin).
#[server(endpoint = "replay_dead_letter")]
pub async fn replay_dead_letter(id: String) -> Result<String, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::ingest;

    use crate::server::guard;

    let caller = guard::authorize(Permission::Operate).await?;
    let mut conn = caller.backends.engine.connection();
    match ingest::replay(&mut conn, &id)
        .await
        .map_err(guard::internal("Replaying the dead letter"))?
    {
        ingest::Replay::Requeued(entry) => {
            guard::audit(
                &caller,
                "replay_dead_letter",
                &id,
                serde_json::json!({ "entry": entry }),
            )
            .await;
            Ok(format!("Dead letter {id} is back on its lane."))
        }
        ingest::Replay::Unknown => Err(guard::refuse(
            http::StatusCode::NOT_FOUND,
            format!("There is no dead letter {id} (already replayed?)."),
        )),
        ingest::Replay::Cut(length) => Err(guard::refuse(
            http::StatusCode::CONFLICT,
            format!(
                "Dead letter {id} was kept cut short (its {length}-byte payload came while the \
                 dead letters were full), so it cannot be replayed: ask its sender to send it again."
            ),
        )),
    }
}
