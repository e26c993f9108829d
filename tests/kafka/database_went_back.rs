//! A database that goes back (a failover to a standby that had not received the last
//! commits, a restore from a backup) loses effects and stored positions together. A member
//! with offsets in PostgreSQL notices that a stored position is behind one it saw
//! committed, and reads its partitions again from the stored positions: every fact ends up
//! applied exactly once, whether the member is idle when the database goes back (its next
//! check of the stored positions finds it) or busy (its next position write is refused).
//!
//! The database going back is made by SQL: a consistent copy of the business tables, the
//! status table and the stored positions taken mid-stream, put back later in one
//! transaction while the consumer runs.

use std::time::Duration;

use idem_demo::kafka::producer::{Plan, PlanConfig};
use idem_demo::kafka::verify;
use idem_kafka::OffsetStore;
use sqlx::PgPool;

use crate::support::{Harness, wait_while_progressing};

/// The tables whose rows go back: the demo's business tables, idem's status table and its
/// time buckets (the demo's handlers keep their keys by the fact's time), and the stored
/// positions.
const TABLES: [&str; 5] = [
    "order_effects",
    "order_totals",
    "idem.idem_keys",
    "idem.idem_timed_keys",
    "idem_kafka.kafka_offsets",
];

#[sqlx::test(migrations = false)]
async fn an_idle_member_goes_back_to_the_stored_positions(pool: PgPool) {
    went_back(pool, 1, false).await;
}

#[sqlx::test(migrations = false)]
async fn a_busy_batch_member_goes_back_to_the_stored_positions(pool: PgPool) {
    went_back(pool, 50, true).await;
}

async fn went_back(pool: PgPool, batch_size: usize, more_after: bool) {
    let harness = Harness::new(&pool, &format!("went-back-b{batch_size}"), 3).await;
    let plan = |part: &str, events: usize, seed: u64| {
        Plan::new(&PlanConfig {
            events,
            duplicate_rate: 0.2,
            malformed: 0,
            seed,
            order_prefix: format!("order-{}-{part}", harness.id),
            scatter_duplicates: false,
        })
    };
    let first = plan("a", 1_200, 3);
    let later = plan("b", 600, 4);
    let member = harness.batch_consumer("c0", OffsetStore::Postgres, batch_size);
    let stats = member.stats.clone();
    let produced = harness.produce(&first).await.unwrap();

    // A consistent copy of what the database holds about a third of the way in.
    wait_while_progressing(
        Duration::from_secs(90),
        || stats.snapshot().deliveries >= produced.records as u64 / 3,
        || stats.snapshot().deliveries,
        || format!("a third consumed: {:?}", stats.snapshot()),
    )
    .await;
    let mut copy = pool.begin().await.unwrap();
    sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *copy)
        .await
        .unwrap();
    for table in TABLES {
        let saved = saved_name(table);
        sqlx::raw_sql(&format!(
            "CREATE TABLE public.{saved} AS SELECT * FROM {table}"
        ))
        .execute(&mut *copy)
        .await
        .unwrap();
    }
    copy.commit().await.unwrap();
    let saved_effects: i64 =
        sqlx::query_scalar("SELECT count(*) FROM public.went_back_order_effects")
            .fetch_one(&pool)
            .await
            .unwrap();

    wait_while_progressing(
        Duration::from_secs(90),
        || stats.caught_up(&harness.topic, &produced.end_offsets),
        || stats.snapshot().deliveries,
        || format!("the first part consumed: {:?}", stats.snapshot()),
    )
    .await;

    // The database goes back to the copy, in one transaction, the consumer running.
    let mut back = pool.begin().await.unwrap();
    let locks = TABLES.join(", ");
    sqlx::raw_sql(&format!("LOCK TABLE {locks} IN ACCESS EXCLUSIVE MODE"))
        .execute(&mut *back)
        .await
        .unwrap();
    for table in TABLES {
        let saved = saved_name(table);
        sqlx::raw_sql(&format!(
            "DELETE FROM {table}; INSERT INTO {table} SELECT * FROM public.{saved}"
        ))
        .execute(&mut *back)
        .await
        .unwrap();
    }
    back.commit().await.unwrap();
    let lost = verify::verify(&pool, &first.events).await.unwrap();
    assert!(
        lost.missing > 0 && (saved_effects as usize) < first.events.len(),
        "the database lost effects: {lost}"
    );

    let mut events = first.events.clone();
    let mut end_offsets = produced.end_offsets.clone();
    if more_after {
        let produced = harness.produce(&later).await.unwrap();
        events.extend(later.events.iter().cloned());
        end_offsets = produced.end_offsets;
    }
    // Done when every fact is applied (and the member caught up again).
    let mut verification = verify::verify(&pool, &events).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !(verification.exactly_once() && stats.caught_up(&harness.topic, &end_offsets)) {
        assert!(
            std::time::Instant::now() < deadline,
            "not every fact applied exactly once after the database went back: {verification}; {:?}",
            stats.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        verification = verify::verify(&pool, &events).await.unwrap();
    }
    let snapshot = stats.snapshot();
    assert!(snapshot.rewinds > 0, "the member went back: {snapshot:?}");
    harness.stop(vec![member]).await;

    let verification = verify::verify(&pool, &events).await.unwrap();
    assert!(verification.exactly_once(), "{verification}");
    let charged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT attempts, status FROM idem.idem_keys \
         UNION ALL SELECT attempts, status FROM idem.idem_timed_keys) AS k \
         WHERE attempts > 1 OR status <> 'success'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(charged, 0, "no attempt charged, nothing parked");
    let dead = verify::dead_letters(&pool, &harness.group).await.unwrap();
    assert!(dead.is_empty(), "no dead letters: {dead:?}");
    eprintln!(
        "batch size {batch_size}: lost {} of {} facts, all applied again after {} rewinds",
        lost.missing,
        first.events.len(),
        snapshot.rewinds
    );
    harness.finish().await;
}

fn saved_name(table: &str) -> String {
    format!("went_back_{}", table.rsplit('.').next().unwrap_or(table))
}
