//! Holdfast's plain domain types, shared by the engine, the server and the
//! dashboard's WASM side so that nothing is mirrored.
//!
//! No I/O lives here: only the words of the domain (who may do what, which lane a
//! webhook takes, where a hold is in its life, what a reservation answered) and the
//! rules that need nothing but those words (the conservation equation, when stock
//! reads "low").
//!
//! - [`model`]: reservations, holds, lines, figures and every outcome.
//! - [`access`]: dashboard roles and API token scopes.
//! - [`doctor`]: what a pre-drop check of a deployment found (`holdfast doctor`).
//! - [`error`]: the codes every refusal is answered with, with status and retry hint.
//! - [`lane`]: the ingestion lanes webhooks are queued on.
//! - [`stock`]: the conservation rule over live counters, and stock states.
//! - [`text`]: numbers as people read them.
//! - [`verify`]: what a truth check found.

pub mod access;
pub mod doctor;
pub mod error;
pub mod lane;
pub mod model;
pub mod stock;
pub mod text;
pub mod verify;

pub use access::{Role, Scope};
pub use error::ErrorCode;
pub use lane::Lane;
pub use model::*;
pub use stock::{Counters, Recorded, StockState};
