//! One run: a throwaway PostgreSQL and Redis, the ledger's handles and tables, the
//! workers and the injectors; then the drain, the checks and the summary.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_runtime::Idem;
use idem_runtime::cache::RedisCache;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::chaos::{self, Chaos};
use crate::deliveries::{Plan, Size};
use crate::fault_counts::FaultCounts;
use crate::invariants;
use crate::ledger::{self, Hooks};
use crate::seeded_random::SeededRandom;
use crate::settlement::Settlement;
use crate::summary::Summary;
use crate::throwaway_postgres::ThrowawayPostgres;
use crate::throwaway_redis::ThrowawayRedis;
use crate::workers::{self, Run};

/// The handles' lock timeout: the longest a duplicate waits behind a claim.
const LOCK_TIMEOUT: Duration = Duration::from_millis(400);

/// The kinds of fault every run must have injected (see [`FaultCounts::rows`]).
const REQUIRED_FAULTS: &[&str] = &[
    "handler errors, transient",
    "handler errors, permanent",
    "backends killed at random",
    "PostgreSQL restarts (immediate)",
    "Redis FLUSHALL",
    "Redis SHUTDOWN NOSAVE",
    "Redis killed (SIGKILL)",
    "lease bodies outliving their lease",
    "bodies holding a key past the lock timeout",
    "lock-order pairs started together",
    "retention cleanups racing duplicates",
];

/// Deliveries aborted or dropped at random while the chaos runs, per thousand.
const ABORTS_PER_MILLE: u64 = 30;

async fn pool(url: &str, name: &str, connections: u32, serializable: bool) -> PgPool {
    let mut options: PgConnectOptions = url.parse().expect("the cluster's URL");
    options = options.application_name(name);
    if serializable {
        options = options.options([("default_transaction_isolation", "serializable")]);
    }
    PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(3))
        .connect_with(options)
        .await
        .expect("connect to the throwaway cluster")
}

fn cache(url: &str) -> RedisCache {
    RedisCache::from_url(url)
        .expect("a valid Redis URL")
        .prefix("faults:")
        .timeout(Duration::from_millis(250))
}

/// The run's seed: `IDEM_FAULTS_SEED`, or the clock.
fn seed() -> u64 {
    std::env::var("IDEM_FAULTS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// Runs the ledger workload of `size` under every fault, checks the invariants, prints
/// the summary; panics when anything was lost or doubled, or another invariant broke.
pub async fn run(size: Size, drain_limit: Duration) {
    let started = Instant::now();
    let seed = seed();
    let mut random = SeededRandom::new(seed);
    let cluster = Arc::new(
        tokio::task::spawn_blocking(ThrowawayPostgres::start)
            .await
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic())),
    );
    let redis = ThrowawayRedis::start().await;
    let url = cluster.url();

    let counts = Arc::new(FaultCounts::default());
    let worker_pool = pool(&url, "ledger-worker", 16, false).await;
    let serializable_pool = pool(&url, "ledger-serializable", 4, true).await;
    let external_pool = pool(&url, "external-service", 6, false).await;
    let chaos_pool = pool(&url, "faults-chaos", 4, false).await;
    let idem = Idem::builder(worker_pool)
        .lock_timeout(LOCK_TIMEOUT)
        .max_attempts(ledger::MAX_ATTEMPTS)
        .transient_retries(8)
        .redis(cache(&redis.url()))
        .build()
        .expect("valid settings");
    let serializable = Idem::builder(serializable_pool)
        .lock_timeout(LOCK_TIMEOUT)
        .max_attempts(ledger::MAX_ATTEMPTS)
        .transient_retries(8)
        .redis(cache(&redis.url()))
        .build()
        .expect("valid settings");
    idem.migrate().await.expect("migrate the status table");
    sqlx::raw_sql(ledger::SCHEMA)
        .execute(&chaos_pool)
        .await
        .expect("create the ledger's tables");

    let plan = Plan::new(&size, &mut random);
    sqlx::query("INSERT INTO accounts (account) SELECT unnest($1::text[])")
        .bind(&plan.accounts)
        .execute(&chaos_pool)
        .await
        .expect("open the accounts");
    let mut kinds: BTreeMap<&'static str, usize> = BTreeMap::new();
    for message in &plan.messages {
        *kinds.entry(message.kind).or_default() += 1;
    }
    let messages = plan.messages.len();
    let settlement = Arc::new(Settlement::new(messages, &plan.queue));
    let hooks = Arc::new(Hooks::new(
        Arc::clone(&counts),
        external_pool,
        LOCK_TIMEOUT * 3,
    ));
    let run = Arc::new(Run {
        plan,
        settlement: Arc::clone(&settlement),
        hooks,
        idem: idem.clone(),
        serializable: serializable.clone(),
        counts: Arc::clone(&counts),
        abort_per_mille: AtomicU64::new(ABORTS_PER_MILLE),
    });

    // The chaos, then the workload.
    let redis = Arc::new(tokio::sync::Mutex::new(redis));
    let mut chaos = Chaos::default();
    chaos.kill_backends(chaos_pool.clone(), Arc::clone(&counts), random.fork(1));
    chaos.kill_commits(chaos_pool.clone(), Arc::clone(&counts), random.fork(2));
    chaos.restart_postgres(
        Arc::clone(&cluster),
        Arc::clone(&settlement),
        size.postgres_restarts,
        Arc::clone(&counts),
    );
    chaos.upset_redis(Arc::clone(&redis), Arc::clone(&counts), random.fork(3));
    chaos.race_retention(
        Idem::new(chaos_pool.clone()),
        Arc::clone(&counts),
        random.fork(4),
    );

    let mut deliverers = Vec::new();
    for n in 0..size.workers {
        let handle = if n == 0 {
            serializable.clone()
        } else {
            idem.clone()
        };
        deliverers.push(tokio::spawn(workers::one_by_one(
            Arc::clone(&run),
            handle,
            random.fork(10 + n as u64),
        )));
    }
    deliverers.push(tokio::spawn(workers::in_batches(
        Arc::clone(&run),
        size.batch_size,
        random.fork(9),
    )));
    let injectors = [
        chaos::lock_order_pairs(Arc::clone(&run), random.fork(5)),
        chaos::slow_bodies(Arc::clone(&run), random.fork(6)),
        chaos::outlived_leases(Arc::clone(&run), random.fork(7)),
    ];

    // The chaos lasts until the queue's first deliveries are all taken and the injectors
    // are through; then the rest settles in peace.
    for injector in injectors {
        injector.await.expect("an injector panicked");
    }
    while settlement.progress() < 1.0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    chaos.stop().await;
    run.abort_per_mille.store(0, Ordering::Relaxed);
    let chaos_ended = started.elapsed();

    let drained = tokio::time::timeout(drain_limit, async {
        for worker in deliverers {
            worker.await.expect("a worker panicked");
        }
    })
    .await;
    if drained.is_err() {
        let unsettled: Vec<String> = settlement
            .unsettled()
            .into_iter()
            .take(20)
            .map(|id| {
                let message = &run.plan.messages[id];
                format!("{} {} {:?}", id, message.kind, message.route)
            })
            .collect();
        panic!(
            "not every message settled within {drain_limit:?} after the chaos ended ({chaos_ended:?} in); \
             unsettled: {unsettled:?}\nthe end of the cluster's log:\n{}",
            cluster.log_tail()
        );
    }

    let checker = pool(&url, "faults-checks", 2, false).await;
    let verdict = invariants::check(&checker, &run.plan, &settlement).await;
    let cache_stats = [&idem, &serializable]
        .iter()
        .filter_map(|handle| handle.cache_stats())
        .fold((0, 0), |(errors, hits), stats| {
            (errors + stats.write_errors, hits + stats.hits)
        });
    let summary = Summary {
        seed,
        messages,
        kinds,
        deliveries: settlement.deliveries.load(Ordering::Relaxed),
        faults: counts.rows(),
        cache_write_errors: cache_stats.0,
        cache_hits: cache_stats.1,
        verdict: &verdict,
        wall_time: started.elapsed(),
    };
    println!("{summary}");
    for (label, found) in [
        ("lost", &verdict.lost),
        ("doubled", &verdict.doubled),
        ("broken", &verdict.violations),
    ] {
        for line in found.iter().take(20) {
            println!("  {label}: {line}");
        }
    }
    assert!(
        verdict.lost.is_empty() && verdict.doubled.is_empty() && verdict.violations.is_empty(),
        "the ledger lost {} and doubled {} message(s), {} other invariant(s) broken (seed {seed}); see above",
        verdict.lost.len(),
        verdict.doubled.len(),
        verdict.violations.len()
    );
    // Every kind of fault the run controls happened. (Deadlocks, serialization failures,
    // kills in COMMIT, refused completions and timed-out duplicates depend on timing: the
    // summary reports them.)
    let injected: BTreeMap<&str, u64> = counts.rows().into_iter().collect();
    for kind in REQUIRED_FAULTS {
        assert!(
            injected.get(kind).copied().unwrap_or(0) > 0,
            "no fault of kind {kind:?} was injected (seed {seed})"
        );
    }
    checker.close().await;
    idem.pool().close().await;
    serializable.pool().close().await;
    chaos_pool.close().await;
    drop(cluster);
}
