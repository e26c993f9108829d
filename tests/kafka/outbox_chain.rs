//! Exactly once across two hops: facts on topic A, handled by `apply_fact` (a business
//! row and two outgoing records through the outbox), published by relays to topic B,
//! handled by `receive` (a business row per record, keyed on the record's `idem-key`).
//! Duplicates of the first facts are sent at the start; a handler-1 member is killed and
//! replaced, a relay is killed after the broker acknowledged a round and before it marked
//! it sent (its records are published again by the relay that takes its shards over), and
//! every backend of the database is killed three times. At the end every fact has one row
//! of handler 1 and exactly its two rows of handler 2, in order per Kafka key, and the
//! outbox is drained. Both hops keep their keys by the fact's time (`event_time`), the
//! second by the time that the records carry.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use idem_demo::kafka::admin;
use idem_demo::kafka::producer::create_producer;
use idem_kafka::outbox::{self, Record, Relay};
use idem_kafka::{Consumer, Fate, Handler, Keyed, OffsetStore, Position, Received, Stats};
use idem_runtime::{Idem, idempotent};
use rdkafka::producer::FutureRecord;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio::sync::watch;

use crate::support::{Harness, total};

const FACTS: usize = 400;
const ACCOUNTS: usize = 10;
const DUPLICATED: usize = 40;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Fact {
    fact_id: String,
    account: String,
    seq: i64,
    /// When the fact happened: the same in every send of the fact.
    occurred_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Outgoing {
    fact_id: String,
    account: String,
    seq: i64,
    kind: String,
    /// The fact's time, for the next hop to keep its keys by.
    occurred_at: DateTime<Utc>,
}

/// The time of the facts of this test process: the facts' times are a microsecond apart
/// from it.
static FACTS_FROM: LazyLock<DateTime<Utc>> = LazyLock::new(Utc::now);

/// Handler 1: the fact's row, and a receipt and a stock reservation for topic B, keyed by
/// account, in the claim's transaction. Its keys are kept by the fact's time.
#[idempotent(
    key = "fact_id, occurred_at",
    event_time = "occurred_at",
    scope = "chain.apply_fact"
)]
async fn apply_fact(tx: &mut PgConnection, fact: &Fact, topic_b: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO chain_applied (fact_id, account, seq) VALUES ($1, $2, $3)")
        .bind(&fact.fact_id)
        .bind(&fact.account)
        .bind(fact.seq)
        .execute(&mut *tx)
        .await?;
    let record = |kind: &str| {
        let out = Outgoing {
            fact_id: fact.fact_id.clone(),
            account: fact.account.clone(),
            seq: fact.seq,
            kind: kind.to_owned(),
            occurred_at: fact.occurred_at,
        };
        Record::to(topic_b).name(kind).key(&fact.account).json(&out)
    };
    outbox::send_all(tx, [record("receipt")?, record("stock")?]).await?;
    Ok(())
}

/// Handler 2: one row per outgoing record, however often it arrives; its keys kept by the
/// first fact's time, which the record carries.
#[idempotent(
    key = "idem_key, message.occurred_at",
    event_time = "message.occurred_at",
    scope = "chain.receive"
)]
async fn receive(tx: &mut PgConnection, out: &Keyed<Outgoing>) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO chain_received (idem_key, fact_id, account, seq, kind) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(out.idem_key)
    .bind(&out.message.fact_id)
    .bind(&out.message.account)
    .bind(out.message.seq)
    .bind(&out.message.kind)
    .execute(&mut *tx)
    .await
    .map(|_| ())
}

struct Facts {
    topic_b: String,
}

impl Handler for Facts {
    type Message = Fact;
    fn decode(&self, payload: &[u8]) -> Result<Fact, String> {
        idem_kafka::decode_json(payload)
    }
    async fn handle(&self, idem: &Idem, fact: &Fact, _: Option<&Position>) -> Fate {
        Fate::of(apply_fact(idem, fact, &self.topic_b).await)
    }
}

struct Receipts;

impl Handler for Receipts {
    type Message = Keyed<Outgoing>;
    fn decode(&self, _: &[u8]) -> Result<Keyed<Outgoing>, String> {
        Err("decoded with its headers".to_owned())
    }
    fn decode_received(&self, received: &Received<'_>) -> Result<Keyed<Outgoing>, String> {
        Keyed::decode_json(received)
    }
    async fn handle(&self, idem: &Idem, out: &Keyed<Outgoing>, _: Option<&Position>) -> Fate {
        Fate::of(receive(idem, out).await)
    }
}

fn fact(index: usize) -> Fact {
    Fact {
        occurred_at: *FACTS_FROM + TimeDelta::microseconds(index as i64),
        fact_id: format!("fact-{index}"),
        account: format!("account-{}", index % ACCOUNTS),
        seq: index as i64,
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap_or(-1)
}

/// Reads `count` records of `topic` from its start: each one's fact, `traceparent` and
/// `idem-key` headers.
async fn traces_of(brokers: &str, topic: &str, count: usize) -> Vec<(String, String, String)> {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer as _, StreamConsumer};
    use rdkafka::message::Headers;
    let reader: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{topic}-trace-reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    reader.subscribe(&[topic]).unwrap();
    let mut read = Vec::new();
    while read.len() < count {
        let message = tokio::time::timeout(Duration::from_secs(30), reader.recv())
            .await
            .expect("records on the second topic")
            .unwrap();
        let header = |name: &str| {
            message.headers().and_then(|headers| {
                headers
                    .iter()
                    .find(|header| header.key == name)
                    .and_then(|header| header.value)
                    .map(|value| String::from_utf8_lossy(value).into_owned())
            })
        };
        let out: Outgoing = serde_json::from_slice(message.payload().unwrap()).unwrap();
        read.push((
            out.fact_id,
            header("traceparent").expect("a traceparent header"),
            header("idem-key").expect("an idem-key header"),
        ));
    }
    read
}

fn spawn_relay(
    harness: &Harness,
    stop: &watch::Sender<bool>,
) -> (
    Arc<Relay>,
    tokio::task::JoinHandle<Result<(), idem_kafka::ConsumerError>>,
) {
    let relay = Arc::new(
        Relay::builder(&harness.brokers)
            // Long enough that a loaded machine's pauses never cost the doomed relay its
            // shards before it is killed (its records published again are the point).
            .lease(Duration::from_secs(10))
            .poll(Duration::from_millis(100))
            .batch(50)
            .build(&harness.idem)
            .unwrap(),
    );
    let mut stopped = stop.subscribe();
    let running = relay.clone();
    let task = tokio::spawn(async move {
        running
            .run(async move {
                stopped.wait_for(|stop| *stop).await.ok();
            })
            .await
    });
    (relay, task)
}

#[sqlx::test(migrations = false)]
async fn every_fact_reaches_the_second_hop_once_in_order_through_kills(pool: PgPool) {
    let harness = Harness::new(&pool, "outbox-chain", 4).await;
    let topic_b = format!("{}-b", harness.topic);
    admin::create_topic(&harness.brokers, &topic_b, 4)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE chain_applied (fact_id text NOT NULL, account text NOT NULL, seq bigint NOT NULL);
         CREATE TABLE chain_received (id bigserial PRIMARY KEY, idem_key uuid NOT NULL, fact_id text NOT NULL,
                                      account text NOT NULL, seq bigint NOT NULL, kind text NOT NULL);",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (stop, _) = watch::channel(false);
    let t0 = std::time::Instant::now();

    // Handler 2 on topic B, its own group.
    let second = Consumer::builder(&harness.brokers, format!("{topic_b}-group"), &topic_b)
        .session_timeout(Duration::from_secs(6))
        .build(harness.idem.clone(), Receipts)
        .unwrap();
    let second_stats: Arc<Stats> = second.stats();
    let mut stopped = stop.subscribe();
    let second_task = tokio::spawn(second.run(async move {
        stopped.wait_for(|stop| *stop).await.ok();
    }));

    // Handler 1's members, and the first relay alone, so that it holds every shard.
    let facts = |name: &str| {
        harness.member(
            name,
            Facts {
                topic_b: topic_b.clone(),
            },
            |builder| builder.offsets(OffsetStore::Kafka),
        )
    };
    let first = facts("one");
    let other = facts("two");
    let (doomed_relay, doomed_task) = spawn_relay(&harness, &stop);
    let held = format!(
        "SELECT count(*) FROM idem_kafka.kafka_outbox_relays WHERE owner = '{}'",
        doomed_relay.id()
    );
    let started = std::time::Instant::now();
    while count(&pool, &held).await < i64::from(outbox::SHARDS) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the first relay takes the shards"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    eprintln!("phase: relay holds shards at {:?}", t0.elapsed());
    let producer = create_producer(&harness.brokers).unwrap();
    let send = async |index: usize| {
        let fact = fact(index);
        let payload = serde_json::to_vec(&fact).unwrap();
        producer
            .send(
                FutureRecord::to(&harness.topic)
                    .key(&fact.account)
                    .payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    };
    // Duplicates at the start: the first facts twice.
    for index in 0..DUPLICATED {
        send(index).await;
        send(index).await;
    }
    for index in DUPLICATED..FACTS / 2 {
        send(index).await;
    }
    let applied = || count(&pool, "SELECT count(DISTINCT fact_id) FROM chain_applied");
    let started = std::time::Instant::now();
    while applied().await < (FACTS / 4) as i64 {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "handler 1 applies facts"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A relay dies between the acknowledgement and the mark; a second one takes over once
    // its lease is out. A handler-1 member dies; a third joins. Backends die throughout.
    eprintln!("phase: a quarter applied at {:?}", t0.elapsed());
    doomed_relay.kill_switch().kill();
    let (relay, relay_task) = spawn_relay(&harness, &stop);
    first.kill.kill();
    first.task.abort();
    let third = facts("three");
    for index in FACTS / 2..FACTS {
        send(index).await;
        if index % 70 == 0 {
            sqlx::query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            .execute(&pool)
            .await
            .ok();
        }
    }
    assert!(
        tokio::time::timeout(Duration::from_secs(120), doomed_task)
            .await
            .is_ok(),
        "the killed relay stopped"
    );

    eprintln!("phase: doomed relay stopped at {:?}", t0.elapsed());
    let received = || {
        count(
            &pool,
            "SELECT count(DISTINCT (fact_id, kind)) FROM chain_received",
        )
    };
    let unsent = || {
        count(
            &pool,
            "SELECT count(*) FROM idem_kafka.kafka_outbox WHERE sent_at IS NULL",
        )
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (a, r, u) = (applied().await, received().await, unsent().await);
        if a == FACTS as i64 && r == 2 * FACTS as i64 && u == 0 {
            break;
        }
        if std::time::Instant::now() >= deadline {
            use rdkafka::consumer::Consumer as _;
            let probe: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &harness.brokers)
                .create()
                .unwrap();
            for partition in 0..4 {
                let marks = probe.fetch_watermarks(&topic_b, partition, Duration::from_secs(5));
                eprintln!("topic B partition {partition}: {marks:?}");
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out: {a} facts applied, {r} records received, {u} unsent; handler 2: {:?}, its task ended: {}",
            second_stats.snapshot(),
            second_task.is_finished()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    eprintln!("phase: drained at {:?}", t0.elapsed());
    // Exactly once on both hops.
    let applied_rows = count(&pool, "SELECT count(*) FROM chain_applied").await;
    let received_rows = count(&pool, "SELECT count(*) FROM chain_received").await;
    assert_eq!(applied_rows, FACTS as i64, "one row of handler 1 per fact");
    assert_eq!(
        received_rows,
        2 * FACTS as i64,
        "two rows of handler 2 per fact"
    );
    // Both hops kept their keys by the fact's time: in the time buckets, none in the
    // status table.
    let keys = |table: &str, scope: &str| {
        let sql = format!(
            "SELECT count(*) FROM idem.{table} WHERE scope = '{scope}' AND status = 'success'"
        );
        let pool = pool.clone();
        async move { count(&pool, &sql).await }
    };
    assert_eq!(
        keys("idem_timed_keys", "chain.apply_fact").await,
        FACTS as i64
    );
    assert_eq!(
        keys("idem_timed_keys", "chain.receive").await,
        2 * FACTS as i64
    );
    assert_eq!(keys("idem_keys", "chain.apply_fact").await, 0);
    assert_eq!(keys("idem_keys", "chain.receive").await, 0);
    // In order per Kafka key (account) and record name.
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT account, kind, seq FROM chain_received ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut last: HashMap<(String, String), i64> = HashMap::new();
    for (account, kind, seq) in rows {
        if let Some(previous) = last.insert((account.clone(), kind.clone()), seq) {
            assert!(
                previous < seq,
                "{account}/{kind}: {seq} arrived after {previous}"
            );
        }
    }
    let parked = count(
        &pool,
        "SELECT count(*) FROM idem_kafka.kafka_outbox WHERE parked_at IS NOT NULL",
    )
    .await;
    assert_eq!(parked, 0, "nothing parked");
    // The records carry their key and the handled message's trace: a fact's two records
    // share one trace id, each with a span id of its own.
    let traces = traces_of(&harness.brokers, &topic_b, 40).await;
    let mut by_fact: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for (fact_id, trace_parent, _key) in traces {
        let parts: Vec<&str> = trace_parent.split('-').collect();
        assert_eq!(parts.len(), 4, "{trace_parent}");
        assert!(
            parts[0] == "00" && parts[1].len() == 32 && parts[2].len() == 16,
            "{trace_parent}"
        );
        by_fact
            .entry(fact_id)
            .or_default()
            .push((parts[1].to_owned(), parts[2].to_owned()));
    }
    let pairs: Vec<_> = by_fact
        .values()
        .filter(|records| records.len() == 2)
        .collect();
    assert!(!pairs.is_empty(), "both records of some fact were read");
    for records in pairs {
        assert_eq!(records[0].0, records[1].0, "one trace per handled message");
        assert_ne!(records[0].1, records[1].1, "a span id per record");
    }
    eprintln!("phase: traces read at {:?}", t0.elapsed());
    let second_snapshot = second_stats.snapshot();
    eprintln!(
        "chain: {FACTS} facts ({DUPLICATED} sent twice), {applied_rows} rows of handler 1, {received_rows} of handler 2; \
         handler 2 received {} records, {} duplicates (records published again after the killed relay), \
         relays published {} + {}",
        second_snapshot.deliveries,
        second_snapshot.duplicates,
        doomed_relay.stats().published(),
        relay.stats().published(),
    );
    assert!(
        second_snapshot.duplicates > 0,
        "the relay killed before marking its round published it again"
    );

    stop.send(true).ok();
    relay_task.await.unwrap().unwrap();
    second_task.await.unwrap().unwrap();
    let first_snapshot = total(&[&other.stats, &third.stats]);
    eprintln!("handler 1: {first_snapshot:?}");
    harness.stop(vec![other, third]).await;
    harness.finish().await;
}

/// Handler 1 that fails after sending: by its own error, or by a statement that fails.
#[idempotent(key = "fact_id", scope = "chain.failing", max_attempts = 1)]
async fn fails_after_send(
    tx: &mut PgConnection,
    fact: &Fact,
    topic: &str,
) -> Result<(), sqlx::Error> {
    outbox::send(
        tx,
        Record::to(topic)
            .name("early")
            .key(&fact.account)
            .payload("x"),
    )
    .await?;
    if fact.seq % 2 == 0 {
        return Err(sqlx::Error::Protocol("the body gives up".to_owned()));
    }
    sqlx::query("SELECT 1 / 0").execute(&mut *tx).await?;
    Ok(())
}

/// Sends what it is told to, keyed by account.
#[idempotent(key = "fact_id", scope = "chain.sender")]
async fn send_payload(
    tx: &mut PgConnection,
    fact: &Fact,
    topic: &str,
    bytes: usize,
) -> Result<(), sqlx::Error> {
    outbox::send(
        tx,
        Record::to(topic)
            .name("only")
            .key(&fact.account)
            .payload(vec![b'x'; bytes]),
    )
    .await?;
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_rolled_back_body_publishes_nothing_and_a_dead_record_is_parked_alone(pool: PgPool) {
    let harness = Harness::new(&pool, "outbox-dead", 1).await;
    let idem = &harness.idem;
    let outbox_rows = || count(&pool, "SELECT count(*) FROM idem_kafka.kafka_outbox");

    // A body that fails after `send`, by its error or by a failed statement: nothing.
    for seq in [0, 1] {
        let fact = Fact {
            fact_id: format!("failing-{seq}"),
            account: "a".to_owned(),
            seq,
            occurred_at: *FACTS_FROM,
        };
        assert!(fails_after_send(idem, &fact, &harness.topic).await.is_err());
    }
    assert_eq!(outbox_rows().await, 0, "a rolled-back body sent nothing");

    // A record too large for the broker is parked with its error; the records around it,
    // of its key and of another, are published.
    let topic = harness.topic.as_str();
    let sent = |id: &str, account: &str, bytes: usize| {
        let fact = Fact {
            fact_id: id.to_owned(),
            account: account.to_owned(),
            seq: 0,
            occurred_at: *FACTS_FROM,
        };
        async move { send_payload(idem, &fact, topic, bytes).await.unwrap() }
    };
    sent("small-1", "k1", 10).await;
    sent("huge", "k1", 3_000_000).await;
    sent("small-2", "k1", 10).await;
    sent("other", "k2", 10).await;
    let relay = Relay::builder(&harness.brokers).build(idem).unwrap();
    // A busy broker may time a record out (it is then tried again): rounds until the
    // three are out, or a deadline far beyond the producer's timeout.
    let mut published = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while published < 3 && std::time::Instant::now() < deadline {
        published += relay.run_once().await.unwrap();
    }
    assert_eq!(
        published, 3,
        "the records around the dead one were published"
    );
    let schema = idem_kafka::Schema::for_idem(idem);
    let parked = outbox::admin::parked(idem, &schema, 10).await.unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    let error = parked[0].error.clone().unwrap_or_default();
    assert!(
        error.to_lowercase().contains("size") || error.to_lowercase().contains("large"),
        "{error}"
    );
    let summary = outbox::admin::summary(idem, &schema).await.unwrap();
    assert_eq!(
        (summary.unsent, summary.parked, summary.sent),
        (0, 1, 3),
        "{summary:?}"
    );

    // Put back in line, it fails again and is parked again: never retried by itself.
    assert_eq!(
        outbox::admin::retry(idem, &schema, Some(parked[0].id))
            .await
            .unwrap(),
        1
    );
    assert_eq!(relay.run_once().await.unwrap(), 0);
    assert_eq!(
        outbox::admin::parked(idem, &schema, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        relay.run_once().await.unwrap(),
        0,
        "a parked record stays parked"
    );
    assert_eq!(relay.stats().parked(), 2);

    // Retention: sent records older than the window go; unsent, parked and recent stay.
    sqlx::query(
        "UPDATE idem_kafka.kafka_outbox SET sent_at = now() - interval '8 days' \
         WHERE sent_at IS NOT NULL AND idem_key = (SELECT idem_key FROM idem_kafka.kafka_outbox \
                                                    WHERE sent_at IS NOT NULL ORDER BY id LIMIT 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(outbox::admin::purge(idem, &schema, week).await.unwrap(), 1);
    assert_eq!(outbox::admin::purge(idem, &schema, week).await.unwrap(), 0);
    let summary = outbox::admin::summary(idem, &schema).await.unwrap();
    assert_eq!((summary.parked, summary.sent), (1, 2), "{summary:?}");

    // Headers of several records in one statement stay with their records, in order.
    let mut tx = pool.begin().await.unwrap();
    let with = |n: u128, headers: &[(&str, &[u8])]| {
        headers.iter().fold(
            Record::to(topic)
                .idempotency_key(uuid::Uuid::from_u128(n))
                .payload("h"),
            |record, (name, value)| record.header(*name, value),
        )
    };
    outbox::send_all_in(
        &schema,
        &mut tx,
        [
            with(11, &[("a", b"1")]),
            with(12, &[]),
            with(13, &[("b", b"\0\xff"), ("c", b"")]),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let headers: Vec<(Vec<String>, Vec<Vec<u8>>)> = sqlx::query_as(
        "SELECT header_names, header_values FROM idem_kafka.kafka_outbox \
         WHERE idem_key IN ('00000000-0000-0000-0000-00000000000b', '00000000-0000-0000-0000-00000000000c', \
                            '00000000-0000-0000-0000-00000000000d') ORDER BY idem_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        headers,
        vec![
            (vec!["a".to_owned()], vec![b"1".to_vec()]),
            (vec![], vec![]),
            (
                vec!["b".to_owned(), "c".to_owned()],
                vec![b"\0\xff".to_vec(), Vec::new()]
            ),
        ]
    );
    harness.finish().await;
}

#[idempotent(key = "fact_id", scope = "chain.batch_each", batch = true)]
async fn send_each(tx: &mut PgConnection, fact: &Fact) -> Result<(), sqlx::Error> {
    outbox::send(
        tx,
        Record::to("batch-topic")
            .name("each")
            .key(&fact.account)
            .payload("e"),
    )
    .await?;
    Ok(())
}

#[idempotent(key = "fact_id", scope = "chain.batch_once")]
async fn send_once(tx: &mut PgConnection, facts: &[&Fact]) -> Result<(), sqlx::Error> {
    let records = facts.iter().enumerate().map(|(index, fact)| {
        Record::to("batch-topic")
            .name("once")
            .for_message(index)
            .key(&fact.account)
            .payload("o")
    });
    outbox::send_all(tx, records).await?;
    Ok(())
}

/// The key documented for an outgoing record: the parts "idem:outgoing", the scope, the
/// fact's key and the record's name.
fn documented_key(scope: &str, fact_id: &str, name: &str) -> uuid::Uuid {
    let fact = idem_runtime::key::key_of(&[&fact_id]).unwrap().as_uuid();
    idem_runtime::key::key_of(&[&"idem:outgoing", &scope, &fact, &name])
        .unwrap()
        .as_uuid()
}

#[sqlx::test(migrations = false)]
async fn batch_bodies_send_each_fact_s_records_under_its_own_key(pool: PgPool) {
    let idem = Idem::new(pool.clone());
    idem.migrate().await.unwrap();
    idem_kafka::migrate(&idem, &idem_kafka::Schema::for_idem(&idem))
        .await
        .unwrap();
    let facts: Vec<Fact> = (0..5).map(fact).collect();
    let keys = || async {
        sqlx::query_scalar::<_, uuid::Uuid>(
            "SELECT idem_key FROM idem_kafka.kafka_outbox ORDER BY id",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };

    // batch = true: the body once per message, in one transaction; then the same facts
    // again, duplicates that send nothing.
    for _ in 0..2 {
        for outcome in send_each_batch(&idem, &facts).await {
            outcome.unwrap();
        }
    }
    let expected: Vec<_> = facts
        .iter()
        .map(|fact| documented_key("chain.batch_each", &fact.fact_id, "each"))
        .collect();
    assert_eq!(keys().await, expected);

    // A batch handler: one body for the slice, each record following from its message.
    sqlx::query("TRUNCATE idem_kafka.kafka_outbox")
        .execute(&pool)
        .await
        .unwrap();
    for outcome in send_once(&idem, &facts).await {
        outcome.unwrap();
    }
    let mut got = keys().await;
    got.sort();
    let mut expected: Vec<_> = facts
        .iter()
        .map(|fact| documented_key("chain.batch_once", &fact.fact_id, "once"))
        .collect();
    expected.sort();
    assert_eq!(got, expected);
}

/// Sends for two Kafka keys, in an order that depends on the fact, with a pause between.
#[idempotent(key = "fact_id", scope = "chain.crossed")]
async fn crossed(tx: &mut PgConnection, fact: &Fact) -> Result<(), sqlx::Error> {
    let keys = if fact.seq % 2 == 0 {
        ["hot-a", "hot-b"]
    } else {
        ["hot-b", "hot-a"]
    };
    for (n, key) in keys.into_iter().enumerate() {
        outbox::send(
            tx,
            Record::to("crossed")
                .name(format!("r{n}"))
                .key(key)
                .payload("x"),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn bodies_sending_for_the_same_keys_in_opposite_orders_never_deadlock(pool: PgPool) {
    let idem = Idem::new(pool.clone());
    idem.migrate().await.unwrap();
    idem_kafka::migrate(&idem, &idem_kafka::Schema::for_idem(&idem))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for task in 0..16 {
        let idem = idem.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..10 {
                let fact = fact(task * 10 + n);
                let outcome = crossed(&idem, &fact).await;
                assert!(outcome.is_ok(), "{}: {:?}", fact.fact_id, outcome.err());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let rows = count(&pool, "SELECT count(*) FROM idem_kafka.kafka_outbox").await;
    assert_eq!(rows, 320, "two records of each of 160 facts");
    let (deadlocks,): (i64,) =
        sqlx::query_as("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        deadlocks, 0,
        "the records of a body take their locks in one order"
    );
}
