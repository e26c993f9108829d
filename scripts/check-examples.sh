#!/usr/bin/env bash
# Builds examples/order_consumer.rs, examples/notification_consumer.rs and
# examples/payment_publisher.rs, unchanged, in a
# fresh crate outside the workspace whose [dependencies] are the list in examples/README.md
# (the block after `<!-- examples-dependencies -->`): what a team copying an example
# starts from. idem's crates come from this repository through [patch.crates-io]; the
# workspace's Cargo.lock and target directory are reused, so a warm run only builds the
# examples.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

deps=$(awk '/<!-- examples-dependencies -->/ { found = 1; next }
            found && /^```toml/ { inside = 1; next }
            inside && /^```/ { exit }
            inside { print }' examples/README.md)
if [ -z "$deps" ]; then
    echo "check-examples.sh: no dependency list after <!-- examples-dependencies --> in examples/README.md" >&2
    exit 1
fi

crate=$(mktemp -d "${TMPDIR:-/tmp}/idem-examples-outside.XXXXXX")
trap 'rm -rf "$crate"' EXIT
mkdir "$crate/src" "$crate/examples"
cat >"$crate/Cargo.toml" <<TOML
[package]
name = "idem-examples-outside"
version = "0.0.0"
edition = "2024"
publish = false
# Named apart from the workspace's examples, whose binaries share the target directory.
autoexamples = false

[[example]]
name = "outside_order_consumer"
path = "examples/order_consumer.rs"

[[example]]
name = "outside_notification_consumer"
path = "examples/notification_consumer.rs"

[[example]]
name = "outside_payment_publisher"
path = "examples/payment_publisher.rs"

[workspace]

$deps

[patch.crates-io]
idem-runtime = { path = "$root/idem-runtime" }
idem-kafka = { path = "$root/idem-kafka" }
TOML
: >"$crate/src/lib.rs"
cp examples/order_consumer.rs examples/notification_consumer.rs examples/payment_publisher.rs "$crate/examples/"
cp Cargo.lock "$crate/"

echo "== building examples/order_consumer.rs, notification_consumer.rs and payment_publisher.rs outside the workspace"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
    cargo build --quiet --manifest-path "$crate/Cargo.toml" --examples
echo "check-examples.sh: the three examples build from the README's dependency list"
