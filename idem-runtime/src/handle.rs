//! The runtime handle's public API: building it ([`IdemBuilder`]), migrating its status
//! table, and the reads and changes of keys that callers make outside a handler. Its state
//! and what the protocols use of it are in `runtime`.

use std::time::Duration;

use sqlx::migrate::MigrateError;
use sqlx::{PgConnection, PgPool};

use crate::cache::CacheSlot;
use crate::config::{Config, ConfigError, Identifier};
use crate::key::IdempotencyKey;
use crate::runtime::Idem;
use crate::store::{KeyRecord, MIGRATOR};

impl Idem {
    /// A handle with the default settings (schema `idem`, 5 attempts, 5 s lock timeout).
    pub fn new(pool: PgPool) -> Self {
        Self::from_parts(pool, Config::default(), Default::default())
    }

    /// A builder to change the settings.
    pub fn builder(pool: PgPool) -> IdemBuilder {
        IdemBuilder {
            pool,
            config: Config::default(),
            schema: None,
            cache: Default::default(),
        }
    }

    /// What the Redis cache did so far (hits, misses, errors, writes, ...), or `None`
    /// without a cache ([`IdemBuilder::redis`]).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn cache_stats(&self) -> Option<crate::cache::CacheStats> {
        self.cache().stats()
    }

    /// The name of the Redis entry of `key` in `scope` (`<prefix><namespace>:<scope>:<key>`,
    /// see [`cache`](crate::cache)), or `None` without a cache or while the namespace
    /// cannot be read from PostgreSQL. Delete this entry when removing a `success` row by
    /// hand, so that the next delivery runs the body again.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn cache_entry_name(&self, scope: &str, key: IdempotencyKey) -> Option<String> {
        self.cache()
            .entry_name(self.pool(), self.statements(), scope, key)
            .await
    }

    /// Creates the schema if needed and applies the status table's migrations in it.
    ///
    /// Safe to call from every consumer at start-up, directly or through a pooler in
    /// session or transaction pooling: the migrations run in one transaction under a
    /// transaction-scoped advisory lock and are tracked in the schema's own
    /// `_sqlx_migrations` table, apart from the application's migrations (see
    /// [`migrate_schema`](crate::migrations::migrate_schema)).
    pub async fn migrate(&self) -> Result<(), MigrateError> {
        crate::store::migrate_schema(self.pool(), self.config().schema(), &MIGRATOR).await
    }

    /// The status table's row for `key` in `scope`, if any.
    pub async fn record(
        &self,
        scope: &str,
        key: IdempotencyKey,
    ) -> Result<Option<KeyRecord>, sqlx::Error> {
        let mut conn = self.pool().acquire().await?;
        self.statements()
            .record(&mut conn, scope, key.as_uuid())
            .await
    }

    /// Which of `keys` are done in `scope`, as `conn` sees the status table: `true` for a
    /// key whose row is `success` with the given payload fingerprint (or without one on
    /// either side), `false` for a key without a row, in progress, failed, parked or first
    /// applied with another payload. One answer per key, in order. The status table only:
    /// the keys of a handler with `event_time` are in the time buckets, which
    /// [`done_handler_keys`](Self::done_handler_keys) reads.
    ///
    /// Pass the connection of an open transaction (a batch handler's body, say) to see
    /// the keys that transaction claimed as well as those committed before it; a plain
    /// read: no lock, no wait, no write. This is how a Kafka adapter knows how far a
    /// batch's offsets may be stored without passing a message that is not done.
    ///
    /// ```no_run
    /// # async fn f(idem: &idem_runtime::Idem, key: idem_runtime::IdempotencyKey) -> Result<(), sqlx::Error> {
    /// let mut tx = idem.pool().begin().await?;
    /// let done = idem.done_keys(&mut tx, "apply_payment", &[(key, None)]).await?;
    /// assert_eq!(done.len(), 1);
    /// # Ok(()) }
    /// ```
    pub async fn done_keys(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        keys: &[(IdempotencyKey, Option<[u8; 32]>)],
    ) -> Result<Vec<bool>, sqlx::Error> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let uuids: Vec<uuid::Uuid> = keys.iter().map(|(key, _)| key.as_uuid()).collect();
        let fingerprints: Vec<Option<Vec<u8>>> = keys
            .iter()
            .map(|(_, fingerprint)| fingerprint.map(|digest| digest.to_vec()))
            .collect();
        self.statements()
            .done(conn, scope, &uuids, &fingerprints)
            .await
    }

    /// Un-parks a key (or clears the attempts of a failed one) so that the next delivery
    /// runs the body again. Returns whether the key was failed or parked.
    pub async fn reset(&self, scope: &str, key: IdempotencyKey) -> Result<bool, sqlx::Error> {
        let mut tx = self.bounded_transaction().await?;
        let reset = self
            .statements()
            .reset(&mut tx, scope, key.as_uuid())
            .await?;
        tx.commit().await?;
        Ok(reset)
    }

    /// Deletes the `success` keys older than the handle's retention window
    /// ([`IdemBuilder::retention`]), in bounded batches, unless another cleaner of the same
    /// status table is running: see [`retention`](crate::retention).
    ///
    /// A duplicate that arrives after its key was deleted runs its body again.
    pub async fn purge(&self) -> Result<crate::retention::PurgeReport, sqlx::Error> {
        crate::retention::purge(self, self.config().retention()).await
    }

    /// [`purge`](Self::purge) with other retention settings (e.g. an operator's window).
    pub async fn purge_with(
        &self,
        retention: &crate::retention::Retention,
    ) -> Result<crate::retention::PurgeReport, sqlx::Error> {
        crate::retention::purge(self, retention).await
    }

    /// Counts, per scope, the keys that [`purge_with`](Self::purge_with) would delete now,
    /// and the time buckets it would make ahead and drop; changes nothing
    /// ([`admin::purge_plan`](crate::admin::purge_plan) names those buckets).
    pub async fn purge_dry_run(
        &self,
        retention: &crate::retention::Retention,
    ) -> Result<crate::retention::PurgeReport, sqlx::Error> {
        crate::retention::dry_run(self, retention).await
    }

    /// Starts the retention cleanup in the background (off until called): [`purge`](Self::purge)
    /// at once, then every [`Retention::interval`](crate::retention::Retention::interval).
    /// Every instance may start it: one cleaner at a time runs, the others find the lock
    /// taken and wait for the next interval. Must be called within a Tokio runtime.
    pub fn spawn_retention(&self) -> crate::retention::RetentionTask {
        crate::retention::RetentionTask::spawn(self.clone())
    }

    /// Forgets what the database records of `scope` (see [`scope`](crate::scope)): the
    /// crate and handler that own it and what its keys are made of. The next handler that
    /// runs with the scope records its own. The scope's keys stay. For a crate renamed,
    /// for a key definition that changed without changing the keys (a key field renamed),
    /// or for a retired handler whose keys a new handler must not be taken for; call it
    /// once the old version has stopped. Returns whether the scope was recorded.
    pub async fn release_scope(&self, scope: &str) -> Result<bool, sqlx::Error> {
        self.statements().release_scope(self.pool(), scope).await
    }
}

/// Builds an [`Idem`] with settings other than the defaults.
#[derive(Debug)]
pub struct IdemBuilder {
    pool: PgPool,
    config: Config,
    schema: Option<String>,
    cache: CacheSlot,
}

impl IdemBuilder {
    /// The schema that holds the status table `idem_keys` (default `idem`). It must be a
    /// plain lowercase identifier (checked by [`IdemBuilder::build`]).
    ///
    /// The schema's `_sqlx_migrations` table tracks idem's migrations: give idem a schema
    /// of its own. In a schema whose `_sqlx_migrations` another migrator writes (`public`,
    /// where an application's `sqlx::migrate!` keeps its own), each side finds the other's
    /// versions and refuses to run (`VersionMismatch`, `VersionMissing`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Failed attempts after which a key is parked (default 5). A handler can override it
    /// with `#[idempotent(max_attempts = N)]`.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.config.max_attempts = max_attempts;
        self
    }

    /// How long a delivery waits behind another delivery's in-flight claim of the same
    /// key before it returns [`Error::InProgress`](crate::Error::InProgress) (default 5 s).
    pub fn lock_timeout(mut self, lock_timeout: Duration) -> Self {
        self.config.lock_timeout = lock_timeout;
        self
    }

    /// How often a handler transaction that hit a serialization failure or a deadlock
    /// is run again before the failure is recorded (default 3).
    pub fn transient_retries(mut self, retries: u32) -> Self {
        self.config.transient_retries = retries;
        self
    }

    /// What is stored of a failure in `last_error`: the full text, bounded (the default),
    /// or only the error's kind, where handler errors may carry personal data.
    pub fn error_texts(mut self, texts: crate::config::ErrorTexts) -> Self {
        self.config.error_texts = texts;
        self
    }

    /// How long `success` keys are kept and how the cleanup deletes them (default: 7 days,
    /// batches of 5,000). The cleanup runs only when asked: [`Idem::purge`], or
    /// [`Idem::spawn_retention`] for a background task; see [`retention`](crate::retention).
    pub fn retention(mut self, retention: crate::retention::Retention) -> Self {
        self.config.retention = retention;
        self
    }

    /// What stands between the pool and PostgreSQL (default [`Pooler::Session`]: a direct
    /// connection, or a pooler in session pooling). Behind a pooler in transaction
    /// pooling (PgBouncer's `pool_mode = transaction`), say [`Pooler::Transaction`]: idem
    /// then prepares no statement of its own and keeps nothing in a session between
    /// transactions. See the README's "Connection poolers" for the pool's settings and
    /// what a handler's own statements need there.
    ///
    /// ```no_run
    /// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{Idem, Pooler};
    /// // PgBouncer in transaction pooling, on port 6432.
    /// let pool = sqlx::PgPool::connect("postgres://app@pgbouncer:6432/app").await?;
    /// let idem = Idem::builder(pool).pooler(Pooler::Transaction).build()?;
    /// idem.migrate().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Pooler::Session`]: crate::Pooler::Session
    /// [`Pooler::Transaction`]: crate::Pooler::Transaction
    pub fn pooler(mut self, pooler: crate::config::Pooler) -> Self {
        self.config.pooler = pooler;
        self
    }

    /// Answers duplicates of succeeded keys from Redis before asking PostgreSQL; see
    /// [`cache`](crate::cache). Takes a [`RedisCache`](crate::cache::RedisCache) (URL,
    /// TTL, key prefix, timeout) or a `redis::Client`.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn redis(mut self, cache: impl Into<crate::cache::RedisCache>) -> Self {
        self.cache = CacheSlot::new(cache.into());
        self
    }

    /// Checks the settings and builds the handle.
    pub fn build(mut self) -> Result<Idem, ConfigError> {
        if let Some(schema) = self.schema.take() {
            self.config.schema = Identifier::new(&schema)?;
        }
        if self.config.max_attempts == 0 {
            return Err(ConfigError::ZeroAttempts);
        }
        Ok(Idem::from_parts(self.pool, self.config, self.cache))
    }
}
