//! Support for the Redis cache tests (`tests/redis_*.rs`): a runtime handle whose cache
//! uses a key prefix of the test's own on the shared Redis, direct looks at the entries,
//! and a private `redis-server` on a free port that a test can stop, pause and restart
//! (never the shared one).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::testing;
use idem_runtime::Idem;
use idem_runtime::cache::{CacheStats, RedisCache, redis};
use idem_runtime::key::IdempotencyKey;
use sqlx::PgPool;

/// The shared Redis (`REDIS_URL`, default `redis://127.0.0.1:6379`).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A key prefix no other test uses, so that tests sharing one Redis do not meet.
pub fn unique_prefix() -> String {
    format!("idem-test:{}:", uuid::Uuid::new_v4().simple())
}

/// A cache at `url` under a prefix of its own, with a timeout generous enough for a busy
/// test machine (a timeout would send the delivery to PostgreSQL and fail a test that
/// expects Redis to answer).
pub fn cache_at(url: &str, prefix: &str) -> RedisCache {
    RedisCache::from_url(url)
        .expect("a valid Redis URL")
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
}

/// Migrates the status table and creates `order_effects`; returns a handle whose cache is
/// on the shared Redis under a fresh prefix, and that prefix.
pub async fn setup(pool: &PgPool) -> (Idem, String) {
    let prefix = unique_prefix();
    let idem = setup_with(pool, cache_at(&redis_url(), &prefix)).await;
    (idem, prefix)
}

/// Migrates the status table and creates `order_effects`; returns a handle with `cache`.
pub async fn setup_with(pool: &PgPool, cache: RedisCache) -> Idem {
    let idem = Idem::builder(pool.clone())
        .redis(cache)
        .build()
        .expect("valid settings");
    testing::setup_with(idem).await
}

/// The handle's cache counters.
pub fn stats(idem: &Idem) -> CacheStats {
    idem.cache_stats().expect("the handle has a cache")
}

/// Waits until `writes` entries have been written (writes run in the background, right
/// after the delivery returns); returns the counters then.
pub async fn written(idem: &Idem, writes: u64) -> CacheStats {
    eventually(
        Duration::from_secs(5),
        &format!("{writes} cache writes"),
        || async { stats(idem).writes >= writes },
    )
    .await;
    let stats = stats(idem);
    assert_eq!(stats.writes, writes, "{stats:?}");
    stats
}

/// The name of the entry of `key` in `scope`: `<prefix><namespace>:<scope>:<key>`,
/// checked to start with the handle's prefix.
pub async fn entry_name(idem: &Idem, prefix: &str, scope: &str, key: IdempotencyKey) -> String {
    let name = idem
        .cache_entry_name(scope, key)
        .await
        .expect("the handle has a cache and its namespace");
    assert!(name.starts_with(prefix), "{name} under {prefix}");
    assert!(name.ends_with(&format!(":{scope}:{key}")), "{name}");
    name
}

/// A connection of the test's own to the Redis at `url`.
pub async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a valid Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis")
}

/// The raw entry called `name`, if any.
pub async fn entry(url: &str, name: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(name)
        .query_async(&mut connect(url).await)
        .await
        .expect("GET")
}

/// The remaining time to live of `name` in milliseconds (-2: no such entry, -1: none).
pub async fn pttl(url: &str, name: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(name)
        .query_async(&mut connect(url).await)
        .await
        .expect("PTTL")
}

/// The names of the entries under `prefix`.
pub async fn names_under(url: &str, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut connect(url).await)
        .await
        .expect("KEYS");
    names.sort();
    names
}

/// Runs `command` on the Redis at `url`.
pub async fn run(url: &str, command: &redis::Cmd) {
    command
        .query_async::<redis::Value>(&mut connect(url).await)
        .await
        .expect("a Redis command");
}

/// Polls `condition` every 20 ms until it holds.
///
/// # Panics
///
/// When it does not hold within `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !condition().await {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `redis-server` of the test's own, on a free port of 127.0.0.1, without persistence.
/// Killed when dropped.
pub struct PrivateRedis {
    port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    /// A free port, and no server on it yet.
    pub fn unstarted() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        PrivateRedis { port, child: None }
    }

    /// Starts a server on a free port and waits until it answers.
    pub async fn start() -> Self {
        let mut server = Self::unstarted();
        server.restart().await;
        server
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on its port, empty, and waits until it answers.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed?)");
        self.child = Some(child);
        let url = self.url();
        eventually(
            Duration::from_secs(10),
            "the private redis-server answers",
            || {
                let url = url.clone();
                async move {
                    let Ok(client) = redis::Client::open(url.as_str()) else {
                        return false;
                    };
                    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                        return false;
                    };
                    redis::cmd("PING")
                        .query_async::<String>(&mut conn)
                        .await
                        .is_ok()
                }
            },
        )
        .await;
    }

    /// Kills the server (SIGKILL): its connections drop and its port refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the server is running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        // SIGKILL ends a paused server too.
        self.stop();
    }
}
