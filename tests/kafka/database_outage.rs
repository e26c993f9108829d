//! A database outage in the middle of consumption pauses the consumer: it retries the same
//! message until PostgreSQL is back, then goes on; no message is skipped, none is applied
//! twice, none is dead-lettered.

use std::time::Duration;

use crate::support::{Harness, wait_until, wait_while_progressing};
use idem_demo::kafka::producer::{Plan, PlanConfig};
use idem_demo::kafka::verify;
use idem_kafka::OffsetStore;
use sqlx::{Connection, Executor, PgConnection, PgPool};

#[sqlx::test(migrations = false)]
async fn a_database_outage_pauses_consumption_and_skips_nothing(pool: PgPool) {
    let harness = Harness::new(&pool, "outage", 2).await;
    let plan = Plan::new(&PlanConfig {
        events: 1_500,
        duplicate_rate: 0.2,
        malformed: 0,
        seed: 5,
        order_prefix: format!("order-{}", harness.id),
        scatter_duplicates: false,
    });
    let produced = harness.produce(&plan).await.unwrap();
    let member = harness.consumer("c0", OffsetStore::Kafka);
    let stats = member.stats.clone();
    wait_until(
        Duration::from_secs(60),
        || stats.snapshot().deliveries >= 300,
        || format!("300 messages consumed: {:?}", stats.snapshot()),
    )
    .await;

    // Cut the consumer off its database: refuse new connections, end the open ones.
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&harness.pool)
        .await
        .unwrap();
    let quoted = format!("\"{database}\"");
    let admin_options = harness
        .pool
        .connect_options()
        .as_ref()
        .clone()
        .database("postgres");
    let mut admin = PgConnection::connect_with(&admin_options).await.unwrap();
    admin
        .execute(format!("ALTER DATABASE {quoted} ALLOW_CONNECTIONS false").as_str())
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
        .bind(&database)
        .execute(&mut admin)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cut = stats.snapshot();
    let cut_positions = stats.positions();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = stats.snapshot();
    let during_positions = stats.positions();
    admin
        .execute(format!("ALTER DATABASE {quoted} ALLOW_CONNECTIONS true").as_str())
        .await
        .unwrap();
    admin.close().await.unwrap();

    assert!(
        during.retries > cut.retries,
        "the consumer retried during the outage: {cut:?} -> {during:?}"
    );
    assert_eq!(
        during.executed + during.duplicates + during.dead_letters,
        cut.executed + cut.duplicates + cut.dead_letters,
        "nothing was processed while the database was away"
    );
    // Messages go on arriving into the partitions' queues (up to their bound); what
    // pauses is their processing: no partition's position moves.
    assert_eq!(
        during_positions, cut_positions,
        "consumption paused on the failing messages"
    );

    wait_while_progressing(
        Duration::from_secs(60),
        || stats.caught_up(&harness.topic, &produced.end_offsets),
        || stats.snapshot().deliveries,
        || {
            format!(
                "consumed to the end after the outage: {:?}",
                stats.snapshot()
            )
        },
    )
    .await;
    harness.stop(vec![member]).await;

    let verification = verify::verify(&harness.pool, &plan.events).await.unwrap();
    assert!(verification.exactly_once(), "{verification}");
    let dead = verify::dead_letters(&harness.pool, &harness.group)
        .await
        .unwrap();
    assert!(dead.is_empty(), "no dead letters: {dead:?}");
    let after = stats.snapshot();
    assert_eq!(
        after.deliveries, produced.records as u64,
        "every message delivered once to this consumer"
    );
    harness.finish().await;
}
