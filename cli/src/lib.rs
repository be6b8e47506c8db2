//! The `holdfast` command line: `main.rs` parses the arguments ([`config::Cli`])
//! and hands them to [`commands::run`]. `serve` builds the HTTP server
//! (`holdfast_server::startup::Application`); every other command is an operator
//! action through the engine (warm, reconcile, tokens, users, lanes, dead
//! letters, locks, drop schedules) or the drop rehearsal ([`simulate`]). Every manual action is
//! written to the audit log, as on the dashboard.

pub mod commands;
pub mod config;
pub mod drop_commands;
pub mod progress;
pub mod simulate;
pub mod telemetry;
pub mod user_commands;
