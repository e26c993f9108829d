//! The relay when the broker is not there or does not keep up: a broker out of reach or a
//! full producer queue counts no attempt and parks nothing, and the records go out in
//! order once it takes them; a record to a topic that does not exist is parked without
//! holding up the other shards; a relay asked to stop with a backlog stops after its round.

use std::time::{Duration, Instant};

use idem_kafka::Schema;
use idem_kafka::outbox::{self, Record, Relay};
use sqlx::{Connection, PgPool};

use crate::support::Harness;

/// Writes `count` records for `topic`, outside a handler's body, over `keys` Kafka keys;
/// the payload of record `i` is `i`.
async fn write(pool: &PgPool, topic: &str, count: usize, keys: usize) {
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let records = (0..count).map(|i| {
        Record::to(topic)
            .key(format!("k{}", i % keys))
            .payload(i.to_string())
            .idempotency_key(uuid::Uuid::new_v4())
    });
    outbox::send_all(&mut tx, records).await.unwrap();
    tx.commit().await.unwrap();
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Publishes with `relay` until nothing waits, or panics after `limit`.
async fn drain(relay: &Relay, pool: &PgPool, limit: Duration) {
    let started = Instant::now();
    while count(
        pool,
        "SELECT count(*) FROM idem_kafka.kafka_outbox WHERE sent_at IS NULL AND parked_at IS NULL",
    )
    .await
        > 0
    {
        let left = limit.saturating_sub(started.elapsed());
        tokio::time::timeout(left, relay.run_once())
            .await
            .unwrap_or_else(|_| panic!("the outbox did not drain in {limit:?}"))
            .unwrap();
    }
}

/// The payloads published to `topic`, in the order of its single partition.
async fn published(harness: &Harness, topic: &str, expected: usize) -> Vec<String> {
    use rdkafka::Message as _;
    use rdkafka::consumer::{Consumer as _, StreamConsumer};
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &harness.brokers)
        .set("group.id", format!("{topic}-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut read = Vec::new();
    while read.len() < expected {
        let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("the published records are read back")
            .unwrap();
        read.push(String::from_utf8(message.payload().unwrap().to_vec()).unwrap());
    }
    read
}

/// In order within each key (the payloads `i` of key `i % keys` increase).
fn in_order_per_key(payloads: &[String], keys: usize) {
    let mut last = vec![-1_i64; keys];
    for payload in payloads {
        let i: i64 = payload.parse().unwrap();
        let key = (i as usize) % keys;
        assert!(last[key] < i, "record {i} after {} of key {key}", last[key]);
        last[key] = i;
    }
}

#[sqlx::test(migrations = false)]
async fn a_broker_out_of_reach_parks_nothing_and_the_records_go_out_in_order(pool: PgPool) {
    let harness = Harness::new(&pool, "relay-outage", 1).await;
    write(&harness.pool, &harness.topic, 60, 3).await;

    // No broker: every round fails for the broker's reasons, none counts an attempt.
    let nowhere = Relay::builder("127.0.0.1:1")
        .set("message.timeout.ms", "1000")
        .max_attempts(2)
        .build(&harness.idem)
        .unwrap();
    for _ in 0..3 {
        nowhere.run_once().await.unwrap();
    }
    assert!(nowhere.stats().failed() > 0, "the rounds failed");
    assert_eq!(nowhere.stats().parked(), 0);
    assert_eq!(
        count(
            &harness.pool,
            "SELECT count(*) FROM idem_kafka.kafka_outbox WHERE attempts > 0 OR parked_at IS NOT NULL"
        )
        .await,
        0,
        "no attempt counted, nothing parked"
    );
    drop(nowhere);

    // A producer queue of 10 records: a round takes what fits, the rest waits its turn.
    let narrow = Relay::builder(&harness.brokers)
        .set("queue.buffering.max.messages", "10")
        .max_attempts(2)
        .build(&harness.idem)
        .unwrap();
    drain(&narrow, &harness.pool, Duration::from_secs(120)).await;
    assert_eq!(narrow.stats().parked(), 0);
    assert_eq!(narrow.stats().published(), 60);
    let payloads = published(&harness, &harness.topic, 60).await;
    in_order_per_key(&payloads, 3);
    harness.finish().await;
}

#[sqlx::test(migrations = false)]
async fn a_record_to_a_topic_that_does_not_exist_is_parked_without_holding_up_others(pool: PgPool) {
    let harness = Harness::new(&pool, "relay-no-topic", 1).await;
    let missing = format!("{}-missing", harness.topic);
    write(&harness.pool, &missing, 1, 1).await;
    write(&harness.pool, &harness.topic, 40, 8).await;
    // Handed to the producer, the record would wait ten minutes for its topic, and every
    // round with it: the drain's two minutes tell that it was parked before.
    let relay = Relay::builder(&harness.brokers)
        .set("message.timeout.ms", "600000")
        .set("topic.metadata.propagation.max.ms", "600000")
        .build(&harness.idem)
        .unwrap();
    let started = Instant::now();
    drain(&relay, &harness.pool, Duration::from_secs(120)).await;
    assert_eq!(relay.stats().published(), 40);
    let parked = outbox::admin::parked(&harness.idem, &Schema::for_idem(&harness.idem), 10)
        .await
        .unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(parked[0].topic, missing);
    let error = parked[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("does not exist") || error.contains("Unknown topic"),
        "{error}"
    );
    eprintln!(
        "the outbox drained in {:?}; the missing topic's record was parked with: {:?}",
        started.elapsed(),
        parked[0].error
    );
    // The other records did not wait for it: they are all out, in order.
    let payloads = published(&harness, &harness.topic, 40).await;
    in_order_per_key(&payloads, 8);
    harness.finish().await;
}

#[sqlx::test(migrations = false)]
async fn a_relay_asked_to_stop_with_a_backlog_stops_after_its_round(pool: PgPool) {
    let harness = Harness::new(&pool, "relay-stop", 1).await;
    write(&harness.pool, &harness.topic, 400, 4).await;
    let relay = Relay::builder(&harness.brokers)
        .batch(5)
        .build(&harness.idem)
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), relay.run(async {}))
        .await
        .expect("the relay stopped")
        .unwrap();
    let published = relay.stats().published();
    assert!(
        published < 400,
        "it stopped before the backlog was out: {published} published"
    );
    // It gave its shards up: another relay takes them at once and publishes the rest.
    let next = Relay::builder(&harness.brokers)
        .build(&harness.idem)
        .unwrap();
    drain(&next, &harness.pool, Duration::from_secs(60)).await;
    assert_eq!(published + next.stats().published(), 400);
    harness.finish().await;
}

#[sqlx::test(migrations = false)]
async fn a_relay_waiting_on_the_broker_keeps_its_shards(pool: PgPool) {
    let harness = Harness::new(&pool, "relay-keeps", 1).await;
    let missing = format!("{}-missing", harness.topic);
    write(&harness.pool, &missing, 1, 1).await;
    write(&harness.pool, &harness.topic, 30, 6).await;
    // The first relay takes every shard, then waits on the missing topic's record longer
    // than its lease; the second stands by meanwhile.
    let build = || {
        Relay::builder(&harness.brokers)
            .lease(Duration::from_secs(3))
            .poll(Duration::from_millis(100))
            .set("message.timeout.ms", "8000")
            .build(&harness.idem)
            .unwrap()
    };
    let (first, second) = (build(), build());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    async fn run(relay: &Relay, mut stopped: tokio::sync::watch::Receiver<bool>) {
        relay
            .run(async move {
                stopped.wait_for(|stop| *stop).await.ok();
            })
            .await
            .unwrap();
    }
    let waiting = async {
        let started = Instant::now();
        while count(
            &harness.pool,
            "SELECT count(*) FROM idem_kafka.kafka_outbox WHERE sent_at IS NULL AND parked_at IS NULL",
        )
        .await
            > 0
        {
            assert!(started.elapsed() < Duration::from_secs(90), "the outbox drained");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.send(true).ok();
    };
    let first_running = run(&first, stopped.clone());
    let second_running = async {
        // Started once the first holds the shards.
        tokio::time::sleep(Duration::from_millis(500)).await;
        run(&second, stopped.clone()).await;
    };
    tokio::join!(first_running, second_running, waiting);
    assert_eq!(
        second.stats().published(),
        0,
        "the standby took no shard from a relay that was waiting on the broker"
    );
    assert_eq!(first.stats().published(), 30);
    // Each record went out once.
    let payloads = published(&harness, &harness.topic, 30).await;
    let mut sorted: Vec<i64> = payloads.iter().map(|p| p.parse().unwrap()).collect();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..30).collect::<Vec<_>>());
    harness.finish().await;
}
