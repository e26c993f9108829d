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
//!   window); an expired or evicted entry only means that PostgreSQL answers again;
//! - the namespace (16 hex digits) identifies the status table: a digest of a random id
//!   that the migrations store in its schema, of the database's name and of the schema. So
//!   handles on other databases or schemas (tenants, staging beside production) that
//!   share one Redis, even with the same prefix, never answer each other's keys. A copy of
//!   the database restored under the same name shares the id: give the copy's handles
//!   another prefix (`RedisCache::prefix`) when both use one Redis.
//!
//! A handler can opt out, or keep its entries for another time, with
//! `#[idempotent(cache = false)]` or `#[idempotent(cache_ttl = "30m")]`; these arguments
//! need the `redis` feature, and without it they are a compile error that says so.
//!
//! Because an entry is final for its TTL, removing a `success` row by hand (to run a
//! key's body again) must also delete its entry from Redis
//! (`Idem::cache_entry_name`, with the feature, names it), or wait for the TTL.
//! [`Idem::reset`](crate::Idem::reset) does not concern cached keys: it only applies to
//! failed and parked keys, which are never cached.

#[cfg(feature = "redis")]
use std::time::Duration;

use sqlx::PgPool;

use crate::handler::{CachePolicy, ResultCodec};
use crate::key::IdempotencyKey;
use crate::outcome::Outcome;
use crate::store::Statements;

/// The cache of a runtime handle, if one is set up.
#[derive(Debug, Default, Clone)]
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

    /// The name of the entry of `key` in `scope`, once the namespace is read from the
    /// status table's schema through `pool`.
    pub(crate) async fn entry_name(
        &self,
        pool: &PgPool,
        statements: &Statements,
        scope: &str,
        key: IdempotencyKey,
    ) -> Option<String> {
        let cache = self.cache.as_ref()?;
        let instance = cache.instance(pool, statements).await?;
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

impl CacheSlot {
    /// The duplicate outcome for `key` from the cache, if the key is cached as succeeded
    /// with a matching fingerprint. `None` sends the delivery on to PostgreSQL.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn lookup<T, C: ResultCodec<T>>(
        &self,
        pool: &PgPool,
        statements: &Statements,
        policy: CachePolicy,
        scope: &str,
        key: IdempotencyKey,
        fingerprint: Option<&[u8]>,
        codec: &C,
    ) -> Option<Outcome<T>> {
        #[cfg(feature = "redis")]
        if let Some((cache, _)) = self.active(policy) {
            let instance = cache.instance(pool, statements).await?;
            return cache.lookup(instance, scope, key, fingerprint, codec).await;
        }
        #[cfg(not(feature = "redis"))]
        let _ = (pool, statements, policy, scope, key, fingerprint, codec);
        None
    }

    /// Writes a committed success of `key` to the cache, in the background: the delivery
    /// does not wait for Redis. Never fails: a write that does not happen only means that
    /// the next duplicate asks PostgreSQL.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn remember(
        &self,
        pool: &PgPool,
        statements: &Statements,
        policy: CachePolicy,
        scope: &str,
        key: IdempotencyKey,
        fingerprint: Option<&[u8]>,
        result: Option<&serde_json::Value>,
    ) {
        #[cfg(feature = "redis")]
        if let Some((cache, ttl)) = self.active(policy)
            && let Some(instance) = cache.instance(pool, statements).await
        {
            cache.store(instance, ttl, scope, key, fingerprint, result);
        }
        #[cfg(not(feature = "redis"))]
        let _ = (pool, statements, policy, scope, key, fingerprint, result);
    }
}

#[cfg(feature = "redis")]
pub use client::CacheStats;
#[cfg(feature = "redis")]
pub use settings::RedisCache;

/// The `redis` crate, as idem-runtime uses it: a public dependency, since
/// [`RedisCache::new`], [`RedisCache::with_manager`] and [`RedisCache::from_url`] take and
/// return its types. Build the client or connection manager with this re-export (or with
/// the same major version of `redis`); a major upgrade of `redis` is a major release of
/// idem-runtime.
#[cfg(feature = "redis")]
pub use redis;

#[cfg(feature = "redis")]
use client::Cache;

#[cfg(feature = "redis")]
mod client;
#[cfg(feature = "redis")]
mod entry;
#[cfg(feature = "redis")]
mod settings;
