//! Helpers for tests of idempotent handlers (feature `testing`): checkpoints that pause a
//! handler body where a test wants it, row counts, and waiting for a lease to expire on
//! the database's clock.
//!
//! ```no_run
//! # async fn test(idem: idem_runtime::Idem) {
//! use idem_runtime::testing::{self, Checkpoint};
//!
//! let in_body = Checkpoint::new();
//! // A handler body calls `in_body.reach().await`; meanwhile the test looks at the
//! // database with the body's transaction open, then lets the body go on.
//! in_body.reached().await;
//! assert_eq!(testing::count_rows(idem.pool(), "idem.idem_keys").await, 1);
//! in_body.release();
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;

use crate::Idem;
use crate::key::IdempotencyKey;

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

/// Lease mode: waits until the lease on `key` in `scope` (in the status table of `idem`)
/// has expired on the database's clock, the clock the protocol compares expiries with.
///
/// # Panics
///
/// When the key has no row or no lease, or the lease does not expire within a minute.
pub async fn wait_for_lease_expiry(idem: &Idem, scope: &str, key: IdempotencyKey) {
    let statement = format!(
        "SELECT lease_expires_at <= now() FROM {}.idem_keys WHERE scope = $1 AND key = $2",
        idem.config().schema().as_str()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let expired: Option<Option<bool>> = sqlx::query_scalar(&statement)
            .bind(scope)
            .bind(key.as_uuid())
            .fetch_optional(idem.pool())
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
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
