#!/usr/bin/env bash
# The whole demo in one command: starts what is missing (PostgreSQL, a private cluster
# when none answers; the tansu Kafka-API broker, which the first run installs, about 12
# minutes), then publishes order events, each stamped with its time once by the producer,
# with duplicate sends and malformed messages, consumes them with three consumers of one
# group through #[idempotent] handlers whose keys are kept by the fact's time
# (`event_time`), and checks by SQL that every fact was applied exactly once.
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
for tool in cc make; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "demo.sh: '$tool' is missing; the build needs a C compiler and make (librdkafka); on Debian or Ubuntu: sudo apt-get install -y build-essential" >&2
        exit 1
    }
done

echo "== services"
# DATABASE_URL of the server in use (that of the private cluster, when started).
exports=$(scripts/services.sh up --print-env postgres kafka)
eval "$exports"
echo "== building the demo (release; the first build takes 10 to 15 minutes on 2 cores)"
cargo build --quiet --release -p idem-demo --bin demo
echo "== running it"
cargo run --quiet --release -p idem-demo --bin demo -- "$@"
