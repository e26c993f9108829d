//! `sqlx::migrate!` embeds the migrations at compile time; this rebuilds the crate when a
//! migration is added or changed, which the macro alone does not notice.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
