//! Support for the integration tests: a migrated runtime over a fresh database, row counts,
//! order events, and checkpoints that pause a handler body where a test wants it.
//!
//! ```no_run
//! # async fn test(pool: sqlx::PgPool) {
//! use idem_suite::testing;
//!
//! let idem = testing::setup(&pool).await;
//! assert_eq!(testing::count_rows(&pool, "order_effects").await, 0);
//! assert_eq!(testing::count_rows(&pool, "idem.idem_keys").await, 0);
//! # let _ = idem; }
//! ```

use std::sync::Arc;

use idem_runtime::Idem;
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::orders::{CREATE_ORDER_EFFECTS, EventType, OrderEvent};

/// Creates the business table `order_effects` and the status table (schema `idem`), and
/// returns a runtime handle with the default settings.
pub async fn setup(pool: &PgPool) -> Idem {
    setup_with(Idem::new(pool.clone())).await
}

/// Creates the business table `order_effects` and migrates `idem`'s status table.
pub async fn setup_with(idem: Idem) -> Idem {
    sqlx::query(CREATE_ORDER_EFFECTS)
        .execute(idem.pool())
        .await
        .expect("create order_effects");
    idem.migrate().await.expect("migrate the status table");
    idem
}

/// The number of committed rows in `table` (`name` or `schema.name`).
///
/// # Panics
///
/// When `table` is not a plain lowercase (optionally schema-qualified) name, or the query
/// fails.
pub async fn count_rows(pool: &PgPool, table: &str) -> i64 {
    let plain = !table.is_empty()
        && table
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.');
    assert!(plain, "not a plain table name: {table:?}");
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|error| panic!("count the rows of {table}: {error}"))
}

/// A `paid` event of `order_id` for `amount_cents`.
pub fn paid(order_id: &str, amount_cents: i64) -> OrderEvent {
    OrderEvent {
        order_id: order_id.to_owned(),
        event_type: EventType::Paid,
        amount_cents,
        occurred_at: chrono::Utc::now(),
        event_key: None,
    }
}

/// Records `event` in `order_effects` through the handler's connection; returns the new
/// row's id.
pub async fn insert_effect(
    conn: &mut sqlx::PgConnection,
    event: &OrderEvent,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(&event.order_id)
    .bind(format!("{:?}", event.event_type).to_lowercase())
    .bind(event.amount_cents)
    .fetch_one(conn)
    .await
}

/// A point in a handler body where the body announces itself and waits to be released.
///
/// The body calls [`Checkpoint::reach`]; the test awaits [`Checkpoint::reached`], looks
/// at the database while the body's transaction is open, and calls
/// [`Checkpoint::release`]. Either side may come first: nothing is lost.
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    inner: Arc<Signals>,
}

#[derive(Debug, Default)]
struct Signals {
    reached: Notify,
    released: Notify,
}

impl Checkpoint {
    /// A checkpoint that no body has reached yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// In the body: announces that the body got here, then waits for [`release`](Self::release).
    pub async fn reach(&self) {
        self.inner.reached.notify_one();
        self.inner.released.notified().await;
    }

    /// In the body: announces that the body got here, and goes on.
    pub fn announce(&self) {
        self.inner.reached.notify_one();
    }

    /// In the body: announces that the body got here and never returns, so that the
    /// delivery only ends when its future is dropped.
    pub async fn reach_and_hang(&self) -> std::convert::Infallible {
        self.announce();
        std::future::pending().await
    }

    /// In the test: waits until a body has called [`reach`](Self::reach).
    pub async fn reached(&self) {
        self.inner.reached.notified().await;
    }

    /// In the test: lets a body waiting in [`reach`](Self::reach) go on.
    pub fn release(&self) {
        self.inner.released.notify_one();
    }
}

/// Lease mode: waits until the lease on `key` in `scope` (status table `idem.idem_keys`)
/// has expired on the database's clock, the clock the protocol compares expiries with.
///
/// # Panics
///
/// When the key has no row or no lease, or the lease does not expire within a minute.
pub async fn wait_for_lease_expiry(
    pool: &PgPool,
    scope: &str,
    key: idem_runtime::key::IdempotencyKey,
) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let expired: Option<Option<bool>> = sqlx::query_scalar(
            "SELECT lease_expires_at <= now() FROM idem.idem_keys WHERE scope = $1 AND key = $2",
        )
        .bind(scope)
        .bind(key.as_uuid())
        .fetch_optional(pool)
        .await
        .expect("read the lease");
        match expired {
            Some(Some(true)) => return,
            Some(Some(false)) => {}
            Some(None) => panic!("key {key} in scope {scope} holds no lease"),
            None => panic!("key {key} in scope {scope} has no row"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease on key {key} did not expire within a minute"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
