//! The state of one runtime handle: its pool, settings, statements, cache, scopes,
//! in-flight keys and duplicate rates, and the transactions a protocol opens with them.
//!
//! The protocols (`transactional`, `batch`, `lease`) and the operator API (`admin`,
//! `retention`) run on this state; the public methods of [`Idem`] that call them are in
//! `handle`, above them.

use std::sync::Arc;

use sqlx::PgPool;

use crate::cache::CacheSlot;
use crate::config::{Config, Pooler};
use crate::duplicate_rate::DuplicateRates;
use crate::faults::FaultSlot;
use crate::handler::{CachePolicy, HandlerSpec, ResultCodec};
use crate::inflight::InFlight;
use crate::key::IdempotencyKey;
use crate::key::definition::KeyLayout;
use crate::key_transaction::KeyTransaction;
use crate::outcome::Outcome;
use crate::scope::Scopes;
use crate::store::{Existing, Statements, Status};

/// The runtime handle that idempotent handlers are called with.
///
/// Cheap to clone; share one per application. Create it with [`Idem::new`] (defaults)
/// or [`Idem::builder`], then call [`Idem::migrate`] once at start-up.
///
/// ```no_run
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
/// let idem = idem_runtime::Idem::builder(pool)
///     .schema("billing_idem")
///     .max_attempts(3)
///     .build()?;
/// idem.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Idem {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    config: Config,
    statements: Statements,
    cache: CacheSlot,
    scopes: Scopes,
    in_flight: InFlight,
    duplicate_rates: DuplicateRates,
    session_lock_timeout: tokio::sync::OnceCell<String>,
    /// The faults a test armed for this handle's next deliveries.
    faults: FaultSlot,
}

impl Idem {
    /// A handle with these settings and this cache, and fresh state.
    pub(crate) fn from_parts(pool: PgPool, config: Config, cache: CacheSlot) -> Self {
        let statements = Statements::new(&config);
        Idem {
            inner: Arc::new(Inner {
                pool,
                config,
                statements,
                cache,
                scopes: Scopes::default(),
                in_flight: InFlight::default(),
                duplicate_rates: DuplicateRates::default(),
                session_lock_timeout: tokio::sync::OnceCell::new(),
                faults: FaultSlot::default(),
            }),
        }
    }

    /// A handle over the same pool, settings and cache that shares no state of the
    /// process with this one (turns of in-flight keys, checked scopes, armed faults), as
    /// another consumer process's handle would.
    #[cfg(feature = "testing")]
    pub(crate) fn another_process(&self) -> Idem {
        let inner = &self.inner;
        Self::from_parts(
            inner.pool.clone(),
            inner.config.clone(),
            inner.cache.clone(),
        )
    }

    /// The faults a test armed for this handle's next deliveries (none without the
    /// feature `testing`).
    pub(crate) fn faults(&self) -> &FaultSlot {
        &self.inner.faults
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.inner.statements
    }

    #[cfg(feature = "redis")]
    pub(crate) fn cache(&self) -> &CacheSlot {
        &self.inner.cache
    }

    pub(crate) fn in_flight(&self) -> &InFlight {
        &self.inner.in_flight
    }

    pub(crate) fn duplicate_rates(&self) -> &DuplicateRates {
        &self.inner.duplicate_rates
    }

    /// Refuses a handler whose scope another handler owns, whose key differs from the
    /// scope's, or that was renamed or moved away from its keys (see [`crate::scope`]).
    pub(crate) async fn check_scope(
        &self,
        spec: &HandlerSpec,
        identity: &'static str,
        layout: &KeyLayout<'_>,
    ) -> Result<(), crate::scope::Error> {
        self.inner
            .scopes
            .check(self.pool(), self.statements(), spec, identity, layout)
            .await
    }

    /// The lock timeout of the pool's sessions (read once): what a handler's body runs
    /// with, after the claim ran with the configured one.
    pub(crate) async fn session_lock_timeout(&self) -> Result<&str, sqlx::Error> {
        self.inner
            .session_lock_timeout
            .get_or_try_init(|| async { self.statements().session_lock_timeout(self.pool()).await })
            .await
            .map(String::as_str)
    }

    /// The transaction of a claim: a connection from the pool inside a transaction whose
    /// lock waits are bounded by the lock timeout (one round trip), ended by idem's own
    /// statements. Cancel-safe: see [`KeyTransaction`](crate::key_transaction::KeyTransaction).
    pub(crate) async fn key_transaction(&self) -> Result<KeyTransaction, sqlx::Error> {
        KeyTransaction::begin(
            self.pool(),
            &self.statements().begin,
            self.config().pooler() == Pooler::Transaction,
        )
        .await
    }

    /// A short transaction of the runtime's own (recording a failure, a lease's steps)
    /// whose lock waits are bounded by the lock timeout.
    ///
    /// Cancel-safe: sqlx 0.8's `begin` returns a connection to the pool inside its open
    /// transaction when the future is dropped while `BEGIN` is in flight, and the pool's
    /// next user then runs inside it. The `BEGIN` runs in a task of its own: a delivery
    /// dropped meanwhile leaves the task to finish, and the transaction it opened is
    /// rolled back when the task drops it.
    pub(crate) async fn bounded_transaction(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        let pool = self.pool().clone();
        let begin = self.statements().begin.clone();
        tokio::spawn(async move { pool.begin_with(begin).await })
            .await
            .map_err(|joined| sqlx::Error::Io(std::io::Error::other(joined)))?
    }

    /// The duplicate outcome for `key` from the Redis cache, if the key is cached as
    /// succeeded with a matching fingerprint (see [`cache`](crate::cache)). `None` sends
    /// the delivery on to PostgreSQL.
    pub(crate) async fn cached<T, C: ResultCodec<T>>(
        &self,
        policy: CachePolicy,
        scope: &str,
        key: IdempotencyKey,
        fingerprint: Option<&[u8]>,
        codec: &C,
    ) -> Option<Outcome<T>> {
        let inner = &*self.inner;
        inner
            .cache
            .lookup(
                &inner.pool,
                &inner.statements,
                policy,
                scope,
                key,
                fingerprint,
                codec,
            )
            .await
    }

    /// Writes a committed success of `key` to the cache, in the background.
    pub(crate) async fn cache_success(
        &self,
        policy: CachePolicy,
        scope: &str,
        key: IdempotencyKey,
        fingerprint: Option<&[u8]>,
        result: Option<&serde_json::Value>,
    ) {
        let inner = &*self.inner;
        inner
            .cache
            .remember(
                &inner.pool,
                &inner.statements,
                policy,
                scope,
                key,
                fingerprint,
                result,
            )
            .await;
    }

    /// Writes the row that PostgreSQL answered a duplicate with to the cache, if it is a
    /// `success`.
    pub(crate) async fn cache_existing(
        &self,
        policy: CachePolicy,
        scope: &str,
        key: IdempotencyKey,
        existing: &Existing,
    ) {
        if existing.status == Status::Success {
            self.cache_success(
                policy,
                scope,
                key,
                existing.fingerprint.as_deref(),
                existing.result.as_ref(),
            )
            .await;
        }
    }
}
