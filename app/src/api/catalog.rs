//! Reading the catalogue: drops and their SKUs.

use leptos::prelude::*;

use crate::dto::DropOverview;

/// The newest drop (or `code`, when given) with its SKUs; `None` when there is no
/// such drop.
#[server]
pub async fn load_drop_overview(
    code: Option<String>,
) -> Result<Option<DropOverview>, ServerFnError> {
    use holdfast_engine::catalog;

    use crate::dto::SkuSummary;

    let backends = expect_context::<holdfast_engine::Backends>();
    let internal = |e: holdfast_engine::EngineError| {
        tracing::error!(error = %e, "load_drop_overview failed");
        ServerFnError::new("The catalogue could not be read; try again in a moment.")
    };
    let drops = catalog::drops(&backends.pg).await.map_err(internal)?;
    let chosen = match code {
        Some(code) => drops.into_iter().find(|d| d.code == code),
        None => drops.into_iter().next(),
    };
    let Some(drop) = chosen else { return Ok(None) };
    let skus = catalog::drop_skus(&backends.pg, &drop.code)
        .await
        .map_err(internal)?
        .into_iter()
        .map(|s| SkuSummary {
            sku: s.sku,
            title: s.title,
            product: s.product,
            on_hand: s.on_hand,
        })
        .collect();
    Ok(Some(DropOverview {
        code: drop.code,
        name: drop.name,
        skus,
    }))
}
