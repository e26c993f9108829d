#!/usr/bin/env bash
# The whole demo in one command: starts what is missing (PostgreSQL, the tansu Kafka-API
# broker; the first run installs tansu, about 12 minutes), then publishes order events
# with duplicate sends and malformed messages, consumes them with three consumers of one
# group through #[idempotent] handlers, and checks by SQL that every fact was applied
# exactly once.
#
#   scripts/demo.sh [demo options]      e.g. --events 20000 --consumers 4 --offsets postgres
#   scripts/demo.sh --batch-size 500    up to 500 messages per transaction (the batch path)
#   scripts/demo.sh --help              all options
#
# The services keep running afterwards (the next run reuses them);
# `scripts/services.sh down` stops the ones this started.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null 2>&1 || {
    echo "demo.sh: cargo is missing; install Rust from https://rustup.rs first" >&2
    exit 1
}

echo "== services"
scripts/services.sh up postgres kafka
echo "== building the demo (release; the first build takes 10 to 15 minutes on 2 cores)"
cargo build --quiet --release --example demo
echo "== running it"
cargo run --quiet --release --example demo -- "$@"
