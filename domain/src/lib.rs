//! Holdfast's plain domain types, shared by the engine, the server and the
//! dashboard's WASM side so that nothing is mirrored.
//!
//! No I/O lives here: only the words of the domain (who may do what, which lane a
//! webhook takes, where a hold is in its life, what a reservation answered) and the
//! rules that need nothing but those words (the conservation equation, when stock
//! reads "low").
//!
//! - [`model`]: reservations, holds, lines, figures and every outcome.
//! - [`access`]: dashboard roles and their permissions, and API token scopes.
//! - [`doctor`]: what a pre-drop check of a deployment found (`holdfast doctor`).
//! - [`error`]: the codes every refusal is answered with, with status and retry hint.
//! - [`lane`]: the ingestion lanes webhooks are queued on.
//! - [`readiness`]: whether a drop is ready to open (armed).
//! - [`report`]: a drop's report: sales, speed and how holds ended, per SKU.
//! - [`sheet`]: a drop as a file (CSV or JSON), and what importing one changes.
//! - [`stock`]: the conservation rule over live counters, and stock states.
//! - [`text`]: numbers as people read them.
//! - [`verify`]: what a truth check found.

pub mod access;
pub mod doctor;
pub mod error;
pub mod lane;
pub mod model;
pub mod readiness;
pub mod report;
pub mod sheet;
pub mod stock;
pub mod text;
pub mod verify;

pub use access::{Permission, Role, Scope};
pub use error::ErrorCode;
pub use lane::Lane;
pub use model::*;
pub use stock::{Counters, Recorded, StockState};
