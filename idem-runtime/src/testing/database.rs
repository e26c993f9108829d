//! A migrated runtime over a test's database, the effects a test counts, row counts and
//! leases on the database's clock.

use std::time::Duration;

use sqlx::PgPool;

use crate::key::IdempotencyKey;
use crate::{Idem, IdemBuilder};

/// A runtime handle with the default settings over `pool`, its status table migrated
/// (schema `idem`): what a test of a handler starts with.
///
/// Made for the pool that `#[sqlx::test]` hands each test, over a database of its own
/// (created from `DATABASE_URL`, with the test crate's `migrations/` applied, and dropped
/// when the test passes).
///
/// ```no_run
/// use idem_runtime::testing;
///
/// #[sqlx::test]
/// async fn ships_once(pool: sqlx::PgPool) {
///     let idem = testing::idem(pool).await;
///     // deliver messages with `&idem` ...
/// #   let _ = idem;
/// }
/// ```
///
/// # Panics
///
/// When the migration fails.
pub async fn idem(pool: PgPool) -> Idem {
    idem_with(Idem::builder(pool)).await
}

/// [`idem`] with other settings: a schema, `max_attempts`, a lock timeout, a Redis cache.
///
/// ```no_run
/// use std::time::Duration;
/// use idem_runtime::{Idem, testing};
///
/// # async fn test(pool: sqlx::PgPool) {
/// let idem = testing::idem_with(
///     Idem::builder(pool)
///         .schema("billing_idem")
///         .max_attempts(3)
///         .lock_timeout(Duration::from_secs(1)),
/// )
/// .await;
/// # let _ = idem; }
/// ```
///
/// # Panics
///
/// When the settings are refused ([`IdemBuilder::build`]) or the migration fails.
pub async fn idem_with(builder: IdemBuilder) -> Idem {
    let idem = builder
        .build()
        .unwrap_or_else(|error| panic!("build the runtime handle: {error}"));
    idem.migrate()
        .await
        .unwrap_or_else(|error| panic!("migrate the status table: {error}"));
    idem
}

/// `n` handles over the pool and settings of `idem` that share no state of the process
/// with it or with each other, as the handles of `n` consumer processes would.
///
/// Deliveries of one key through one handle take turns inside the process; through
/// these handles they meet in PostgreSQL, as deliveries on two machines do. Faults
/// armed with [`inject`](super::inject) on `idem` do not reach them.
///
/// ```no_run
/// # use idem_runtime::{Idem, Outcome, Error};
/// # async fn ship(idem: &Idem, order: &str) -> Result<Outcome<()>, Error<std::io::Error>> { todo!() }
/// # async fn test(idem: Idem) {
/// use idem_runtime::testing;
///
/// let processes = testing::processes(&idem, 4);
/// let report = testing::race(4, |i| ship(&processes[i], "o-1")).await;
/// assert_eq!(report.executed(), 1);
/// # }
/// ```
pub fn processes(idem: &Idem, n: usize) -> Vec<Idem> {
    (0..n).map(|_| idem.another_process()).collect()
}

/// How a test counts the effects of its handler: a query that returns one integer, such
/// as `SELECT count(*) FROM shipments`.
///
/// The assertions of this module count before and after the deliveries they make, and
/// check that the count rose by exactly one per message. Count what a delivery must do
/// once: rows of the handler's own tables, calls recorded by a stand-in for an external
/// service.
///
/// ```no_run
/// # async fn test(pool: sqlx::PgPool) {
/// use idem_runtime::testing::Effects;
///
/// let shipments = Effects::query("SELECT count(*) FROM shipments");
/// assert_eq!(shipments.count(&pool).await, 0);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effects {
    query: String,
}

impl Effects {
    /// Effects counted by `query`, a `SELECT` that returns one row of one integer (of
    /// any integer type; `count(*)` is one).
    pub fn query(query: impl Into<String>) -> Self {
        Effects {
            query: query.into(),
        }
    }

    /// The query, as given.
    pub fn as_str(&self) -> &str {
        &self.query
    }

    /// Counts the committed effects now.
    ///
    /// # Panics
    ///
    /// When the query fails or does not return one integer.
    pub async fn count(&self, pool: &PgPool) -> i64 {
        let query = self.query.trim().trim_end_matches(';');
        let counted: Option<i64> = count(pool, &format!("SELECT ({query})::bigint"))
            .await
            .unwrap_or_else(|error| panic!("count the effects with {query:?}: {error}"));
        counted.unwrap_or_else(|| panic!("the effects query {query:?} returned NULL"))
    }
}

/// The number of committed rows in `table` (`name` or `schema.name`).
///
/// ```no_run
/// # async fn test(pool: sqlx::PgPool) {
/// assert_eq!(idem_runtime::testing::count_rows(&pool, "idem.idem_keys").await, 0);
/// # }
/// ```
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
    count(pool, &format!("SELECT count(*) FROM {table}"))
        .await
        .unwrap_or_else(|error| panic!("count the rows of {table}: {error}"))
        .unwrap_or_default()
}

/// The one integer that `sql` returns, by the simple query protocol: one round trip and
/// no prepared statement, which a transaction pooler would lose (PgBouncer in transaction
/// pooling hands the next statement to another server connection).
async fn count(pool: &PgPool, sql: &str) -> Result<Option<i64>, sqlx::Error> {
    use sqlx::Row as _;
    sqlx::raw_sql(sql).fetch_one(pool).await?.try_get(0)
}

/// Lease mode: waits until the lease on `key` in `scope` (in the status table of `idem`,
/// or in its time buckets for a handler with `event_time`) has expired on the database's
/// clock, the clock the protocol compares expiries with.
///
/// ```no_run
/// # async fn test(idem: idem_runtime::Idem, key: idem_runtime::IdempotencyKey) {
/// // A worker claimed `key` and vanished; the next delivery may claim it after this.
/// idem_runtime::testing::wait_for_lease_expiry(&idem, "mail::send_receipt", key).await;
/// # }
/// ```
///
/// # Panics
///
/// When the key has no row or no lease, or the lease does not expire within a minute.
pub async fn wait_for_lease_expiry(idem: &Idem, scope: &str, key: IdempotencyKey) {
    // `None`: the row holds no lease.
    wait_for_lease(idem, scope, key, |_, expired| expired, "had not expired").await;
}

/// Lease mode: waits until the key's row no longer holds a live lease: its lease expired
/// on the database's clock, or its worker settled it. A dropped delivery's last statement
/// may still be on its way to the server when a test looks: its completion can land
/// after the test saw `processing`.
///
/// # Panics
///
/// When the key has no row, or still holds a live lease after a minute.
pub(crate) async fn wait_until_lease_settles(idem: &Idem, scope: &str, key: IdempotencyKey) {
    wait_for_lease(
        idem,
        scope,
        key,
        |status, expired| Some(status != "processing" || expired.unwrap_or(true)),
        "was still held",
    )
    .await;
}

/// Polls the key's row until `condition` over its status and whether its lease expired
/// (`None`: no lease) holds; a `None` answer means the row holds no lease.
async fn wait_for_lease(
    idem: &Idem,
    scope: &str,
    key: IdempotencyKey,
    condition: impl Fn(&str, Option<bool>) -> Option<bool>,
    still: &str,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done: Option<Option<bool>> = idem
            .statements()
            .lease_state(idem.pool(), scope, key.as_uuid())
            .await
            .expect("read the lease")
            .map(|(status, expired)| condition(&status, expired));
        match done {
            Some(Some(true)) => return,
            Some(Some(false)) => {}
            Some(None) => panic!("key {key} in scope {scope} holds no lease"),
            None => panic!("key {key} in scope {scope} has no row"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease on key {key} in scope {scope} {still} after a minute"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
