//! The workspace's `rust-version` is at least the highest `rust-version` of every package
//! in the resolve of `Cargo.lock` with all features enabled, on every platform (from
//! `cargo metadata --all-features --locked`): the declared minimum toolchain can build
//! what the lock file pins. A dependency update that needs a newer toolchain fails here,
//! naming the packages, until `rust-version` in `Cargo.toml` is raised.
//!
//! The resolve includes the dev-dependencies and every feature: `scripts/test.sh` builds
//! all of them, so the README's minimum toolchain is this one too. This reads what the
//! dependencies declare rather than building with the minimum toolchain; a build with it
//! (`cargo +<rust-version> check --workspace --all-targets --all-features --locked`)
//! checks the same claim where that toolchain is installed.

use std::process::Command;

use serde_json::Value;

/// `1.88`, `1.89.0` -> `(1, 89, 0)`.
fn version(text: &str) -> (u64, u64, u64) {
    let mut parts = text.split('.').map(|part| {
        part.parse::<u64>()
            .unwrap_or_else(|_| panic!("not a rust-version: {text:?}"))
    });
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

#[test]
fn workspace_rust_version_covers_dependencies() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
            "--locked",
        ])
        .args(["--manifest-path", manifest])
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata JSON");
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let resolved: Vec<&str> = metadata["resolve"]["nodes"]
        .as_array()
        .expect("resolve.nodes")
        .iter()
        .filter_map(|node| node["id"].as_str())
        .collect();

    let mut declared = Vec::new();
    let mut needed = Vec::new();
    for package in metadata["packages"].as_array().expect("packages") {
        let id = package["id"].as_str().expect("package id");
        let name = package["name"].as_str().unwrap_or("?");
        let Some(rust_version) = package["rust_version"].as_str() else {
            continue;
        };
        if members.contains(&id) {
            declared.push((name, version(rust_version), rust_version));
        } else if resolved.contains(&id) {
            let release = package["version"].as_str().unwrap_or("?");
            needed.push((
                version(rust_version),
                format!("{name} {release} ({rust_version})"),
            ));
        }
    }
    assert!(
        !declared.is_empty(),
        "no workspace member declares a rust-version"
    );
    let highest = needed.iter().map(|(v, _)| *v).max().unwrap_or((0, 0, 0));
    for (member, declared_version, text) in declared {
        let above: Vec<&str> = needed
            .iter()
            .filter(|(v, _)| *v > declared_version)
            .map(|(_, what)| what.as_str())
            .collect();
        assert!(
            above.is_empty(),
            "{member} declares rust-version {text}, but these dependencies need more \
             (raise rust-version in Cargo.toml to {}.{}): {}",
            highest.0,
            highest.1,
            above.join(", ")
        );
    }
}
