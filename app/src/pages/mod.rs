//! One module per page.

pub mod admin;
pub mod audit;
pub mod drop_editor;
pub mod drops;
pub mod ingestion;
pub mod locks;
pub mod login;
pub mod operations;
pub mod overview;
pub mod report;
pub mod reservations;
pub mod reserve;
pub mod sku;
pub mod wall;
