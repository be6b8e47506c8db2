//! Server functions, one file per area. Each runs on the server and is called over
//! HTTP from the browser.

// `#[server]` generates a public struct per function whose fields are the
// function's arguments; Rust gives no way to document those fields.
#[allow(missing_docs)]
pub mod catalog;
