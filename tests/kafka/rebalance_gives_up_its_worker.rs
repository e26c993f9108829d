//! The rebalance callback blocks while it reads the stored offsets (offsets in
//! PostgreSQL). On a multi-threaded runtime it gives up its worker meanwhile, so that
//! what the read goes through on that runtime (an in-process tunnel or proxy to the
//! database) goes on. With a single worker, a callback that kept it would wait for its own
//! read until the read timed out, and the member would start at Kafka's committed offsets
//! (here none: the topic's start) instead of the stored ones.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::{Harness, wait_until};
use idem_demo::kafka::producer::{Plan, PlanConfig};
use idem_kafka::{OffsetStore, Position, Schema};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// The records published; the stored position leaves the last [`AFTER_STORED`] of them.
const EVENTS: usize = 20;
const AFTER_STORED: i64 = 5;

#[sqlx::test(migrations = false)]
async fn a_member_on_one_worker_reads_its_stored_offsets_through_a_proxy_on_that_worker(
    pool: PgPool,
) {
    let options = pool.connect_options().as_ref().clone();
    // sqlx's test runtime has one thread and no workers: the scenario runs on a
    // multi-threaded runtime with one worker, on a thread of its own (which ends with it).
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
            .block_on(scenario(options))
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

async fn scenario(options: sqlx::postgres::PgConnectOptions) {
    let target = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = proxy_on_this_runtime(target).await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    let harness = Harness::through_proxy(&pool, "worker", 1, proxy).await;
    let plan = Plan::new(&PlanConfig {
        events: EVENTS,
        duplicate_rate: 0.0,
        malformed: 0,
        seed: 3,
        order_prefix: format!("order-{}", harness.id),
        scatter_duplicates: false,
    });
    let produced = harness.produce(&plan).await.unwrap();
    let end = produced.end_offsets[&0];
    assert_eq!(end, EVENTS as i64, "every record on the one partition");
    // The group's position as a handler's transaction stores it; Kafka has none.
    let stored = end - AFTER_STORED;
    let schema = Schema::for_idem(&harness.idem);
    let mut conn = harness.pool.acquire().await.unwrap();
    Position::new(&schema, &harness.group, &harness.topic, 0, stored)
        .store(&mut conn)
        .await
        .unwrap();
    drop(conn);

    let member = harness.consumer("c0", OffsetStore::Postgres);
    let stats = member.stats.clone();
    wait_until(
        Duration::from_secs(60),
        || stats.caught_up(&harness.topic, &produced.end_offsets),
        || format!("consumed to the end: {:?}", stats.snapshot()),
    )
    .await;
    harness.stop(vec![member]).await;
    let after = stats.snapshot();
    assert_eq!(
        after.deliveries, AFTER_STORED as u64,
        "the member started at the stored offset {stored}, not at the topic's start: {after:?}"
    );
    harness.finish().await;
}

/// A TCP proxy to `target` whose tasks run on the current runtime, as an in-process tunnel
/// to the database does.
async fn proxy_on_this_runtime(target: String) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(&target).await {
                    tokio::io::copy_bidirectional(&mut client, &mut server)
                        .await
                        .ok();
                }
            });
        }
    });
    address
}
