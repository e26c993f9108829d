//! idem's benchmark suite: the same business write per message, bare, through the article's
//! algorithm written by hand and through `#[idempotent]`, side by side in one run against
//! the local PostgreSQL; batches (a body per message, and a batch handler's one body per
//! batch), lease mode, duplicate storms with and without the Redis cache (feature
//! `redis`), new keys next to a busy key (one key held by a slow body while duplicates of
//! it arrive); plus round trips per message and the status table's size. The `pooler` run
//! measures `bare`, `idem` and `idem-dup` through PgBouncer in transaction pooling next to
//! the same on a direct connection.
//!
//! ```text
//! cargo bench --bench suite --features redis     # full run (about 12 minutes)
//! cargo bench --bench suite                      # the same without the Redis scenarios
//! IDEM_BENCH_QUICK=1 cargo bench --bench suite   # smoke run (about a minute)
//! cargo bench --bench suite -- idem bare         # only these scenarios
//! cargo bench --bench suite -- memory            # 1,000,000 messages through batches: peak RSS
//! cargo bench --bench suite -- pooler            # through PgBouncer (pool_mode = transaction) vs direct
//! cargo bench --bench suite -- --help            # the settings below
//! bash benches/ceilings/run.sh                   # the same SQL through pgbench: the ratios' ceilings
//! ```
//!
//! Settings (environment variable, or `--name=value` after `--`; the flag wins):
//!
//! | variable | flag | default | quick |
//! |----------|------|---------|-------|
//! | `IDEM_BENCH_QUICK=1` | `--quick` | | |
//! | `IDEM_BENCH_SECS` | `--secs` | 1.5 s measured per cell and round | 0.4 |
//! | `IDEM_BENCH_WARMUP_SECS` | `--warmup-secs` | 0.3 s per cell and round | 0.15 |
//! | `IDEM_BENCH_ROUNDS` | `--rounds` | 3 (cells alternate within a round) | 1 |
//! | `IDEM_BENCH_CONCURRENCY` | `--concurrency` | 1,4,16,64 | 1,16 |
//! | `IDEM_BENCH_SCENARIOS` | `--scenarios` | all | a subset: no `idem-result`, `article-dup`, `batch-10`, `batch-100` |
//! | `IDEM_BENCH_SYNC` | `--sync` | on,off (`synchronous_commit` per connection) | on,off |
//! | `IDEM_BENCH_PROBE_MESSAGES` | `--probe-messages` | 200 (0: no round-trip probe) | 50 |
//! | `IDEM_BENCH_SIZE_KEYS` | `--size-keys` | 200000 (0: no size report) | 20000 |
//! | `IDEM_BENCH_DUP_KEYS` | `--dup-keys` | 2000 keys the duplicate scenarios cycle through | 300 |
//! | `IDEM_BENCH_MEMORY_MESSAGES` | `--memory-messages` | 1000000 (the `memory` run only) | 100000 |
//! | `IDEM_BENCH_BUSY_SECS` | `--busy-secs` | 10 s that the busy key's body holds the key (`busy-key` cells) | 2 |
//! | `IDEM_BENCH_BUSY_DUPLICATES` | `--busy-duplicates` | 100 duplicates of the busy key delivered meanwhile | 100 |
//! | `IDEM_BENCH_REDIS_URL` | `--redis-url` | `REDIS_URL`, else `redis://127.0.0.1:6379` | |
//! | `IDEM_BENCH_DATABASE` | `--database` | `idem_bench` (created if missing, on `DATABASE_URL`'s server) | |
//! | `IDEM_BENCH_OUT` | `--out` | `target/bench` (`results.json`, `throughput.svg`) | |
//! | `IDEM_PGBOUNCER_TRANSACTION_URL` | `--pgbouncer-url` | PgBouncer with `pool_mode = transaction` in front of `DATABASE_URL`'s server (`pgbouncer-*` scenarios); unset: `scripts/services.sh up --print-env postgres pgbouncer` starts one | |
//!
//! The `pooler` run (`-- pooler`, about 10 minutes) has its own defaults: 20 rounds of
//! 0.5 s cells after 0.2 s of warm-up (quick: as above), concurrency 1,4,16 (quick: 4,16),
//! `synchronous_commit` on only (PgBouncer passes no `options` startup parameter), no size
//! report.

#[path = "../common/proxy.rs"]
mod proxy;
mod report;
mod scenarios;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::FalseyValueParser;
use clap::{Parser, ValueEnum};
use idem_demo::orders::CREATE_ORDER_EFFECTS;
use idem_runtime::{Idem, Pooler};
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{Connection, Executor, PgConnection, PgPool, Row};

use crate::proxy::Proxy;
use crate::report::{
    CellResult, DbPerMessage, MemoryMark, MemoryResult, PgBouncerInfo, ProbeResult, Report,
    SizeResult, WirePerMessage,
};
use crate::scenarios::{CREATE_ARTICLE_MESSAGES, Cell, Scenario, TRUNCATE};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `synchronous_commit` of the cell's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SyncCommit {
    On,
    Off,
}

impl SyncCommit {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SyncCommit::On => "on",
            SyncCommit::Off => "off",
        }
    }
}

/// The settings of one run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Settings {
    pub(crate) quick: bool,
    pub(crate) secs: f64,
    pub(crate) warmup_secs: f64,
    pub(crate) rounds: usize,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) scenarios: Vec<Scenario>,
    pub(crate) sync: Vec<SyncCommit>,
    pub(crate) probe_messages: usize,
    pub(crate) size_keys: u64,
    pub(crate) dup_keys: usize,
    /// Run the memory scenario (selected by the name `memory`).
    pub(crate) memory: bool,
    pub(crate) memory_messages: u64,
    /// How long the busy key's body holds its key (`busy-key` cells).
    pub(crate) busy_secs: f64,
    /// Duplicates of the busy key delivered while its body runs.
    pub(crate) busy_duplicates: usize,
    pub(crate) redis_url: String,
    pub(crate) database: String,
    /// The `pooler` run was picked (its defaults apply).
    pub(crate) pooler: bool,
    /// `IDEM_PGBOUNCER_TRANSACTION_URL` (not written out: it may hold a password).
    #[serde(skip)]
    pub(crate) pgbouncer_url: Option<String>,
    #[serde(skip)]
    pub(crate) out: PathBuf,
}

/// The command line of the suite: every setting is a flag after `--` or an environment
/// variable (the flag wins); scenario names after `--` pick scenarios.
#[derive(Debug, Parser)]
#[command(
    name = "suite",
    about = "idem's benchmark suite: the scenarios side by side against the local PostgreSQL (and Redis)",
    after_help = "Run through cargo: cargo bench --bench suite --features redis -- [FLAGS] [SCENARIO...]"
)]
struct Cli {
    /// Scenarios to run, by name (`memory`: the memory run; `pooler`: through PgBouncer
    /// against direct). Default: all of them but the `pooler` run's (a subset in quick
    /// mode).
    #[arg(value_name = "SCENARIO", value_parser = pick)]
    names: Vec<Pick>,
    /// Smoke run: shorter cells, one round, concurrency 1 and 16, fewer scenarios.
    #[arg(
        long,
        env = "IDEM_BENCH_QUICK",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        value_parser = FalseyValueParser::new()
    )]
    quick: bool,
    /// Seconds measured per cell and round [default: 1.5; quick: 0.4].
    #[arg(long, env = "IDEM_BENCH_SECS", value_name = "SECONDS", value_parser = seconds)]
    secs: Option<f64>,
    /// Seconds of warm-up per cell and round [default: 0.3; quick: 0.15].
    #[arg(long, env = "IDEM_BENCH_WARMUP_SECS", value_name = "SECONDS", value_parser = seconds)]
    warmup_secs: Option<f64>,
    /// Rounds; the cells alternate within a round [default: 3; quick: 1].
    #[arg(long, env = "IDEM_BENCH_ROUNDS", value_parser = at_least_one)]
    rounds: Option<usize>,
    /// Concurrent workers, a list [default: 1,4,16,64; quick: 1,16].
    #[arg(long, env = "IDEM_BENCH_CONCURRENCY", value_name = "LIST", value_delimiter = ',', value_parser = at_least_one)]
    concurrency: Option<Vec<usize>>,
    /// Scenarios to run, a list (as the names after `--`).
    #[arg(long, env = "IDEM_BENCH_SCENARIOS", value_name = "LIST", value_delimiter = ',', value_parser = pick)]
    scenarios: Option<Vec<Pick>>,
    /// `synchronous_commit` of the cells' connections, a list [default: on,off].
    #[arg(
        long,
        env = "IDEM_BENCH_SYNC",
        value_name = "LIST",
        value_delimiter = ','
    )]
    sync: Option<Vec<SyncCommit>>,
    /// Messages of the round-trip probe per scenario; 0: no probe [default: 200; quick: 50].
    #[arg(long, env = "IDEM_BENCH_PROBE_MESSAGES")]
    probe_messages: Option<usize>,
    /// Keys of the size report; 0: no size report [default: 200000; quick: 20000].
    #[arg(long, env = "IDEM_BENCH_SIZE_KEYS")]
    size_keys: Option<u64>,
    /// Keys that the duplicate scenarios cycle through [default: 2000; quick: 300].
    #[arg(long, env = "IDEM_BENCH_DUP_KEYS", value_parser = at_least_one)]
    dup_keys: Option<usize>,
    /// Messages of the `memory` run (at least 1000) [default: 1000000; quick: 100000].
    #[arg(long, env = "IDEM_BENCH_MEMORY_MESSAGES")]
    memory_messages: Option<u64>,
    /// Seconds the busy key's body holds the key in `busy-key` cells [default: 10; quick: 2].
    #[arg(long, env = "IDEM_BENCH_BUSY_SECS", value_name = "SECONDS", value_parser = seconds)]
    busy_secs: Option<f64>,
    /// Duplicates of the busy key delivered while its body runs.
    #[arg(long, env = "IDEM_BENCH_BUSY_DUPLICATES", default_value_t = 100)]
    busy_duplicates: usize,
    /// The Redis of the cache scenarios [default: REDIS_URL, else redis://127.0.0.1:6379].
    #[arg(long, env = "IDEM_BENCH_REDIS_URL", value_name = "URL")]
    redis_url: Option<String>,
    /// The bench database, created if missing on DATABASE_URL's server.
    #[arg(long, env = "IDEM_BENCH_DATABASE", default_value = "idem_bench", value_parser = database_name)]
    database: String,
    /// Where results.json and throughput.svg go [default: target/bench].
    #[arg(long, env = "IDEM_BENCH_OUT", value_name = "DIR")]
    out: Option<PathBuf>,
    /// PgBouncer in transaction pooling in front of DATABASE_URL's server, for the
    /// `pgbouncer-*` scenarios [default: started by scripts/services.sh].
    #[arg(long, env = "IDEM_PGBOUNCER_TRANSACTION_URL", value_name = "URL")]
    pgbouncer_url: Option<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// A name on the command line: a scenario, the memory run (`memory`) or the pooler run
/// (`pooler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    Scenario(Scenario),
    Memory,
    Pooler,
}

fn pick(name: &str) -> Result<Pick, String> {
    let name = name.trim();
    match name {
        "memory" => return Ok(Pick::Memory),
        "pooler" => return Ok(Pick::Pooler),
        _ => {}
    }
    Scenario::parse(name).map(Pick::Scenario).ok_or_else(|| {
        let known: Vec<_> = Scenario::ALL.iter().map(|s| s.name()).collect();
        format!(
            "unknown scenario; known: {}, memory, pooler",
            known.join(", ")
        )
    })
}

fn seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Ok(secs),
        _ => Err("not a number of seconds".into()),
    }
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("not a whole number above 0".into()),
    }
}

fn database_name(name: &str) -> Result<String, String> {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        Ok(name.to_string())
    } else {
        Err("a database name of lowercase letters, digits and '_'".into())
    }
}

impl Settings {
    fn load() -> Result<Settings, BoxError> {
        Settings::from_cli(Cli::parse())
    }

    fn from_cli(cli: Cli) -> Result<Settings, BoxError> {
        let quick = cli.quick;
        let default_scenarios = if quick {
            let mut quick = vec![
                Scenario::Bare,
                Scenario::Article,
                Scenario::Lean,
                Scenario::Idem,
                Scenario::IdemDup,
                Scenario::LeanDup,
                Scenario::Batch500,
                Scenario::BareBatch500,
                Scenario::BatchBulk500,
                Scenario::Lease,
                Scenario::Storm,
                Scenario::BusyKey,
            ];
            if cfg!(feature = "redis") {
                quick.extend([
                    Scenario::IdemRedis,
                    Scenario::IdemDupRedis,
                    Scenario::StormRedis,
                    Scenario::StormRedisDown,
                ]);
            }
            quick
        } else {
            Scenario::available()
        };
        // `cargo bench -- NAME...` picks scenarios by name, before `--scenarios`.
        let picked: Vec<Pick> = if !cli.names.is_empty() {
            cli.names
        } else if let Some(listed) = cli.scenarios {
            listed
        } else {
            default_scenarios.into_iter().map(Pick::Scenario).collect()
        };
        let memory = picked.contains(&Pick::Memory);
        let pooler = picked.contains(&Pick::Pooler);
        let mut scenarios = Vec::new();
        for pick in picked {
            let picked: &[Scenario] = match &pick {
                Pick::Scenario(scenario) => std::slice::from_ref(scenario),
                Pick::Pooler => &Scenario::POOLER_RUN,
                Pick::Memory => &[],
            };
            for &scenario in picked {
                if !scenarios.contains(&scenario) {
                    scenarios.push(scenario);
                }
            }
        }
        if let Some(redis) = scenarios
            .iter()
            .find(|s| s.redis() && !cfg!(feature = "redis"))
        {
            return Err(format!(
                "scenario {} needs the Redis cache: cargo bench --bench suite --features redis",
                redis.name()
            )
            .into());
        }
        let out = match cli.out {
            Some(dir) => dir,
            None => std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
                .join("bench"),
        };
        let or = |normal, quick_value| if quick { quick_value } else { normal };
        // The pooler run: short cells and many rounds, so that the two cells of a ratio run
        // seconds apart and the rounds' ratios have a median that load from other processes
        // moves little; the concurrencies where a pooler is used; no size report (the
        // default run has it).
        let default_rounds = match (pooler, quick) {
            (_, true) => 1,
            (true, false) => 20,
            (false, false) => 3,
        };
        let (default_secs, default_warmup) = match (pooler, quick) {
            (_, true) => (0.4, 0.15),
            (true, false) => (0.5, 0.2),
            (false, false) => (1.5, 0.3),
        };
        let default_concurrency = match (pooler, quick) {
            (true, true) => vec![4, 16],
            (true, false) => vec![1, 4, 16],
            (false, true) => vec![1, 16],
            (false, false) => vec![1, 4, 16, 64],
        };
        let default_sync = if pooler {
            vec![SyncCommit::On]
        } else {
            vec![SyncCommit::On, SyncCommit::Off]
        };
        let settings = Settings {
            quick,
            secs: cli.secs.unwrap_or(default_secs),
            warmup_secs: cli.warmup_secs.unwrap_or(default_warmup),
            rounds: cli.rounds.unwrap_or(default_rounds),
            concurrency: cli.concurrency.unwrap_or(default_concurrency),
            scenarios,
            sync: cli.sync.unwrap_or(default_sync),
            probe_messages: cli.probe_messages.unwrap_or(if quick { 50 } else { 200 }),
            size_keys: cli.size_keys.unwrap_or(match (pooler, quick) {
                (true, _) => 0,
                (false, true) => 20_000,
                (false, false) => 200_000,
            }),
            dup_keys: cli.dup_keys.unwrap_or(if quick { 300 } else { 2000 }),
            memory,
            memory_messages: cli
                .memory_messages
                .unwrap_or(if quick { 100_000 } else { 1_000_000 })
                .max(1000),
            busy_secs: cli.busy_secs.unwrap_or(or(10.0, 2.0)),
            busy_duplicates: cli.busy_duplicates,
            redis_url: cli
                .redis_url
                .or_else(|| {
                    std::env::var("REDIS_URL")
                        .ok()
                        .filter(|url| !url.is_empty())
                })
                .unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
            database: cli.database,
            pooler,
            pgbouncer_url: cli.pgbouncer_url.filter(|url| !url.is_empty()),
            out,
        };
        if settings.scenarios.contains(&Scenario::BusyKey)
            && settings.busy_secs < settings.warmup_secs + 0.5
        {
            return Err(format!(
                "busy-secs ({}) must exceed warmup-secs ({}) by 0.5 s at least: busy-key cells measure while the key is held",
                settings.busy_secs, settings.warmup_secs
            )
            .into());
        }
        Ok(settings)
    }

    /// The cells of one round, each scenario with each `synchronous_commit` setting.
    /// Duplicate scenarios run with the default setting only.
    fn cells(&self) -> Vec<(Scenario, SyncCommit)> {
        let mut cells = Vec::new();
        for &sync in &self.sync {
            for &scenario in &self.scenarios {
                if scenario.sync_on_only() && sync == SyncCommit::Off {
                    continue;
                }
                cells.push((scenario, sync));
            }
        }
        cells
    }
}

/// Connections to the server: the admin database and the bench database.
struct Target {
    admin: PgConnectOptions,
    bench: PgConnectOptions,
    /// The bench database through PgBouncer in transaction pooling (`pgbouncer-*`
    /// scenarios), when one of them runs.
    pgbouncer: Option<PgConnectOptions>,
    /// The shared Redis.
    redis: String,
    /// A Redis URL where nothing listens.
    redis_down: String,
    /// Distinguishes this run's Redis entries from earlier runs'.
    run: String,
}

impl Target {
    fn bench_with(&self, sync: SyncCommit) -> PgConnectOptions {
        match sync {
            SyncCommit::On => self.bench.clone(),
            SyncCommit::Off => self.bench.clone().options([("synchronous_commit", "off")]),
        }
    }

    /// Where the cells of `scenario` connect: the bench database directly, or through
    /// PgBouncer.
    fn options_for(
        &self,
        scenario: Scenario,
        sync: SyncCommit,
    ) -> Result<PgConnectOptions, BoxError> {
        if !scenario.through_pgbouncer() {
            return Ok(self.bench_with(sync));
        }
        if sync == SyncCommit::Off {
            // The setting is a startup parameter (`options`), which PgBouncer refuses.
            return Err(format!(
                "scenario {} runs with synchronous_commit=on only",
                scenario.name()
            )
            .into());
        }
        self.pgbouncer.clone().ok_or_else(|| {
            format!(
                "scenario {} needs PgBouncer in transaction pooling: set IDEM_PGBOUNCER_TRANSACTION_URL",
                scenario.name()
            )
            .into()
        })
    }

    async fn bench_conn(&self) -> Result<PgConnection, BoxError> {
        Ok(PgConnection::connect_with(&self.bench).await?)
    }

    async fn pool(
        &self,
        sync: SyncCommit,
        connections: usize,
        application: &str,
    ) -> Result<PgPool, BoxError> {
        self.pool_for(Scenario::Bare, sync, connections, application)
            .await
    }

    /// A pool of `connections` where the cells of `scenario` connect.
    async fn pool_for(
        &self,
        scenario: Scenario,
        sync: SyncCommit,
        connections: usize,
        application: &str,
    ) -> Result<PgPool, BoxError> {
        let options = self
            .options_for(scenario, sync)?
            .application_name(application);
        Ok(PgPoolOptions::new()
            .max_connections(u32::try_from(connections).unwrap_or(u32::MAX))
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await?)
    }

    /// The Redis key prefix of a cell.
    fn prefix(&self, tag: &str) -> String {
        format!("idem-bench:{}:{tag}:", self.run)
    }

    /// The runtime handle of `scenario` on `pool`, with a Redis cache under `prefix` where
    /// the scenario has one.
    fn handle(&self, scenario: Scenario, pool: PgPool, prefix: &str) -> Result<Idem, BoxError> {
        let builder = Idem::builder(pool).schema("idem");
        let builder = if scenario.transaction_pooler() {
            builder.pooler(Pooler::Transaction)
        } else {
            builder
        };
        #[cfg(feature = "redis")]
        let builder = if scenario.redis() {
            let url = if scenario == Scenario::StormRedisDown {
                &self.redis_down
            } else {
                &self.redis
            };
            let cache = idem_runtime::cache::RedisCache::from_url(url)?
                .prefix(prefix)
                .ttl(Duration::from_secs(300));
            builder.redis(cache)
        } else {
            builder
        };
        #[cfg(not(feature = "redis"))]
        if scenario.redis() {
            return Err(format!("scenario {} needs --features redis", scenario.name()).into());
        }
        let _ = (prefix, &self.redis, &self.redis_down);
        Ok(builder.build()?)
    }

    async fn truncate(&self) -> Result<(), BoxError> {
        let mut conn = self.bench_conn().await?;
        conn.execute(TRUNCATE).await?;
        conn.close().await?;
        Ok(())
    }

    /// Processes the messages that a duplicate scenario receives again (and, with a cache,
    /// waits until Redis has them all).
    async fn populate(
        &self,
        settings: &Settings,
        scenario: Scenario,
        prefix: &str,
    ) -> Result<(), BoxError> {
        if !scenario.duplicates() {
            return Ok(());
        }
        let pool = self.pool(SyncCommit::Off, 8, "idem-bench-setup").await?;
        let idem = self.handle(scenario, pool.clone(), prefix)?;
        scenarios::populate(scenario, &pool, &idem, settings.dup_keys, 8).await?;
        #[cfg(feature = "redis")]
        if scenario.redis() {
            let wanted = settings.dup_keys as u64;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let stats = idem.cache_stats().unwrap_or_default();
                if stats.writes >= wanted {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "Redis holds {} of {wanted} keys: {stats:?}",
                        stats.writes
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        pool.close().await;
        Ok(())
    }
}

fn main() -> Result<(), BoxError> {
    let settings = Settings::load()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(settings))
}

async fn run(settings: Settings) -> Result<(), BoxError> {
    let started = Instant::now();
    let load_before = load_average();
    let mut url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty());
    let mut pgbouncer_url = settings.pgbouncer_url.clone();
    if pgbouncer_url.is_none() && settings.scenarios.iter().any(|s| s.through_pgbouncer()) {
        let printed = services_env()?;
        pgbouncer_url = Some(printed.transaction);
        // Without DATABASE_URL, the script may have started a private PostgreSQL: the
        // poolers stand in front of the server it printed.
        url = url.or(printed.database);
    }
    let url = url.unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let admin = PgConnectOptions::from_str(&url)?;
    let bench = admin.clone().database(&settings.database);
    let pgbouncer = match &pgbouncer_url {
        Some(url) => Some(PgConnectOptions::from_str(url)?.database(&settings.database)),
        None => None,
    };
    let redis_down = {
        // A port that was free a moment ago: nothing listens there.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("redis://127.0.0.1:{}", listener.local_addr()?.port())
    };
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis()
    );
    let target = Target {
        admin,
        bench,
        pgbouncer,
        redis: settings.redis_url.clone(),
        redis_down,
        run,
    };

    let mut admin = PgConnection::connect_with(&target.admin).await?;
    let server_version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut admin)
        .await?;
    create_database(&mut admin, &settings.database).await?;
    setup(&target).await?;
    let pgbouncer = match &target.pgbouncer {
        Some(options) => Some(check_pgbouncer(&target.bench, options).await?),
        None => None,
    };
    println!(
        "idem bench: PostgreSQL {server_version}, database {}, {} s per cell x {} rounds, concurrency {:?}, {}",
        settings.database,
        settings.secs,
        settings.rounds,
        settings.concurrency,
        if settings.quick {
            "quick mode"
        } else {
            "full mode"
        }
    );

    let cells = throughput(&settings, &target).await?;
    let mut probes = Vec::new();
    if settings.probe_messages > 0 {
        for &scenario in settings.scenarios.iter().filter(|s| s.probed()) {
            probes.push(probe(&settings, &target, &mut admin, scenario).await?);
        }
    }
    let sizes = if settings.size_keys > 0 && !settings.scenarios.is_empty() {
        sizes(&target, settings.size_keys).await?
    } else {
        Vec::new()
    };
    let memory = if settings.memory {
        Some(memory(&settings, &target).await?)
    } else {
        None
    };
    target.truncate().await?;
    admin.close().await?;

    let report = Report::new(
        &settings,
        server_version,
        pgbouncer,
        cells,
        probes,
        sizes,
        memory,
        started.elapsed().as_secs_f64(),
        [load_before, load_average()],
    );
    report.print();
    let written = report.write(&settings.out)?;
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// What `scripts/services.sh up --print-env postgres pgbouncer` printed.
struct ServicesEnv {
    /// `DATABASE_URL`: the server that the poolers stand in front of.
    database: Option<String>,
    /// `IDEM_PGBOUNCER_TRANSACTION_URL`.
    transaction: String,
}

/// Starts (or finds) the PostgreSQL and the PgBouncer instances of `scripts/services.sh`.
fn services_env() -> Result<ServicesEnv, BoxError> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services.sh");
    println!(
        "IDEM_PGBOUNCER_TRANSACTION_URL is not set: scripts/services.sh up --print-env postgres pgbouncer"
    );
    let advice = "the pgbouncer-* scenarios need PgBouncer with pool_mode = transaction in front of \
                  DATABASE_URL's server: set IDEM_PGBOUNCER_TRANSACTION_URL, or let \
                  scripts/services.sh start one (it needs pgbouncer installed, or the rights to \
                  install it)";
    // Into a file, not a pipe: the servers that the script leaves running inherit its
    // stdout, and would hold the bench's end of a pipe open.
    let printed =
        std::env::temp_dir().join(format!("idem-bench-services-env-{}", std::process::id()));
    let status = std::process::Command::new("bash")
        .args([script, "up", "--print-env", "postgres", "pgbouncer"])
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&printed)?)
        .stderr(std::process::Stdio::inherit())
        .status();
    let text = std::fs::read_to_string(&printed);
    let _ = std::fs::remove_file(&printed);
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => {
            return Err(
                format!("scripts/services.sh failed ({status}, see above): {advice}").into(),
            );
        }
        Err(error) => {
            return Err(format!("cannot run scripts/services.sh: {error}; {advice}").into());
        }
    }
    let text = text?;
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("export {name}=")))
            .map(unquote)
    };
    Ok(ServicesEnv {
        database: value("DATABASE_URL"),
        transaction: value("IDEM_PGBOUNCER_TRANSACTION_URL").ok_or_else(|| {
            format!("scripts/services.sh printed no IDEM_PGBOUNCER_TRANSACTION_URL; {advice}")
        })?,
    })
}

/// A value as bash's `printf %q` writes it (backslash escapes, or single quotes).
fn unquote(value: &str) -> String {
    if let Some(inner) = value
        .strip_prefix('\'')
        .and_then(|rest| rest.strip_suffix('\''))
    {
        return inner.to_string();
    }
    let mut plain = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => plain.extend(chars.next()),
            c => plain.push(c),
        }
    }
    plain
}

/// Checks that `pooled` is PgBouncer in transaction pooling in front of the server of
/// `direct`, and reads its version and settings from its admin console.
async fn check_pgbouncer(
    direct: &PgConnectOptions,
    pooled: &PgConnectOptions,
) -> Result<PgBouncerInfo, BoxError> {
    // Simple queries only: outside a transaction, each statement may run on another server
    // connection of the pooler.
    const SERVER: &str =
        "SELECT pg_postmaster_start_time()::text || ' port ' || inet_server_port()::text";
    let address = format!("{}:{}", pooled.get_host(), pooled.get_port());
    let mut conn = PgConnection::connect_with(direct).await?;
    let direct_server: String = conn.fetch_one(SERVER).await?.try_get(0)?;
    conn.close().await?;
    let mut conn = PgConnection::connect_with(pooled)
        .await
        .map_err(|error| format!("cannot connect through PgBouncer at {address}: {error}"))?;
    let pooled_server: String = conn.fetch_one(SERVER).await?.try_get(0)?;
    conn.close().await?;
    if direct_server != pooled_server {
        return Err(format!(
            "PgBouncer at {address} stands in front of another PostgreSQL than DATABASE_URL's \
             (started {pooled_server}, not {direct_server}): point IDEM_PGBOUNCER_TRANSACTION_URL \
             and DATABASE_URL at the same server"
        )
        .into());
    }
    let mut info = PgBouncerInfo {
        address,
        version: None,
        settings: BTreeMap::new(),
    };
    let admin = pooled.clone().database("pgbouncer");
    let console = async {
        let mut conn = PgConnection::connect_with(&admin).await?;
        let version: String = conn.fetch_one("SHOW VERSION").await?.try_get(0)?;
        let config = conn.fetch_all("SHOW CONFIG").await?;
        conn.close().await?;
        Ok::<_, sqlx::Error>((version, config))
    };
    match console.await {
        Ok((version, config)) => {
            info.version = Some(version);
            for row in config {
                let key: String = row.try_get("key")?;
                if PGBOUNCER_SETTINGS.contains(&key.as_str()) {
                    info.settings.insert(key, row.try_get("value")?);
                }
            }
            let mode = info.settings.get("pool_mode").map(String::as_str);
            if mode != Some("transaction") {
                return Err(format!(
                    "PgBouncer at {} runs pool_mode = {}: the pgbouncer-* scenarios need transaction pooling",
                    info.address,
                    mode.unwrap_or("(not shown)")
                )
                .into());
            }
        }
        Err(error) => println!(
            "warning: PgBouncer's admin console at {} did not answer ({error}): its version and settings are not reported",
            info.address
        ),
    }
    Ok(info)
}

/// The PgBouncer settings that the report shows (`max_prepared_statements` exists from
/// PgBouncer 1.21 on).
const PGBOUNCER_SETTINGS: [&str; 12] = [
    "pool_mode",
    "default_pool_size",
    "min_pool_size",
    "reserve_pool_size",
    "max_client_conn",
    "max_db_connections",
    "server_reset_query",
    "server_reset_query_always",
    "server_round_robin",
    "server_idle_timeout",
    "ignore_startup_parameters",
    "max_prepared_statements",
];

/// The 1-minute load average (0 where the system does not say).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

async fn create_database(admin: &mut PgConnection, name: &str) -> Result<(), BoxError> {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut *admin)
            .await?;
    if !exists {
        // The name was checked to be a plain identifier.
        let created = admin
            .execute(format!("CREATE DATABASE {name}").as_str())
            .await;
        if let Err(error) = created {
            let raced = error
                .as_database_error()
                .is_some_and(|db| matches!(db.code().as_deref(), Some("42P04" | "23505")));
            if !raced {
                return Err(error.into());
            }
        }
    }
    Ok(())
}

async fn setup(target: &Target) -> Result<(), BoxError> {
    let mut conn = target.bench_conn().await?;
    conn.execute(CREATE_ORDER_EFFECTS).await?;
    conn.execute(CREATE_ARTICLE_MESSAGES).await?;
    conn.close().await?;
    let pool = target.pool(SyncCommit::On, 1, "idem-bench-setup").await?;
    Idem::builder(pool.clone())
        .schema("idem")
        .build()?
        .migrate()
        .await?;
    pool.close().await;
    Ok(())
}

/// What the workers of one phase did.
#[derive(Default)]
struct PhaseStats {
    messages: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_us: Vec<u32>,
    seconds: f64,
}

/// Runs every worker of `cell` until `duration` has passed (and each worker has done at
/// least `min_steps` steps). `next` holds each worker's next iteration number.
async fn phase(
    cell: &Arc<Cell>,
    next: &mut [u64],
    duration: Duration,
    min_steps: u64,
) -> PhaseStats {
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for (worker, &first) in next.iter().enumerate() {
        let cell = cell.clone();
        tasks.spawn(async move {
            let mut stats = PhaseStats::default();
            let mut iteration = first;
            let mut steps = 0;
            while steps < min_steps || Instant::now() < deadline {
                let begun = Instant::now();
                match cell.step(worker, iteration).await {
                    Ok(messages) => {
                        stats.messages += messages;
                        let micros = begun.elapsed().as_micros();
                        stats
                            .latencies_us
                            .push(u32::try_from(micros).unwrap_or(u32::MAX));
                    }
                    Err(error) => {
                        stats.errors += 1;
                        stats.first_error.get_or_insert(error);
                        if stats.errors > 1000 {
                            break;
                        }
                    }
                }
                iteration += 1;
                steps += 1;
            }
            (worker, iteration, stats)
        });
    }
    let mut total = PhaseStats::default();
    while let Some(joined) = tasks.join_next().await {
        let (worker, iteration, stats) = joined.expect("a bench worker panicked");
        next[worker] = iteration;
        total.messages += stats.messages;
        total.errors += stats.errors;
        if total.first_error.is_none() {
            total.first_error = stats.first_error;
        }
        total.latencies_us.extend(stats.latencies_us);
    }
    total.seconds = start.elapsed().as_secs_f64();
    total
}

/// How long before the busy key is let go the measurement of a `busy-key` cell ends.
const BUSY_MARGIN: Duration = Duration::from_millis(50);

/// The throughput cells: every round runs every cell once, in a rotated order, so that
/// drift (checkpoints, autovacuum, other load) spreads over all scenarios alike.
async fn throughput(settings: &Settings, target: &Target) -> Result<Vec<CellResult>, BoxError> {
    let cells = settings.cells();
    let mut results: BTreeMap<(Scenario, SyncCommit, usize), CellResult> = BTreeMap::new();
    let mut serial = 0u64;
    for round in 0..settings.rounds {
        for &concurrency in &settings.concurrency {
            for index in 0..cells.len() {
                let (scenario, sync) = cells[(index + round) % cells.len()];
                serial += 1;
                let tag = format!("c{serial}");
                let prefix = target.prefix(&tag);
                target.truncate().await?;
                target.populate(settings, scenario, &prefix).await?;
                let connections = concurrency + scenario.extra_connections();
                let pool = target
                    .pool_for(scenario, sync, connections, "idem-bench")
                    .await?;
                let cell = Arc::new(Cell {
                    scenario,
                    idem: target.handle(scenario, pool.clone(), &prefix)?,
                    pool: pool.clone(),
                    tag,
                    concurrency,
                    duplicate_keys: settings.dup_keys,
                });
                // A busy-key cell: the busy key is held, and its duplicates delivered, before
                // the warm-up; the other keys are measured until just before it is let go.
                let busy = if scenario == Scenario::BusyKey {
                    Some(
                        cell.start_busy(
                            Duration::from_secs_f64(settings.busy_secs),
                            settings.busy_duplicates,
                        )
                        .await?,
                    )
                } else {
                    None
                };
                let mut next = vec![0u64; concurrency];
                let warmup = phase(
                    &cell,
                    &mut next,
                    Duration::from_secs_f64(settings.warmup_secs),
                    2,
                )
                .await;
                let measure_for = match &busy {
                    Some(busy) => busy
                        .until
                        .saturating_duration_since(Instant::now() + BUSY_MARGIN)
                        .max(Duration::from_millis(100)),
                    None => Duration::from_secs_f64(settings.secs),
                };
                let measured = phase(&cell, &mut next, measure_for, 0).await;
                let busy = match busy {
                    Some(busy) => Some(busy.finish(measured.seconds).await),
                    None => None,
                };
                drop(cell);
                pool.close().await;
                let rate = measured.messages as f64 / measured.seconds;
                let first_error = measured
                    .first_error
                    .or(warmup.first_error)
                    .or_else(|| busy.as_ref().and_then(|b| b.first_error.clone()));
                println!(
                    "  round {}/{} {:<12} sync={:<3} c={:<3} {:>9.0} msg/s{}{}",
                    round + 1,
                    settings.rounds,
                    scenario.name(),
                    sync.name(),
                    concurrency,
                    rate,
                    busy.as_ref().map_or_else(String::new, |b| format!(
                        "  (busy key held {:.1} s, {:.1} s measured; {} duplicates: {} answered after it, {} in-progress answers delivered again)",
                        b.held_secs,
                        b.measured_secs,
                        b.duplicates,
                        b.duplicate_answers,
                        b.in_progress_answers
                    )),
                    first_error
                        .as_ref()
                        .map_or_else(String::new, |error| format!("  ERROR: {error}"))
                );
                let entry = results
                    .entry((scenario, sync, concurrency))
                    .or_insert_with(|| CellResult::new(scenario, sync, concurrency));
                entry.add_round(
                    measured.messages,
                    measured.seconds,
                    measured.errors + warmup.errors + busy.as_ref().map_or(0, |b| b.errors),
                    first_error,
                    measured.latencies_us,
                );
                if let Some(busy) = busy {
                    entry.busy.push(busy);
                }
            }
        }
    }
    Ok(results.into_values().map(CellResult::finish).collect())
}

/// Counters of the bench database (and the server's WAL position), as the statistics
/// collector has them.
#[derive(Debug, Clone, Copy)]
struct DbStats {
    commits: i64,
    rollbacks: i64,
    inserted: i64,
    updated: i64,
    deleted: i64,
}

async fn db_stats(admin: &mut PgConnection, database: &str) -> Result<(DbStats, String), BoxError> {
    let row = sqlx::query(
        "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, \
                pg_current_wal_insert_lsn()::text AS lsn \
         FROM pg_stat_database WHERE datname = $1",
    )
    .bind(database)
    .fetch_one(&mut *admin)
    .await?;
    Ok((
        DbStats {
            commits: row.try_get("xact_commit")?,
            rollbacks: row.try_get("xact_rollback")?,
            inserted: row.try_get("tup_inserted")?,
            updated: row.try_get("tup_updated")?,
            deleted: row.try_get("tup_deleted")?,
        },
        row.try_get("lsn")?,
    ))
}

/// Waits until no client is connected to the bench database: a backend hands its
/// statistics to the collector when it exits. With PgBouncer in the run (`pooled`), the
/// server connections that it keeps idle are ended first.
async fn wait_for_no_clients(
    admin: &mut PgConnection,
    database: &str,
    pooled: bool,
) -> Result<(), BoxError> {
    for _ in 0..200 {
        if pooled {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = $1 AND backend_type = 'client backend' AND state = 'idle'",
            )
            .bind(database)
            .execute(&mut *admin)
            .await?;
        }
        let clients: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'",
        )
        .bind(database)
        .fetch_one(&mut *admin)
        .await?;
        if clients == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!("clients stay connected to {database}").into())
}

/// Waits until every connection of `pool` is back in it (the release ping is done).
async fn wait_for_idle(pool: &PgPool) {
    for _ in 0..400 {
        if pool.num_idle() == pool.size() as usize {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// CPU time of a local PostgreSQL backend so far (Linux), in nanoseconds.
fn backend_cpu_ns(pid: i32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Counts, through the counting proxy, the round trips and protocol messages per message
/// of `scenario` at concurrency 1; and, from the server's statistics, the transactions,
/// row writes and WAL per message.
async fn probe(
    settings: &Settings,
    target: &Target,
    admin: &mut PgConnection,
    scenario: Scenario,
) -> Result<ProbeResult, BoxError> {
    // Batches: a few warm-up batches, then enough batches for the messages asked.
    let size = scenario.batch_size() as u64;
    let warmup_steps = if size > 1 { 2 } else { 20 };
    let steps = (settings.probe_messages as u64).div_ceil(size).max(2);
    let prefix = target.prefix(&format!("probe-{}", scenario.name()));
    target.truncate().await?;
    target.populate(settings, scenario, &prefix).await?;
    let pooled = target.pgbouncer.is_some();
    wait_for_no_clients(admin, &settings.database, pooled).await?;
    let (before, lsn_before) = db_stats(admin, &settings.database).await?;

    // Between the client and PostgreSQL, or between the client and PgBouncer.
    let server = target.options_for(scenario, SyncCommit::On)?;
    let upstream = format!("{}:{}", server.get_host(), server.get_port());
    let proxy = Proxy::start(upstream).await?;
    let options = server
        .host("127.0.0.1")
        .port(proxy.port)
        .ssl_mode(PgSslMode::Disable)
        .application_name("idem-bench-probe");
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?;
    let cell = Cell {
        scenario,
        idem: target.handle(scenario, pool.clone(), &prefix)?,
        pool: pool.clone(),
        tag: "probe".into(),
        concurrency: 1,
        duplicate_keys: settings.dup_keys,
    };
    let mut warmup = 0;
    for iteration in 0..warmup_steps {
        warmup += cell.step(0, iteration).await?;
    }
    // A simple query: it leaves no prepared statement on the connection (through PgBouncer,
    // the server connection that answers it also runs the probe's transactions: the first
    // client of a pool with none idle, see wait_for_no_clients).
    let backend: i32 = pool
        .fetch_one("SELECT pg_backend_pid()")
        .await?
        .try_get(0)?;
    wait_for_idle(&pool).await;
    let cpu_before = backend_cpu_ns(backend);
    let start = proxy.counters.snapshot();
    let mut messages = 0;
    for iteration in warmup_steps..warmup_steps + steps {
        messages += cell.step(0, iteration).await?;
    }
    wait_for_idle(&pool).await;
    let wire = proxy.counters.snapshot().since(start);
    let server_cpu_us = cpu_before
        .zip(backend_cpu_ns(backend))
        .map(|(before, after)| (after - before) as f64 / 1000.0 / messages as f64);
    // Every simple query and every sync is answered by one ReadyForQuery: a check of the
    // proxy's framing.
    if wire.ready != wire.simple_queries + wire.syncs {
        return Err(format!("counting proxy out of step: {wire:?}").into());
    }
    drop(cell);
    pool.close().await;
    wait_for_no_clients(admin, &settings.database, pooled).await?;
    let (after, _) = db_stats(admin, &settings.database).await?;
    let wal: f64 = sqlx::query_scalar(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8",
    )
    .bind(&lsn_before)
    .fetch_one(&mut *admin)
    .await?;

    let n = messages as f64;
    let all = (warmup + messages) as f64;
    let per = |value: i64| value as f64 / all;
    let result = ProbeResult {
        scenario,
        messages,
        wire: WirePerMessage {
            round_trips: wire.round_trips as f64 / n,
            ready_for_query: wire.ready as f64 / n,
            simple_queries: wire.simple_queries as f64 / n,
            extended_executes: wire.executes as f64 / n,
            parses: wire.parses as f64 / n,
            // sqlx follows each execution, and each parse (with its describe), by a sync.
            bare_syncs: wire.syncs.saturating_sub(wire.executes + wire.parses) as f64 / n,
        },
        server_cpu_us,
        db: DbPerMessage {
            messages: warmup + messages,
            commits: per(after.commits - before.commits),
            rollbacks: per(after.rollbacks - before.rollbacks),
            rows_inserted: per(after.inserted - before.inserted),
            rows_updated: per(after.updated - before.updated),
            rows_deleted: per(after.deleted - before.deleted),
            wal_bytes_cluster: wal / all,
        },
    };
    println!(
        "  probe {:<12} {:.2} round trips/msg",
        scenario.name(),
        result.wire.round_trips
    );
    Ok(result)
}

/// Table and index bytes of the status tables after inserting `keys` rows shaped as the
/// handlers write them (random 16-byte keys, distinct timestamps), extrapolated to one
/// million keys.
async fn sizes(target: &Target, keys: u64) -> Result<Vec<SizeResult>, BoxError> {
    target.truncate().await?;
    let mut conn = target.bench_conn().await?;
    let keys_i64 = i64::try_from(keys)?;
    sqlx::query(
        "INSERT INTO idem.idem_keys (scope, key, status, attempts, created_at, updated_at) \
         SELECT 'bench_apply', gen_random_uuid(), 'success', 1, clock_timestamp(), clock_timestamp() \
         FROM generate_series(1, $1)",
    )
    .bind(keys_i64)
    .execute(&mut conn)
    .await?;
    sqlx::query(
        "INSERT INTO article_messages (msg_id, status, created_at, updated_at) \
         SELECT gen_random_uuid(), 'success', clock_timestamp(), clock_timestamp() \
         FROM generate_series(1, $1)",
    )
    .bind(keys_i64)
    .execute(&mut conn)
    .await?;
    let mut results = Vec::new();
    for table in ["idem.idem_keys", "public.article_messages"] {
        let row = sqlx::query(
            "SELECT pg_relation_size($1::regclass) AS heap, \
                    pg_indexes_size($1::regclass) AS indexes, \
                    pg_total_relation_size($1::regclass) AS total",
        )
        .bind(table)
        .fetch_one(&mut conn)
        .await?;
        let indexes: Vec<(String, i64)> = sqlx::query_as(
            "SELECT c.relname::text, pg_relation_size(c.oid) FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE i.indrelid = $1::regclass ORDER BY c.relname",
        )
        .bind(table)
        .fetch_all(&mut conn)
        .await?;
        results.push(SizeResult::new(
            table,
            keys,
            row.try_get("heap")?,
            row.try_get("indexes")?,
            row.try_get("total")?,
            indexes,
        ));
    }
    conn.close().await?;
    Ok(results)
}

/// The process's peak and current resident set size (Linux), in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Processes `settings.memory_messages` new messages through the batch path (batches of
/// 500, 4 workers), recording the process's peak RSS at a tenth, half and all of them;
/// then the status table's size for that many keys.
async fn memory(settings: &Settings, target: &Target) -> Result<MemoryResult, BoxError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    const BATCH: u64 = 500;
    const WORKERS: usize = 4;
    let total = settings.memory_messages.div_ceil(BATCH) * BATCH;
    let marks_at = [0, total / 10, total / 2, total];
    target.truncate().await?;
    let pool = target
        .pool(SyncCommit::On, WORKERS, "idem-bench-memory")
        .await?;
    let idem = Idem::builder(pool.clone()).schema("idem").build()?;
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let marks = Arc::new(std::sync::Mutex::new(vec![MemoryMark::new(0, rss_kib())]));
    println!("  memory: {total} messages in batches of {BATCH}, {WORKERS} workers");
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        let (idem, next, done, marks) = (idem.clone(), next.clone(), done.clone(), marks.clone());
        tasks.spawn(async move {
            loop {
                let batch = next.fetch_add(1, Ordering::Relaxed);
                if batch * BATCH >= total {
                    return Ok::<(), String>(());
                }
                let events: Vec<_> = (0..BATCH)
                    .map(|i| scenarios::event(format!("m-{batch}-{i}")))
                    .collect();
                for outcome in scenarios::apply_batched_batch(&idem, &events).await {
                    if !outcome.map_err(|e| e.to_string())?.is_executed() {
                        return Err("a new message was taken for a duplicate".into());
                    }
                }
                drop(events);
                let before = done.fetch_add(BATCH, Ordering::Relaxed);
                for mark in marks_at {
                    if before < mark && mark <= before + BATCH {
                        let taken = MemoryMark::new(mark, rss_kib());
                        println!(
                            "  memory: {:>8} messages, peak RSS {:.1} MiB",
                            mark,
                            taken.peak_rss_kib as f64 / 1024.0
                        );
                        marks.lock().expect("marks").push(taken);
                    }
                }
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("a memory worker panicked")?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut conn = target.bench_conn().await?;
    let (heap, indexes): (i64, i64) = sqlx::query_as(
        "SELECT pg_relation_size('idem.idem_keys'), pg_indexes_size('idem.idem_keys')",
    )
    .fetch_one(&mut conn)
    .await?;
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM idem.idem_keys")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    drop(idem);
    pool.close().await;
    target.truncate().await?;
    let mut marks = std::mem::take(&mut *marks.lock().expect("marks"));
    marks.sort_by_key(|m| m.messages);
    Ok(MemoryResult::new(
        total,
        BATCH,
        WORKERS,
        seconds,
        marks,
        u64::try_from(keys)?,
        heap,
        indexes,
    ))
}
