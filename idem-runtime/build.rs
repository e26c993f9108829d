//! - `sqlx::migrate!` embeds the migrations at compile time; this rebuilds the crate when a
//!   migration is added or changed, which the macro alone does not notice.
//! - The module that generated code refers to is named after this package's version
//!   (`__private_v0_1_0`); idem-macros derives the same name from its own version, which
//!   the workspace pins to this one with `=`.
use std::{env, fs, path::Path};

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=build.rs");
    let version = env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    let name: String = format!("__private_v{version}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let module = format!(
        "#[doc(hidden)]\npub mod {name} {{\n    #[doc(hidden)]\n    pub use crate::private::*;\n}}\n"
    );
    let out = env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    fs::write(Path::new(&out).join("private.rs"), module).expect("OUT_DIR is writable");
}
