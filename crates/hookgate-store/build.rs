//! `sqlx::migrate!` embeds the migration files at compile time, but Cargo does not know it
//! reads them: without this, a new migration file is left out of the build until something
//! else in the crate changes.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
