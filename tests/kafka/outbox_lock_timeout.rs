//! A body's records are written by its commit under idem's lock timeout: a commit that
//! waits for another transaction holding the lock of the same topic and Kafka key gives
//! up after the handle's `lock_timeout`, without counting an attempt, and the message's
//! next delivery goes through once the lock is free.

use std::time::{Duration, Instant};

use idem_kafka::outbox::{self, Record};
use idem_runtime::{Disposition, Idem, idempotent};
use sqlx::{Connection, PgConnection, PgPool};

use crate::support::Harness;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Fact {
    fact_id: String,
}

#[idempotent(key = "fact_id", scope = "lock_timeout.send")]
async fn send_hot(tx: &mut PgConnection, fact: &Fact, topic: &str) -> Result<(), sqlx::Error> {
    outbox::send(tx, Record::to(topic).name("hot").key("hot").payload("x")).await?;
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_commit_waits_for_a_record_s_lock_at_most_the_lock_timeout(pool: PgPool) {
    let harness = Harness::new(&pool, "outbox-lock-timeout", 1).await;
    let idem = Idem::builder(harness.idem.pool().clone())
        .lock_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    // Another transaction sends for the same topic and key and stays open.
    let mut other = harness.pool.acquire().await.unwrap();
    let mut open = other.begin().await.unwrap();
    outbox::send(
        &mut open,
        Record::to(harness.topic.as_str())
            .key("hot")
            .idempotency_key(uuid::Uuid::from_u128(7)),
    )
    .await
    .unwrap();

    let fact = Fact {
        fact_id: "f-1".to_owned(),
    };
    let started = Instant::now();
    let error = tokio::time::timeout(
        Duration::from_secs(30),
        send_hot(&idem, &fact, &harness.topic),
    )
    .await
    .expect("the commit still waits for the lock after 30 s")
    .unwrap_err();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(4),
        "the commit waited {waited:?} for the lock"
    );
    assert_eq!(error.disposition(), Disposition::Retry, "{error}");
    let record = idem
        .record("lock_timeout.send", key_of(&fact))
        .await
        .unwrap();
    assert_eq!(
        record.map_or(0, |record| record.attempts),
        0,
        "a lock timeout counts no attempt"
    );

    // The lock free, the next delivery goes through.
    open.commit().await.unwrap();
    send_hot(&idem, &fact, &harness.topic).await.unwrap();
    let written: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idem_kafka.kafka_outbox WHERE payload = '\\x78'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(written, 1);
    drop(other);
    harness.finish().await;
}

fn key_of(fact: &Fact) -> idem_runtime::IdempotencyKey {
    idem_runtime::key::key_of(&[&fact.fact_id]).unwrap()
}
