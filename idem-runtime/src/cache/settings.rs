//! The settings of the Redis cache: where it is, its prefix, TTL and timeouts.

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Client, RedisError};

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
    pub(super) source: Source,
    pub(super) ttl: Duration,
    pub(super) prefix: String,
    pub(super) secret: Option<Vec<u8>>,
    pub(super) timeout: Duration,
    pub(super) retry_after: Duration,
}

#[derive(Clone)]
pub(super) enum Source {
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
