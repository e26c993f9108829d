//! The fault-injection suite: an exactly-once ledger under faults.
//!
//! Payments (with duplicates, out of order, by several workers at once, through the
//! transaction, lease and batch paths) are applied while injectors kill backends (also
//! in `COMMIT`), restart PostgreSQL hard, flush, stop and kill Redis, abort deliveries,
//! force deadlocks, serialization failures, lock timeouts and expired leases, and race
//! the retention cleanup against late duplicates; bad inputs arrive among them. Once
//! everything has settled, SQL checks that nothing was lost or applied twice.
//!
//! The suite runs its own PostgreSQL cluster (`initdb`, `pg_ctl`: the server programs must
//! be installed) and its own `redis-server`, so that it can restart them.
//!
//! The short run is part of `cargo test --workspace --all-features`; the long one:
//!
//! ```sh
//! IDEM_FAULTS_DELIVERIES=100000 cargo test -p idem-runtime --all-features --test faults -- --ignored --nocapture
//! ```
//!
//! `IDEM_FAULTS_SEED` repeats a run's choices (the seed is printed with the summary).

mod chaos;
mod deliveries;
mod fault_counts;
mod invariants;
mod ledger;
mod scenario;
mod seeded_random;
mod settlement;
mod summary;
mod throwaway_postgres;
mod throwaway_redis;
mod workers;

use std::time::Duration;

use deliveries::Size;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ledger_under_faults_loses_nothing_and_doubles_nothing() {
    scenario::run(Size::short(), Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the long run (>= 100,000 deliveries): IDEM_FAULTS_DELIVERIES=100000 cargo test -p idem-runtime --all-features --test faults -- --ignored --nocapture"]
async fn ledger_under_faults_at_scale() {
    let deliveries = std::env::var("IDEM_FAULTS_DELIVERIES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(100_000);
    scenario::run(Size::scaled(deliveries), Duration::from_secs(1_800)).await;
}
