//! The scenario applications, built at test time: one cargo workspace of the current
//! release's variants, one of the previous release's, generated under
//! `<target>/tests/idem-compat/` and built there with a target directory of their own (the
//! outer `cargo test` holds the workspace's), offline, from copies of the releases' lock
//! files.
//!
//! Every variant is a package of its own whose library is named `scenario` (idem records
//! the crate that owns a scope, and a handler's default scope starts with its crate's
//! name) and whose binary is `scenario-<variant>`; the delivery loop is the crate
//! `driver` (`tests/compat/driver.rs`). The variants of one release build in one
//! `cargo build --keep-going`: a variant that does not compile (one that needs runtime
//! work that has not landed) fails only the scenarios that run it, with the compiler's
//! errors. The previous release is `git archive` of the commit that
//! `tests/compat/previous-release` names, whose `idem-runtime` the previous workspace
//! depends on by path.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A release of idem that scenario applications are built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Release {
    /// The repository's working tree.
    Current,
    /// The release that `tests/compat/previous-release` names.
    Previous,
}

/// The variants of the scenario application: the file `tests/compat/variants/<name>.rs`
/// (`-` written `_`) is the crate `scenario` of the binary `scenario-<name>`
/// (`scenario-<name>-previous` built with the previous release: the two builds share a
/// target directory, where binaries of one name would replace each other).
pub const CURRENT_VARIANTS: &[&str] = &[
    "base",
    "renamed",
    "moved",
    "renamed-with-old-scope",
    "method",
    "key-field-added",
    "key-field-removed",
    "key-fields-reordered",
    "order-ref-uuid",
    "order-no-i64",
    "previous-key",
    "fan-out",
];

/// The variants built with the previous release: only what it deployed.
pub const PREVIOUS_VARIANTS: &[&str] = &["base"];

/// The repository's root.
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// `<target>/tests/idem-compat`: `CARGO_TARGET_TMPDIR` is `<target>/tmp`.
fn harness_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is in the target directory")
        .join("tests/idem-compat")
}

/// The previous release, as `tests/compat/previous-release` names it: `<name> <commit>`.
pub struct PreviousRelease {
    /// Its name (a tag, such as `v0.1.0`): the directory of its build.
    pub name: String,
    /// Its commit, which the repository's history has (tags need not travel with it).
    pub commit: String,
}

impl PreviousRelease {
    /// Reads `tests/compat/previous-release`.
    pub fn read() -> PreviousRelease {
        let path = repository().join("tests/compat/previous-release");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
        let line = text
            .lines()
            .map(str::trim)
            .find(|line| !line.is_empty() && !line.starts_with('#'))
            .unwrap_or_else(|| panic!("{}: no `<name> <commit>` line", path.display()));
        let (name, commit) = line
            .split_once(char::is_whitespace)
            .unwrap_or_else(|| panic!("{}: not `<name> <commit>`: {line:?}", path.display()));
        let commit = commit.trim();
        assert!(
            commit.len() == 40 && commit.bytes().all(|byte| byte.is_ascii_hexdigit()),
            "{}: {commit:?} is not a full commit hash",
            path.display()
        );
        PreviousRelease {
            name: name.to_owned(),
            commit: commit.to_owned(),
        }
    }
}

/// What the builds produced: each variant's binary, or why it has none.
struct Builds {
    binaries: BTreeMap<(Release, String), PathBuf>,
    failures: BTreeMap<(Release, String), String>,
}

/// The binary of `variant` built with `release`; panics with the build's errors when it
/// did not build. The first call builds every variant (once per test binary run).
pub fn binary(release: Release, variant: &str) -> PathBuf {
    static BUILDS: OnceLock<Builds> = OnceLock::new();
    let builds = BUILDS.get_or_init(build_all);
    let key = (release, variant.to_owned());
    if let Some(binary) = builds.binaries.get(&key) {
        return binary.clone();
    }
    match builds.failures.get(&key) {
        Some(failure) => {
            panic!("scenario-{variant} ({release:?} release) did not build:\n{failure}")
        }
        None => panic!("scenario-{variant} is not a variant of the {release:?} release"),
    }
}

fn build_all() -> Builds {
    let dir = harness_dir();
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|error| panic!("create {}: {error}", dir.display()));
    // Another test process building here (a second `cargo test`) waits for this one: the
    // generated manifests and the previous release's sources are rewritten in place.
    let lock_path = dir.join("build.lock");
    let lock = std::fs::File::create(&lock_path)
        .unwrap_or_else(|error| panic!("create {}: {error}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|error| panic!("lock {}: {error}", lock_path.display()));
    let target = dir.join("target");
    let repository = repository();
    let mut builds = Builds {
        binaries: BTreeMap::new(),
        failures: BTreeMap::new(),
    };

    let started = Instant::now();
    let current = dir.join("current");
    write_workspace(
        &current,
        &repository.join("idem-runtime"),
        &repository.join("Cargo.lock"),
        CURRENT_VARIANTS,
        "",
    );
    build(
        &current,
        &target,
        Release::Current,
        CURRENT_VARIANTS,
        &mut builds,
    );
    let current_took = started.elapsed();

    let started = Instant::now();
    let previous = PreviousRelease::read();
    let release_dir = dir.join(&previous.name);
    match extract(&repository, &previous, &release_dir) {
        Ok(source) => {
            let app = release_dir.join("app");
            write_workspace(
                &app,
                &source.join("idem-runtime"),
                &source.join("Cargo.lock"),
                PREVIOUS_VARIANTS,
                "-previous",
            );
            build(
                &app,
                &target,
                Release::Previous,
                PREVIOUS_VARIANTS,
                &mut builds,
            );
        }
        // Only the scenarios of the previous release fail, each with the reason.
        Err(reason) => {
            for variant in PREVIOUS_VARIANTS {
                let key = (Release::Previous, (*variant).to_owned());
                builds.failures.insert(key, reason.clone());
            }
        }
    }
    eprintln!(
        "idem-compat: built the current release's variants in {}, {}'s in {} (in {})",
        seconds(current_took),
        previous.name,
        seconds(started.elapsed()),
        dir.display()
    );
    builds
}

fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// `git archive` of the previous release's commit, extracted into `<release_dir>/src`
/// (once: a marker records the commit extracted there). Returns that directory, or why
/// there is none: the commit is not in the clone's history.
fn extract(
    repository: &Path,
    previous: &PreviousRelease,
    release_dir: &Path,
) -> Result<PathBuf, String> {
    let source = release_dir.join("src");
    let marker = release_dir.join("src.commit");
    if std::fs::read_to_string(&marker).is_ok_and(|commit| commit.trim() == previous.commit) {
        return Ok(source);
    }
    let known = Command::new("git")
        .arg("-C")
        .arg(repository)
        .args(["cat-file", "-e"])
        .arg(format!("{}^{{commit}}", previous.commit))
        .stderr(Stdio::null())
        .status()
        .map_err(|error| format!("run git (needed for the previous release): {error}"))?;
    if !known.success() {
        return Err(format!(
            "the previous release {} (commit {}) is not in this clone's history, as in a \
             shallow clone: fetch it (`git fetch --unshallow`, or `git fetch origin {}`) and \
             run again",
            previous.name, previous.commit, previous.commit
        ));
    }
    if source.exists() {
        std::fs::remove_dir_all(&source)
            .unwrap_or_else(|error| panic!("remove {}: {error}", source.display()));
    }
    std::fs::create_dir_all(&source)
        .unwrap_or_else(|error| panic!("create {}: {error}", source.display()));
    let mut archive = Command::new("git")
        .arg("-C")
        .arg(repository)
        .args(["archive", "--format=tar", &previous.commit])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run git archive");
    let tar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&source)
        .stdin(archive.stdout.take().expect("git archive's stdout"))
        .status()
        .expect("run tar -x");
    let archived = archive.wait().expect("wait for git archive");
    assert!(
        archived.success() && tar.success(),
        "git archive {} | tar -x -C {}: {archived}, {tar}",
        previous.commit,
        source.display()
    );
    std::fs::write(&marker, &previous.commit)
        .unwrap_or_else(|error| panic!("write {}: {error}", marker.display()));
    Ok(source)
}

/// A TOML string of `path`.
fn toml_path(path: &Path) -> String {
    let text = path.to_str().expect("the repository's path is UTF-8");
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Generates the workspace of `variants` in `dir`, over the `idem-runtime` at `runtime`
/// and a copy of the lock file at `lock`; the binaries' names end with `bin_suffix`.
fn write_workspace(dir: &Path, runtime: &Path, lock: &Path, variants: &[&str], bin_suffix: &str) {
    let compat = repository().join("tests/compat");
    let members: Vec<String> = std::iter::once("\"driver\"".to_owned())
        .chain(variants.iter().map(|variant| format!("\"{variant}\"")))
        .collect();
    write_if_changed(
        &dir.join("Cargo.toml"),
        &format!(
            r#"# Generated by idem's `upgrades` test (tests/upgrades/build.rs); rewritten on each run.
[workspace]
members = [{members}]
resolver = "2"

[workspace.dependencies]
idem-runtime = {{ path = {runtime} }}
driver = {{ path = "driver", package = "scenario-driver" }}
sqlx = {{ version = "0.8", default-features = false, features = ["runtime-tokio", "postgres"] }}
tokio = {{ version = "1", features = ["rt-multi-thread", "time", "sync"] }}
uuid = "1"
serde_json = "1"

# No debug info, no incremental state: the binaries only run.
[profile.dev]
debug = false
incremental = false
"#,
            members = members.join(", "),
            runtime = toml_path(runtime),
        ),
    );
    write_if_changed(
        &dir.join("driver/Cargo.toml"),
        &format!(
            r#"[package]
name = "scenario-driver"
version = "0.0.0"
edition = "2024"
publish = false

[lib]
name = "driver"
path = {path}

[dependencies]
idem-runtime = {{ workspace = true }}
sqlx = {{ workspace = true }}
tokio = {{ workspace = true }}
uuid = {{ workspace = true }}
serde_json = {{ workspace = true }}
"#,
            path = toml_path(&compat.join("driver.rs")),
        ),
    );
    for variant in variants {
        write_if_changed(
            &dir.join(variant).join("Cargo.toml"),
            &format!(
                r#"[package]
name = "scenario-{variant}"
version = "0.0.0"
edition = "2024"
publish = false

[lib]
name = "scenario"
path = {lib}

[[bin]]
name = "scenario-{variant}{bin_suffix}"
path = {bin}

[dependencies]
driver = {{ workspace = true }}
idem-runtime = {{ workspace = true }}
sqlx = {{ workspace = true }}
uuid = {{ workspace = true }}
"#,
                lib = toml_path(
                    &compat
                        .join("variants")
                        .join(format!("{}.rs", variant.replace('-', "_")))
                ),
                bin = toml_path(&compat.join("bin.rs")),
            ),
        );
    }
    let lock_text = std::fs::read_to_string(lock)
        .unwrap_or_else(|error| panic!("read {}: {error}", lock.display()));
    write_if_changed(&dir.join("Cargo.lock"), &lock_text);
}

fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return;
    }
    std::fs::create_dir_all(path.parent().expect("a file in a directory"))
        .unwrap_or_else(|error| panic!("create {}: {error}", path.display()));
    std::fs::write(path, text).unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
}

/// `cargo build --offline --keep-going` of the workspace in `dir`: records each variant's
/// binary from cargo's JSON messages, or the errors of the variant that did not build.
fn build(dir: &Path, target: &Path, release: Release, variants: &[&str], builds: &mut Builds) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "build",
            "--offline",
            "--workspace",
            "--bins",
            "--keep-going",
            "--message-format=json",
        ])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("run cargo build in {}: {error}", dir.display()));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let mut errors: BTreeMap<String, String> = BTreeMap::new();
    for line in output.stdout.lines() {
        let line = line.expect("cargo's output is UTF-8");
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        // The package's directory is the variant's name (or `driver`).
        let package = message["manifest_path"]
            .as_str()
            .and_then(|manifest| Path::new(manifest).parent()?.file_name()?.to_str())
            .unwrap_or_default()
            .to_owned();
        match message["reason"].as_str() {
            Some("compiler-artifact") => {
                if let Some(executable) = message["executable"].as_str() {
                    builds
                        .binaries
                        .insert((release, package), PathBuf::from(executable));
                }
            }
            Some("compiler-message") if message["message"]["level"] == "error" => {
                let rendered = message["message"]["rendered"].as_str().unwrap_or_default();
                errors.entry(package).or_default().push_str(rendered);
            }
            _ => {}
        }
    }
    for variant in variants {
        let key = (release, (*variant).to_owned());
        if builds.binaries.contains_key(&key) {
            continue;
        }
        // Its own errors; or those of what it depends on (the driver, the runtime), with
        // cargo's own output.
        let failure = match errors.get(*variant) {
            Some(own) => own.clone(),
            None => {
                let others: String = errors.values().map(String::as_str).collect();
                format!(
                    "cargo build in {} ({}):\n{others}{stderr}",
                    dir.display(),
                    output.status
                )
            }
        };
        builds.failures.insert(key, failure);
    }
}
