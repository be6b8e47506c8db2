//! Pages, one file each.

pub mod home;
