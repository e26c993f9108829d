//! idem through a connection pooler: PgBouncer in session and in transaction pooling, and a
//! direct connection, each checked the same way. Every count is read by SQL on a direct
//! connection to the test's own database.
//!
//! The PgBouncer instances are the ones `scripts/services.sh up pgbouncer` runs (their URLs
//! in `IDEM_PGBOUNCER_SESSION_URL` and `IDEM_PGBOUNCER_TRANSACTION_URL`, as
//! `scripts/test.sh` exports them); without those variables the test asks the script for
//! them, which starts the instances (and installs PgBouncer where it is missing).

mod batches;
mod child;
mod infrastructure_errors;
mod lease;
mod lease_time_buckets;
mod migrate_from_eight_processes;
mod operator;
mod route;
mod storm;
mod testing_kit;
mod time_bucket_batches;
mod time_buckets;

/// One test of each scenario per route.
macro_rules! through {
    ($($route:ident => $variant:ident),* $(,)?) => {$(
        mod $route {
            use crate::route::Route;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn eight_processes_migrate_at_once() {
                crate::migrate_from_eight_processes::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_storm_of_duplicates_applies_every_fact_once_without_pooler_attempts() {
                crate::storm::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn overlapping_batches_of_500_apply_every_fact_once() {
                crate::batches::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_lease_deliveries_run_each_body_once() {
                crate::lease::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lease_deliveries_of_keys_kept_by_time_run_each_body_once() {
                crate::lease_time_buckets::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn the_operator_api_works() {
                crate::operator::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn keys_kept_by_the_facts_time_apply_each_fact_once_inside_the_window() {
                crate::time_buckets::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn batches_of_keys_kept_by_the_facts_time_apply_each_fact_once() {
                crate::time_bucket_batches::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn the_testing_kit_works() {
                crate::testing_kit::run(Route::$variant).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn connection_and_statement_errors_count_no_attempt() {
                crate::infrastructure_errors::run(Route::$variant).await;
            }
        }
    )*};
}

through! {
    direct => Direct,
    session_pooling => Session,
    transaction_pooling => Transaction,
}
