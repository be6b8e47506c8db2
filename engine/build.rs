//! Rebuilds the engine when a migration is added or changed: `sqlx::migrate!`
//! embeds the `migrations/` folder, which cargo does not watch by itself.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
