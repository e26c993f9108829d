//! The Redis cache of succeeded keys (cargo feature `redis`).
//!
//! A burst of redeliveries (a consumer group rebalance, a producer retrying) asks about
//! keys that have just succeeded. With a cache set up on the runtime handle
//! (`IdemBuilder::redis`, with the feature), such a duplicate is answered from
//! Redis without touching PostgreSQL, which stays the only source of truth:
//!
//! - every delivery looks its key up in Redis first (`GET <prefix><namespace>:<scope>:<key>`);
//!   an entry means "this key has succeeded": the delivery returns
//!   [`Outcome::Duplicate`] with the result stored in the entry, and the body does not run;
//! - only a committed success is written (`SET ... PX <ttl>`), after the commit, and when
//!   PostgreSQL answers a duplicate with a `success` row (warming the cache for the next
//!   one). A key that is in progress, failed or parked is never written. The write runs
//!   on a task of its own: the delivery returns without waiting for Redis, so a duplicate
//!   that arrives within that instant may still be answered by PostgreSQL;
//! - the entry holds the payload fingerprint: a delivery whose fingerprint differs is
//!   passed on to PostgreSQL, which answers [`Error::PayloadMismatch`](crate::Error::PayloadMismatch);
//! - Redis being down, slow or holding something unreadable never fails a delivery:
//!   every call is bounded by a short timeout and the delivery falls back to PostgreSQL.
//!   After a connection failure or a timeout, Redis is left alone for a short while
//!   (deliveries go straight to PostgreSQL, counted as `skipped`), then one delivery
//!   probes it again; the connection is re-established by itself;
//! - entries expire after the TTL (default 10 minutes, a little above a typical retry
//!   window); an expired or evicted entry only means that PostgreSQL answers again.
//!
//! - the namespace (16 hex digits) identifies the status table: a digest of a random id
//!   that the migrations store in its schema, of the database's name and of the schema. So
//!   handles on other databases or schemas (tenants, staging beside production) that
//!   share one Redis, even with the same prefix, never answer each other's keys. A copy of
//!   the database restored under the same name shares the id: give the copy's handles
//!   another [`prefix`](RedisCache::prefix) when both use one Redis;
//!
//! A handler can opt out, or keep its entries for another time, with
//! `#[idempotent(cache = false)]` or `#[idempotent(cache_ttl = "30m")]`; these arguments
//! need the `redis` feature, and without it they are a compile error that says so.
//!
//! Because an entry is final for its TTL, removing a `success` row by hand (to run a
//! key's body again) must also delete its entry from Redis
//! ([`Idem::cache_entry_name`](crate::Idem::cache_entry_name) names it), or wait for the TTL. [`Idem::reset`](crate::Idem::reset) does not concern cached keys: it only
//! applies to failed and parked keys, which are never cached.

use std::time::Duration;

use crate::Idem;
use crate::handler::ResultCodec;
use crate::key::IdempotencyKey;
use crate::outcome::Outcome;
use crate::store::Existing;

/// How one handler uses the runtime handle's Redis cache.
///
/// `#[idempotent]` passes [`CachePolicy::Inherit`] unless the handler says otherwise with
/// `cache = false` ([`CachePolicy::Off`]) or `cache_ttl = "..."` ([`CachePolicy::Ttl`]).
/// Without a cache on the handle, every policy means "no cache".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Use the handle's cache, with its TTL.
    #[default]
    Inherit,
    /// Neither read nor write the cache for this handler.
    Off,
    /// Use the handle's cache, with this TTL for this handler's entries.
    Ttl(Duration),
}

/// A handler-level cache argument of `#[idempotent]`. Implemented only with the `redis`
/// feature, so that using such an argument without it is a compile error naming it.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`cache` and `cache_ttl` in #[idempotent] need the `redis` feature of idem-runtime",
    label = "this argument configures the Redis cache of duplicates",
    note = "enable the feature in Cargo.toml: `idem-runtime = {{ version = \"0.1\", features = [\"redis\"] }}`, or remove the argument"
)]
pub trait HandlerCacheOption {
    /// The policy the argument stands for.
    fn policy(self) -> CachePolicy;
}

/// `cache = true | false`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct CacheSwitch(pub bool);

/// `cache_ttl = "..."`, in milliseconds.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct CacheTtlMillis(pub u64);

#[cfg(feature = "redis")]
impl HandlerCacheOption for CacheSwitch {
    fn policy(self) -> CachePolicy {
        if self.0 {
            CachePolicy::Inherit
        } else {
            CachePolicy::Off
        }
    }
}

#[cfg(feature = "redis")]
impl HandlerCacheOption for CacheTtlMillis {
    fn policy(self) -> CachePolicy {
        CachePolicy::Ttl(Duration::from_millis(self.0))
    }
}

/// The policy of a handler-level cache argument (what `#[idempotent]` generates a call of).
#[doc(hidden)]
pub fn handler_cache<O: HandlerCacheOption>(option: O) -> CachePolicy {
    option.policy()
}

/// The cache of a runtime handle, if one is set up.
#[derive(Debug, Default)]
pub(crate) struct CacheSlot {
    #[cfg(feature = "redis")]
    cache: Option<std::sync::Arc<Cache>>,
}

#[cfg(feature = "redis")]
impl CacheSlot {
    pub(crate) fn new(settings: RedisCache) -> Self {
        CacheSlot {
            cache: Some(std::sync::Arc::new(Cache::new(settings))),
        }
    }

    pub(crate) fn stats(&self) -> Option<CacheStats> {
        self.cache.as_deref().map(Cache::stats)
    }

    pub(crate) async fn entry_name(
        &self,
        idem: &Idem,
        scope: &str,
        key: IdempotencyKey,
    ) -> Option<String> {
        let cache = self.cache.as_ref()?;
        let instance = cache.instance(idem).await?;
        Some(cache.name(instance, scope, key))
    }

    /// The cache and the TTL of its entries under `policy`, if the cache is in use.
    fn active(&self, policy: CachePolicy) -> Option<(&std::sync::Arc<Cache>, Duration)> {
        let cache = self.cache.as_ref()?;
        match policy {
            CachePolicy::Inherit => Some((cache, cache.settings.ttl)),
            CachePolicy::Ttl(ttl) => Some((cache, ttl)),
            CachePolicy::Off => None,
        }
    }
}

/// The duplicate outcome for `key` from the cache, if the key is cached as succeeded with
/// a matching fingerprint. `None` sends the delivery on to PostgreSQL.
pub(crate) async fn lookup<T, C: ResultCodec<T>>(
    idem: &Idem,
    policy: CachePolicy,
    scope: &str,
    key: IdempotencyKey,
    fingerprint: Option<&[u8]>,
    codec: &C,
) -> Option<Outcome<T>> {
    #[cfg(feature = "redis")]
    if let Some((cache, _)) = idem.cache().active(policy) {
        let instance = cache.instance(idem).await?;
        return cache.lookup(instance, scope, key, fingerprint, codec).await;
    }
    #[cfg(not(feature = "redis"))]
    let _ = (idem.cache(), policy, scope, key, fingerprint, codec);
    None
}

/// Writes a committed success of `key` to the cache, in the background: the delivery
/// does not wait for Redis. Never fails: a write that does not happen only means that the
/// next duplicate asks PostgreSQL.
pub(crate) async fn remember(
    idem: &Idem,
    policy: CachePolicy,
    scope: &str,
    key: IdempotencyKey,
    fingerprint: Option<&[u8]>,
    result: Option<&serde_json::Value>,
) {
    #[cfg(feature = "redis")]
    if let Some((cache, ttl)) = idem.cache().active(policy)
        && let Some(instance) = cache.instance(idem).await
    {
        cache.store(instance, ttl, scope, key, fingerprint, result);
    }
    #[cfg(not(feature = "redis"))]
    let _ = (idem.cache(), policy, scope, key, fingerprint, result);
}

/// Writes the row that PostgreSQL answered a duplicate with, if it is a `success`.
pub(crate) async fn remember_existing(
    idem: &Idem,
    policy: CachePolicy,
    scope: &str,
    key: IdempotencyKey,
    existing: &Existing,
) {
    if existing.status == crate::store::Status::Success {
        remember(
            idem,
            policy,
            scope,
            key,
            existing.fingerprint.as_deref(),
            existing.result.as_ref(),
        )
        .await;
    }
}

#[cfg(feature = "redis")]
pub use with_redis::{CacheStats, RedisCache};

/// The `redis` crate, as idem-runtime uses it (to build a [`RedisCache`] from a client or
/// connection manager of the same version).
#[cfg(feature = "redis")]
pub use redis;

#[cfg(feature = "redis")]
use with_redis::Cache;

#[cfg(feature = "redis")]
mod with_redis {
    use std::fmt;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, OnceLock};
    use std::time::{Duration, Instant};

    use redis::aio::{ConnectionManager, ConnectionManagerConfig};
    use redis::{Client, FromRedisValue, RedisError};
    use serde::{Deserialize, Serialize};

    use crate::handler::ResultCodec;
    use crate::key::IdempotencyKey;
    use crate::outcome::Outcome;

    /// The settings of the Redis cache of a runtime handle; give it to
    /// [`IdemBuilder::redis`](crate::IdemBuilder::redis).
    ///
    /// Creating it does not connect: the connection is made on first use, and a Redis
    /// that is down at start-up only means that PostgreSQL answers until it is up.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use idem_runtime::{Idem, cache::RedisCache};
    ///
    /// # async fn start(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let cache = RedisCache::from_url("redis://127.0.0.1:6379")?
    ///     .prefix("billing:idem:")          // default "idem:"
    ///     .ttl(Duration::from_secs(15 * 60)) // default 10 minutes
    ///     .timeout(Duration::from_millis(50)); // default 100 ms
    /// let idem = Idem::builder(pool).redis(cache).build()?;
    /// idem.migrate().await?;
    /// // ... deliver messages; duplicates of succeeded keys are answered from Redis.
    /// println!("{:?}", idem.cache_stats());
    /// # Ok(()) }
    /// ```
    #[derive(Clone)]
    pub struct RedisCache {
        source: Source,
        pub(super) ttl: Duration,
        prefix: String,
        secret: Option<Vec<u8>>,
        timeout: Duration,
        retry_after: Duration,
    }

    #[derive(Clone)]
    enum Source {
        // Boxed: with TLS (feature `redis-tls`) a client is some 240 bytes.
        Client(Box<Client>),
        Manager(ConnectionManager),
    }

    impl RedisCache {
        /// The default TTL of an entry: 10 minutes, a little above a typical retry window.
        pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
        /// The default prefix of the entries' names.
        pub const DEFAULT_PREFIX: &'static str = "idem:";
        /// The default bound of one call to Redis.
        pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);
        /// The default time Redis is left alone after it failed.
        pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

        /// A cache over `client` (connected on first use, with the timeouts of this cache).
        pub fn new(client: Client) -> Self {
            Self::with_source(Source::Client(Box::new(client)))
        }

        /// A cache over an existing connection manager (its reconnection settings stay as
        /// they are; every call is still bounded by [`RedisCache::timeout`]).
        pub fn with_manager(manager: ConnectionManager) -> Self {
            Self::with_source(Source::Manager(manager))
        }

        /// A cache at `url` (`redis://host:port/db`; `rediss://` over TLS with the feature
        /// `redis-tls`, the server's certificate checked against the Mozilla roots: for a
        /// private CA, give [`RedisCache::new`] a client from
        /// `redis::Client::build_with_tls`). Parses the URL; does not connect.
        pub fn from_url(url: &str) -> Result<Self, RedisError> {
            Client::open(url).map(Self::new)
        }

        fn with_source(source: Source) -> Self {
            RedisCache {
                source,
                ttl: Self::DEFAULT_TTL,
                prefix: Self::DEFAULT_PREFIX.to_owned(),
                secret: None,
                timeout: Self::DEFAULT_TIMEOUT,
                retry_after: Self::DEFAULT_RETRY_AFTER,
            }
        }

        /// How long an entry lives (default 10 minutes). Choose a little more than the
        /// longest window in which a message is redelivered; a handler can set its own
        /// with `#[idempotent(cache_ttl = "...")]`.
        pub fn ttl(mut self, ttl: Duration) -> Self {
            self.ttl = ttl;
            self
        }

        /// The prefix of the entries' names, `<prefix><namespace>:<scope>:<key>` (default
        /// `idem:`). Handles on other databases or schemas never share entries, whatever
        /// their prefix (see the [module docs](crate::cache)).
        pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
            self.prefix = prefix.into();
            self
        }

        /// The secret that signs the entries, instead of the one the migrations store in
        /// the status table's schema (`idem_instance.cache_secret`). At least 32 bytes of
        /// a secret source; handles of one status table must use the same.
        pub fn secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
            self.secret = Some(secret.into());
            self
        }

        /// The bound of one call to Redis, connecting included (default 100 ms). A call
        /// that takes longer is abandoned and the delivery asks PostgreSQL.
        pub fn timeout(mut self, timeout: Duration) -> Self {
            self.timeout = timeout;
            self
        }

        /// After a connection failure or a timeout, how long deliveries skip Redis before
        /// one of them tries it again (default 1 s).
        pub fn retry_after(mut self, retry_after: Duration) -> Self {
            self.retry_after = retry_after;
            self
        }
    }

    impl From<Client> for RedisCache {
        fn from(client: Client) -> Self {
            RedisCache::new(client)
        }
    }

    impl From<ConnectionManager> for RedisCache {
        fn from(manager: ConnectionManager) -> Self {
            RedisCache::with_manager(manager)
        }
    }

    impl fmt::Debug for RedisCache {
        // Not the client: its connection info can hold a password.
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("RedisCache")
                .field("ttl", &self.ttl)
                .field("prefix", &self.prefix)
                .field("timeout", &self.timeout)
                .field("retry_after", &self.retry_after)
                .field("secret", &self.secret.as_ref().map(|_| "<given>"))
                .finish_non_exhaustive()
        }
    }

    /// What the cache of a runtime handle did since it was built
    /// ([`Idem::cache_stats`](crate::Idem::cache_stats)).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct CacheStats {
        /// Deliveries answered from Redis (PostgreSQL not queried).
        pub hits: u64,
        /// Look-ups that found no entry, or one with another payload fingerprint.
        pub misses: u64,
        /// Look-ups that failed: timeout, connection error, error reply, unreadable entry.
        /// The delivery asked PostgreSQL.
        pub errors: u64,
        /// Look-ups and writes not attempted because Redis failed shortly before.
        pub skipped: u64,
        /// Successes written to Redis.
        pub writes: u64,
        /// Writes that failed (harmless: the next duplicate asks PostgreSQL).
        pub write_errors: u64,
        /// Entries whose signature did not verify: written by someone without the secret
        /// (or under a rotated one). Each is a miss: the delivery asked PostgreSQL.
        pub forged: u64,
    }

    #[derive(Default)]
    struct Counters {
        forged: AtomicU64,
        hits: AtomicU64,
        misses: AtomicU64,
        errors: AtomicU64,
        skipped: AtomicU64,
        writes: AtomicU64,
        write_errors: AtomicU64,
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The live cache of a runtime handle.
    pub(crate) struct Cache {
        pub(super) settings: RedisCache,
        /// The status table's identity and signing secret (see [`Cache::instance`]),
        /// read once.
        instance: tokio::sync::OnceCell<Instance>,
        manager: OnceLock<ConnectionManager>,
        /// Milliseconds since `epoch` until which Redis is skipped; 0 while it is healthy.
        down_until: AtomicU64,
        epoch: Instant,
        counters: Counters,
    }

    impl fmt::Debug for Cache {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Cache")
                .field("settings", &self.settings)
                .field("stats", &self.stats())
                .finish_non_exhaustive()
        }
    }

    /// Why a call to Redis gave no answer.
    enum Failure {
        /// No reply within the timeout.
        Timeout,
        /// A connection error, or an error reply.
        Redis(RedisError),
    }

    impl fmt::Display for Failure {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Failure::Timeout => f.write_str("no reply within the timeout"),
                Failure::Redis(error) => write!(f, "{error}"),
            }
        }
    }

    /// The status table behind a cache: the namespace of its entries and their signing key.
    pub(crate) struct Instance {
        identity: String,
        namespace: String,
        secret: Vec<u8>,
    }

    type Mac = hmac::Hmac<sha2::Sha256>;

    impl Instance {
        fn new(identity: String, secret: Vec<u8>) -> Self {
            use sha2::{Digest, Sha256};
            // 16 hex digits of the SHA-256 of the identity.
            let namespace = hex::encode(&Sha256::digest(identity.as_bytes())[..8]);
            Instance {
                identity,
                namespace,
                secret,
            }
        }

        /// HMAC-SHA256 over everything the entry asserts: the status table (its identity),
        /// the scope, the key, the fingerprint and the result, each length-prefixed.
        fn mac(
            &self,
            scope: &str,
            key: IdempotencyKey,
            fingerprint: Option<&[u8]>,
            result: Option<&serde_json::Value>,
        ) -> Mac {
            use hmac::Mac as _;
            let mut mac = Mac::new_from_slice(&self.secret).expect("HMAC takes keys of any length");
            let result = result.map(serde_json::Value::to_string);
            let key = key.as_uuid();
            let parts: [Option<&[u8]>; 5] = [
                Some(self.identity.as_bytes()),
                Some(scope.as_bytes()),
                Some(key.as_bytes()),
                fingerprint,
                result.as_deref().map(str::as_bytes),
            ];
            mac.update(b"idem cache entry v2");
            for part in parts {
                match part {
                    Some(bytes) => {
                        mac.update(&[1]);
                        mac.update(&(bytes.len() as u64).to_be_bytes());
                        mac.update(bytes);
                    }
                    None => mac.update(&[0]),
                }
            }
            mac
        }

        fn sign(
            &self,
            scope: &str,
            key: IdempotencyKey,
            fingerprint: Option<&[u8]>,
            result: Option<&serde_json::Value>,
        ) -> Vec<u8> {
            use hmac::Mac as _;
            self.mac(scope, key, fingerprint, result)
                .finalize()
                .into_bytes()
                .to_vec()
        }

        fn verifies(&self, scope: &str, key: IdempotencyKey, entry: &Entry) -> bool {
            use hmac::Mac as _;
            let mac = self.mac(
                scope,
                key,
                entry.fingerprint.as_deref(),
                entry.result.as_ref(),
            );
            // Constant time.
            mac.verify_slice(&entry.signature).is_ok()
        }
    }

    /// A connection-level failure: the server may be gone, so it is left alone a while.
    fn is_connection_error(error: &RedisError) -> bool {
        error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
    }

    impl Cache {
        pub(super) fn new(settings: RedisCache) -> Self {
            let manager = OnceLock::new();
            if let Source::Manager(existing) = &settings.source {
                let _ = manager.set(existing.clone());
            }
            Cache {
                settings,
                instance: tokio::sync::OnceCell::new(),
                manager,
                down_until: AtomicU64::new(0),
                epoch: Instant::now(),
                counters: Counters::default(),
            }
        }

        pub(super) fn stats(&self) -> CacheStats {
            let c = &self.counters;
            let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
            CacheStats {
                hits: get(&c.hits),
                misses: get(&c.misses),
                errors: get(&c.errors),
                skipped: get(&c.skipped),
                writes: get(&c.writes),
                write_errors: get(&c.write_errors),
                forged: get(&c.forged),
            }
        }

        /// The status table this handle's entries belong to: its identity (a random id
        /// that the migrations store in its schema, the database's name and the schema),
        /// the namespace derived from it, so that handles on other databases or schemas
        /// never read each other's entries from a shared Redis, and the secret that signs
        /// the entries. Read from PostgreSQL on first use; `None` (no cache for this
        /// delivery) while it cannot be read.
        pub(super) async fn instance(&self, idem: &crate::Idem) -> Option<&Instance> {
            let read = self.instance.get_or_try_init(|| async {
                let (identity, stored_secret): (String, Vec<u8>) =
                    sqlx::query_as(&idem.statements().instance)
                        .fetch_one(idem.pool())
                        .await?;
                let secret = self.settings.secret.clone().unwrap_or(stored_secret);
                Ok::<_, sqlx::Error>(Instance::new(identity, secret))
            });
            match read.await {
                Ok(instance) => Some(instance),
                Err(error) => {
                    bump(&self.counters.skipped);
                    crate::telemetry::cache("idem_cache_lookups_total", "skipped");
                    tracing::debug!(%error, "the cache namespace could not be read; asking PostgreSQL");
                    None
                }
            }
        }

        /// `<prefix><namespace>:<scope>:<key>`. The namespace and the key have a fixed
        /// length, so the name is unambiguous.
        pub(super) fn name(&self, instance: &Instance, scope: &str, key: IdempotencyKey) -> String {
            format!(
                "{}{}:{scope}:{key}",
                self.settings.prefix, instance.namespace
            )
        }

        pub(super) async fn lookup<T, C: ResultCodec<T>>(
            &self,
            instance: &Instance,
            scope: &str,
            key: IdempotencyKey,
            fingerprint: Option<&[u8]>,
            codec: &C,
        ) -> Option<Outcome<T>> {
            if !self.admit() {
                bump(&self.counters.skipped);
                crate::telemetry::cache("idem_cache_lookups_total", "skipped");
                return None;
            }
            let name = self.name(instance, scope, key);
            let mut get = redis::cmd("GET");
            get.arg(&name);
            let entry = match self.call::<Option<Vec<u8>>>(&get).await {
                Ok(Some(bytes)) => bytes,
                Ok(None) => {
                    bump(&self.counters.misses);
                    crate::telemetry::cache("idem_cache_lookups_total", "miss");
                    return None;
                }
                Err(failure) => {
                    bump(&self.counters.errors);
                    crate::telemetry::cache("idem_cache_lookups_total", "error");
                    tracing::debug!(%key, scope, error = %failure, "redis cache look-up failed; asking PostgreSQL");
                    return None;
                }
            };
            let Some(entry) = Entry::decode(&entry) else {
                bump(&self.counters.errors);
                crate::telemetry::cache("idem_cache_lookups_total", "error");
                tracing::warn!(
                    name,
                    "unreadable redis cache entry (not written by this version of idem?); asking PostgreSQL"
                );
                return None;
            };
            if !instance.verifies(scope, key, &entry) {
                // Not written by a handle of this status table: never a reason to skip.
                bump(&self.counters.forged);
                crate::telemetry::cache("idem_cache_lookups_total", "forged");
                tracing::warn!(
                    name,
                    "redis cache entry with a signature that does not verify; asking PostgreSQL"
                );
                return None;
            }
            let mismatch =
                crate::key::fingerprints_differ(fingerprint, entry.fingerprint.as_deref());
            if mismatch {
                // PostgreSQL answers with the payload mismatch.
                bump(&self.counters.misses);
                crate::telemetry::cache("idem_cache_lookups_total", "miss");
                return None;
            }
            match codec.decode(entry.result) {
                Ok(value) => {
                    bump(&self.counters.hits);
                    crate::telemetry::cache("idem_cache_lookups_total", "hit");
                    Some(Outcome::Duplicate(value))
                }
                Err(error) => {
                    bump(&self.counters.errors);
                    crate::telemetry::cache("idem_cache_lookups_total", "error");
                    tracing::warn!(name, %error, "the cached result does not decode as the handler's result type; asking PostgreSQL");
                    None
                }
            }
        }

        /// Sends the entry of a succeeded key on a task of its own (bounded by the timeout
        /// like every call), so that the delivery that succeeded does not wait for Redis.
        pub(super) fn store(
            self: &Arc<Self>,
            instance: &Instance,
            ttl: Duration,
            scope: &str,
            key: IdempotencyKey,
            fingerprint: Option<&[u8]>,
            result: Option<&serde_json::Value>,
        ) {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                bump(&self.counters.skipped);
                crate::telemetry::cache("idem_cache_writes_total", "skipped");
                return;
            };
            if !self.admit() {
                bump(&self.counters.skipped);
                crate::telemetry::cache("idem_cache_writes_total", "skipped");
                return;
            }
            let ttl_millis = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
            let mut set = redis::cmd("SET");
            set.arg(self.name(instance, scope, key))
                .arg(Entry::encode(instance, scope, key, fingerprint, result))
                .arg("PX")
                .arg(ttl_millis);
            let cache = Arc::clone(self);
            let scope = scope.to_owned();
            runtime.spawn(async move {
                match cache.call::<()>(&set).await {
                    Ok(()) => {
                        bump(&cache.counters.writes);
                        crate::telemetry::cache("idem_cache_writes_total", "ok");
                    }
                    Err(failure) => {
                        bump(&cache.counters.write_errors);
                        crate::telemetry::cache("idem_cache_writes_total", "error");
                        tracing::debug!(%key, scope, error = %failure, "redis cache write failed (harmless: PostgreSQL has the key)");
                    }
                }
            });
        }

        /// One command, bounded by the timeout. A connection error is retried once within
        /// the same bound: the first call after a lost connection is what makes the
        /// connection manager reconnect.
        async fn call<T: FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, Failure> {
            let attempt = async {
                let mut connection = self.connection()?;
                match command.query_async::<T>(&mut connection).await {
                    Err(error) if is_connection_error(&error) => {
                        command.query_async::<T>(&mut connection).await
                    }
                    other => other,
                }
            };
            match tokio::time::timeout(self.settings.timeout, attempt).await {
                Ok(Ok(value)) => {
                    self.healthy();
                    Ok(value)
                }
                Ok(Err(error)) => {
                    if is_connection_error(&error) {
                        self.failed(&error);
                    } else {
                        // The server answered (an error reply): it is up.
                        self.healthy();
                    }
                    Err(Failure::Redis(error))
                }
                Err(_elapsed) => {
                    self.failed(&Failure::Timeout);
                    Err(Failure::Timeout)
                }
            }
        }

        /// The connection manager, created on first use (inside the caller's runtime).
        fn connection(&self) -> Result<ConnectionManager, RedisError> {
            if let Some(manager) = self.manager.get() {
                return Ok(manager.clone());
            }
            let Source::Client(client) = &self.settings.source else {
                unreachable!("a cache over a connection manager holds it from the start");
            };
            // One connection attempt per call: the breaker below paces the attempts.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.settings.timeout))
                .set_response_timeout(Some(self.settings.timeout))
                .set_number_of_retries(0);
            let manager = ConnectionManager::new_lazy_with_config(Client::clone(client), config)?;
            Ok(self.manager.get_or_init(|| manager).clone())
        }

        fn now_millis(&self) -> u64 {
            u64::try_from(self.epoch.elapsed().as_millis())
                .unwrap_or(u64::MAX)
                .saturating_add(1)
        }

        fn retry_after_millis(&self) -> u64 {
            u64::try_from(self.settings.retry_after.as_millis()).unwrap_or(u64::MAX)
        }

        /// Whether to call Redis now: always while it is healthy; after a failure, only
        /// the first caller once `retry_after` has passed (it probes; the others skip).
        fn admit(&self) -> bool {
            let until = self.down_until.load(Ordering::Acquire);
            if until == 0 {
                return true;
            }
            let now = self.now_millis();
            if now < until {
                return false;
            }
            let next = now.saturating_add(self.retry_after_millis());
            self.down_until
                .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        }

        fn healthy(&self) {
            if self.down_until.load(Ordering::Acquire) != 0
                && self.down_until.swap(0, Ordering::AcqRel) != 0
            {
                tracing::info!("redis cache reachable again");
            }
        }

        fn failed(&self, error: &dyn fmt::Display) {
            let until = self.now_millis().saturating_add(self.retry_after_millis());
            if self.down_until.swap(until, Ordering::AcqRel) == 0 {
                tracing::warn!(
                    %error,
                    retry_after = ?self.settings.retry_after,
                    "redis cache unavailable; deliveries ask PostgreSQL until it is back"
                );
            }
        }
    }

    /// An entry: the key succeeded, with this fingerprint and this stored result, signed.
    ///
    /// JSON, readable with `redis-cli`: `{"v":2,"fp":"<hex>","r":<result>,"mac":"<hex>"}`;
    /// `fp` and `r` are left out when there is none. `mac` is the HMAC-SHA256 of the
    /// status table's identity, the scope, the key, the fingerprint and the result.
    pub(super) struct Entry {
        pub fingerprint: Option<Vec<u8>>,
        pub result: Option<serde_json::Value>,
        pub signature: Vec<u8>,
    }

    const ENTRY_VERSION: u8 = 2;

    #[derive(Serialize)]
    struct EntryOut<'a> {
        v: u8,
        #[serde(skip_serializing_if = "Option::is_none")]
        fp: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        r: Option<&'a serde_json::Value>,
        mac: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct EntryIn {
        v: u8,
        #[serde(default)]
        fp: Option<String>,
        #[serde(default)]
        r: Option<serde_json::Value>,
        #[serde(default)]
        mac: String,
    }

    impl Entry {
        pub(super) fn encode(
            instance: &Instance,
            scope: &str,
            key: IdempotencyKey,
            fingerprint: Option<&[u8]>,
            result: Option<&serde_json::Value>,
        ) -> Vec<u8> {
            let entry = EntryOut {
                v: ENTRY_VERSION,
                fp: fingerprint.map(hex::encode),
                r: result,
                mac: hex::encode(instance.sign(scope, key, fingerprint, result)),
            };
            serde_json::to_vec(&entry).expect("a JSON value always serializes")
        }

        /// The entry, or `None` for anything this version did not write. Its signature
        /// is checked by [`Instance::verifies`].
        pub(super) fn decode(bytes: &[u8]) -> Option<Entry> {
            let entry: EntryIn = serde_json::from_slice(bytes).ok()?;
            if entry.v != ENTRY_VERSION {
                return None;
            }
            let fingerprint = match entry.fp {
                Some(text) => Some(hex::decode(text).ok()?),
                None => None,
            };
            Some(Entry {
                fingerprint,
                result: entry.r,
                signature: hex::decode(entry.mac).ok()?,
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn instance(secret: &[u8]) -> Instance {
            Instance::new("id:db:schema".to_owned(), secret.to_vec())
        }

        #[test]
        fn entries_round_trip_and_verify() {
            let signer = instance(b"secret");
            let key = IdempotencyKey::from_uuid(uuid::Uuid::from_u128(9));
            let fingerprint = [7u8; 32];
            let result = serde_json::json!({"payment_id": 42, "note": "nul \u{0}"});
            let bytes = Entry::encode(&signer, "pay", key, Some(&fingerprint), Some(&result));
            let entry = Entry::decode(&bytes).expect("decodes");
            assert_eq!(entry.fingerprint.as_deref(), Some(&fingerprint[..]));
            assert_eq!(entry.result, Some(result));
            assert!(signer.verifies("pay", key, &entry));

            let bare =
                Entry::decode(&Entry::encode(&signer, "pay", key, None, None)).expect("decodes");
            assert!(bare.fingerprint.is_none() && bare.result.is_none());
            assert!(signer.verifies("pay", key, &bare));
        }

        #[test]
        fn an_entry_verifies_only_for_its_table_scope_key_and_secret() {
            let signer = instance(b"secret");
            let key = IdempotencyKey::from_uuid(uuid::Uuid::from_u128(9));
            let other_key = IdempotencyKey::from_uuid(uuid::Uuid::from_u128(10));
            let entry = Entry::decode(&Entry::encode(&signer, "pay", key, None, None)).unwrap();
            assert!(!signer.verifies("refund", key, &entry));
            assert!(!signer.verifies("pay", other_key, &entry));
            assert!(!instance(b"rotated").verifies("pay", key, &entry));
            let elsewhere = Instance::new("other:db:schema".to_owned(), b"secret".to_vec());
            assert!(!elsewhere.verifies("pay", key, &entry));
            // The same claims with another result do not verify either.
            let mut changed = entry;
            changed.result = Some(serde_json::json!(1));
            assert!(!signer.verifies("pay", key, &changed));
        }

        #[test]
        fn garbage_is_not_an_entry() {
            for garbage in [
                &b"OK"[..],
                b"",
                b"{}",
                br#"{"v":1}"#,
                br#"{"v":2,"fp":"zz","mac":""}"#,
                br#"{"v":2,"fp":"abc","mac":""}"#,
                br#"{"v":2,"other":true}"#,
                br#"{"v":2,"mac":"xyz"}"#,
                b"\xff\xfe",
            ] {
                assert!(Entry::decode(garbage).is_none(), "{garbage:?}");
            }
        }
    }
}
