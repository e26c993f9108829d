#!/usr/bin/env bash
# Packages the published crates in their dependency order (idem-macros, idem-runtime,
# idem-kafka, idem-cli) into target/package/, and builds each packaged crate on its own.
# One `cargo package` call: it resolves the crates' dependencies on each other from the
# workspace, before any of them is on crates.io. Extra arguments go to `cargo package`
# (e.g. --no-verify, --allow-dirty, --list).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo package -p idem-macros -p idem-runtime -p idem-kafka -p idem-cli "$@"
