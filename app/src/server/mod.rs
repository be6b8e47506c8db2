//! Server-only support for the server functions: who is calling and may they
//! ([`guard`]), long-running jobs with live progress ([`jobs`]), and conversions
//! from the engine's types to the DTOs ([`convert`]).

pub mod convert;
pub mod guard;
pub mod jobs;
