//! The drop overview: a drop's SKUs with their figures.

use leptos::prelude::*;

use crate::dto::DropOverview;

/// The newest drop (or `code`, when given) with its SKUs and figures; `None` when
/// there is no such drop.
#[server(endpoint = "drop_overview")]
pub async fn load_drop_overview(
    code: Option<String>,
) -> Result<Option<DropOverview>, ServerFnError> {
    use holdfast_domain::Permission;
    use holdfast_engine::catalog;

    use crate::dto::SkuSummary;
    use crate::server::{convert, guard};

    let caller = guard::authorize(Permission::View).await?;
    let b = &caller.backends;
    let internal = guard::internal("Reading the drop");
    let drops = catalog::drops(&b.pg).await.map_err(&internal)?;
    let list: Vec<(String, String)> = drops
        .iter()
        .map(|d| (d.code.clone(), d.name.clone()))
        .collect();
    let chosen = match code.filter(|c| !c.is_empty()) {
        Some(code) => drops.into_iter().find(|d| d.code == code),
        None => drops.into_iter().next(),
    };
    let Some(drop) = chosen else { return Ok(None) };
    let skus: Vec<SkuSummary> = catalog::drop_skus(&b.pg, &drop.code)
        .await
        .map_err(&internal)?
        .into_iter()
        .map(|s| SkuSummary {
            sku: s.sku,
            title: s.title,
            product: s.product,
            variant: s.variant,
            low_stock_threshold: i64::from(s.low_stock_threshold),
            on_hand: s.on_hand,
        })
        .collect();
    let names: Vec<String> = skus.iter().map(|s| s.sku.clone()).collect();
    let figures = convert::figures_of(b, &names).await.map_err(&internal)?;
    let schedule = holdfast_engine::schedule::drop_schedule(&b.pg, &drop.code)
        .await
        .map_err(&internal)?
        .unwrap_or_default();
    Ok(Some(DropOverview {
        starts_at_ms: schedule.starts_at.map(|t| t.timestamp_millis()),
        ends_at_ms: schedule.ends_at.map(|t| t.timestamp_millis()),
        code: drop.code,
        name: drop.name,
        skus,
        figures,
        drops: list,
    }))
}
