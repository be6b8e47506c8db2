//! Server-only support for the server functions: who is calling and may they
//! ([`guard`]), long-running jobs with live progress ([`jobs`]), conversions
//! from the engine's types to the DTOs ([`convert`]), and the pages'
//! Content-Security-Policy ([`csp`]).

pub mod convert;
pub mod csp;
pub mod guard;
pub mod jobs;
