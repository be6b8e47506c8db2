//! The browser entry point: hydrates the server-rendered dashboard.

/// Called by the generated JS once the WASM module has loaded.
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(holdfast_app::App);
}
