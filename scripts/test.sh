#!/usr/bin/env bash
# Every test: unit, integration (PostgreSQL, Redis, the Kafka-API broker), compile-fail
# and doc tests. Starts the services that are missing first (the first run installs the
# tansu broker, about 12 minutes); extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh up postgres redis kafka
cargo test --workspace --all-features "$@"
# The compile error of the cache's handler arguments without the `redis` feature shows
# only in a build without it.
cargo test -p idem-suite --test redis_ui "$@"
