//! The cache at run time: the connection and its breaker, look-ups and writes of
//! entries, the status table's namespace and signing secret, and the statistics.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, FromRedisValue, RedisError};

use crate::handler::ResultCodec;
use crate::key::IdempotencyKey;
use crate::outcome::Outcome;

use super::entry::Entry;
use super::settings::{RedisCache, Source};

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
    pub(super) fn new(identity: String, secret: Vec<u8>) -> Self {
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

    pub(super) fn sign(
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

    pub(super) fn verifies(&self, scope: &str, key: IdempotencyKey, entry: &Entry) -> bool {
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
    pub(super) async fn instance(
        &self,
        pool: &sqlx::PgPool,
        statements: &crate::store::Statements,
    ) -> Option<&Instance> {
        let read = self.instance.get_or_try_init(|| async {
            let (identity, stored_secret) = statements.cache_instance(pool).await?;
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
        let mismatch = crate::key::fingerprints_differ(fingerprint, entry.fingerprint.as_deref());
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
