//! The Kafka side of the demo and of the tests: order events applied through
//! `#[idempotent]` handlers by [`idem_kafka`] consumers.
//!
//! The consumer itself is the published crate `idem-kafka`; what stays here is the demo's
//! domain and the test support around it:
//!
//! - [`handlers`]: the order events' handlers (`#[idempotent(key = "event_key", ...)]`),
//!   the tables they write, and [`handlers::OrderEvents`], their [`idem_kafka::Handler`];
//! - [`notifications`]: the side-effect consumer's handler, in lease mode, and the
//!   stand-in external notification service it calls;
//! - [`producer`]: order events with duplicate sends and malformed messages, as the demo
//!   and the tests publish them;
//! - [`admin`]: topic creation and broker checks;
//! - [`broker`]: finding or starting a local `tansu` broker for the tests;
//! - [`verify`]: the SQL check that every business fact was applied exactly once.

pub mod admin;
pub mod broker;
pub mod handlers;
pub mod notifications;
pub mod producer;
pub mod verify;

use idem_runtime::Idem;
use sqlx::PgPool;

pub use idem_kafka::shutdown_signal;

/// The default broker address of the demo (`KAFKA_BROKERS` overrides it).
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";

/// Creates the business tables if they are missing. Safe to call from every consumer at
/// start-up (serialised by an advisory lock).
pub async fn create_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    // Concurrent `CREATE TABLE IF NOT EXISTS` of one table can fail on the catalog's
    // unique index: serialise the consumers that start together.
    // Simple queries: nothing prepared stays on a transaction pooler's server connection.
    sqlx::raw_sql("SELECT pg_advisory_xact_lock(hashtext('idem-suite kafka tables'))")
        .execute(&mut *tx)
        .await?;
    for statement in [
        crate::orders::CREATE_ORDER_EFFECTS,
        handlers::CREATE_ORDER_TOTALS,
    ] {
        sqlx::raw_sql(statement).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// Everything the demo's consumers need in `idem`'s database: the business tables,
/// idem's status table and idem-kafka's offset and dead-letter tables (in `idem_kafka`).
pub async fn prepare(idem: &Idem) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    create_tables(idem.pool()).await?;
    idem.migrate().await?;
    idem_kafka::migrate(idem, &idem_kafka::Schema::for_idem(idem)).await?;
    Ok(())
}

/// Logs to stderr through `tracing`, filtered by `RUST_LOG` or else by `default_filter`
/// (e.g. `"info"`).
pub fn init_tracing(default_filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}
