#!/usr/bin/env bash
# Every test: unit, integration (PostgreSQL, PgBouncer, Redis, the Kafka-API broker),
# compile-fail and doc tests, among them the guide's code blocks (idem-guide). Starts the
# services that are missing first (private PostgreSQL and Redis servers when none
# answers, two private PgBouncer poolers; the first run installs the tansu broker, about
# 12 minutes) and runs the tests against them; extra arguments go to `cargo test`. Last,
# the examples are built outside the workspace from the dependency list in
# examples/README.md (scripts/check-examples.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in cargo cc make; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "test.sh: '$tool' is missing; the tests need Rust (https://rustup.rs), a C compiler and make (librdkafka); on Debian or Ubuntu: sudo apt-get install -y build-essential, then Rust from https://rustup.rs" >&2
        exit 1
    }
done

# DATABASE_URL and REDIS_URL of the servers in use (those of private ones, when started),
# and IDEM_PGBOUNCER_SESSION_URL / IDEM_PGBOUNCER_TRANSACTION_URL: PgBouncer in front of
# that PostgreSQL, in session and in transaction pool mode.
# The broker this script started earlier starts again on empty storage (IDEM_KAFKA_FRESH):
# its storage grows with every run, and a broker on a large one is slow enough to fail
# the Kafka tests' waits.
exports=$(IDEM_KAFKA_FRESH=1 scripts/services.sh up --print-env postgres redis kafka pgbouncer)
eval "$exports"
# The failover scenarios first, in a run of their own (tests/failover/main.rs).
cargo test --workspace --all-features --test failover -- --include-ignored
cargo test --workspace --all-features "$@"
# The examples as a team copies them: built outside the workspace from the dependency
# list in examples/README.md.
scripts/check-examples.sh
