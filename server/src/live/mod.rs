//! The dashboard's live side: one hub per process that turns the event feed into
//! coalesced figures, chart history, operations samples and job progress
//! ([`hub`]), and the WebSocket each dashboard tab holds ([`ws`]).

pub mod hub;
pub mod ws;

pub use hub::LiveHub;
