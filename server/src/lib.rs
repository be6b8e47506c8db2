//! The Holdfast HTTP server: one [`startup::Application`] built once from
//! [`config`], serving these areas, each with its own router and the part of the
//! state it needs (`FromRef`, see [`state`]):
//!
//! - [`api`]: the checkout API under `/api/v1` (token-authenticated JSON).
//! - [`routes`]: health probes, signed webhooks, Prometheus metrics, the demo shop.
//! - [`badge`]: the public stock badges (JSON polls and a WebSocket).
//! - [`live`]: the dashboards' WebSocket and the hub that feeds it.
//! - the Leptos pages and server functions (from the `holdfast-app` crate).
//!
//! Below the areas: [`http`] (the error type, token authentication, rate limits),
//! [`feed`] (one reader of the event streams per process) and [`workers`] (the
//! reaper, write-behind, reconciliation and ingestion consumers, on the
//! threads of [`background`], which may run at a lower priority). Every rule and
//! every storage access is the engine's (`holdfast-engine`); the operator CLI is
//! the `holdfast-cli` crate.

pub mod api;
pub mod background;
pub mod badge;
pub mod config;
pub mod feed;
pub mod http;
pub mod live;
pub mod routes;
pub mod startup;
pub mod state;
pub mod workers;
