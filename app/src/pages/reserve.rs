//! The operators' reserve tool: a hold made by hand through the same core as
//! checkout, for tests and support.

use leptos::prelude::*;

use crate::api::reserve::ManualReserve;
use crate::components::Outcome;

/// The reserve tool (`/reserve`, admin).
#[component]
pub fn ReservePage() -> impl IntoView {
    let reserve = ServerAction::<ManualReserve>::new();
    view! {
        <section class="panel narrow">
            <h1>"Reserve by hand"</h1>
            <p class="muted">"Holds units through the same Lua script as checkout. The hold expires like any other unless released."</p>
            <ActionForm action=reserve>
                <label>"SKU"<input type="text" name="sku" required placeholder="DROP-001"/></label>
                <label>"Units"<input type="number" name="qty" min="1" value="1" required/></label>
                <label>"Buyer (required for a SKU with a per-buyer limit)"<input type="text" name="buyer"/></label>
                <label>"Hold for seconds (optional)"<input type="number" name="ttl_secs" min="1"/></label>
                <button type="submit" disabled=move || reserve.pending().get()>"Reserve"</button>
            </ActionForm>
            <Outcome value=reserve.value().into()/>
        </section>
    }
}
