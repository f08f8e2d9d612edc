//! Rebuilds when a migration is added, as `sqlx::migrate!` recommends.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=attempts-migrations");
    println!("cargo:rerun-if-changed=gcra-migrations");
}
