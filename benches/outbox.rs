//! What the outbox costs: a new message with one outgoing record against the same message
//! without, side by side, and the relay's throughput against the bare producer, in one
//! run.
//!
//! ```text
//! cargo bench --bench outbox                     # about 4 minutes
//! OUTBOX_BENCH_SECS=5 OUTBOX_BENCH_ROUNDS=2 OUTBOX_BENCH_RECORDS=20000 cargo bench --bench outbox
//! ```
//!
//! 1. **A new message.** 16 workers call an `#[idempotent]` handler on new keys for
//!    `OUTBOX_BENCH_SECS` (10) seconds: its body writes one row into `order_effects`
//!    (`plain`), the same and one record of about 200 bytes through `outbox::send`
//!    (`outbox`), or that while a relay publishes the records (`outbox+relay`). The shapes
//!    alternate their order every round; each prints messages per second and the WAL it
//!    wrote per message.
//! 2. **Publishing.** `OUTBOX_BENCH_RECORDS` (50,000) records of one shape are published
//!    by the relay out of the outbox (written with SQL first) until it is empty, and by a
//!    bare rdkafka producer with the relay's settings (idempotence, `acks=all`, the same
//!    key, payload and headers), each awaiting every acknowledgement: records per second.
//!
//! PostgreSQL at `DATABASE_URL` (database `idem_bench_outbox`, made again at the start);
//! the broker at `KAFKA_BROKERS`, or else a `tansu` of its own, thrown away at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_demo::kafka::admin;
use idem_demo::kafka::broker::LocalBroker;
use idem_kafka::outbox::{self, Record, Relay};
use idem_runtime::{Idem, idempotent};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgConnection, PgPool};

const WORKERS: usize = 16;
const DATABASE: &str = "idem_bench_outbox";

#[derive(Debug, Serialize)]
struct Order {
    order_id: String,
    event_type: &'static str,
    amount_cents: i64,
    memo: &'static str,
}

const MEMO: &str = "an order event of the bench, about two hundred bytes once it is encoded as JSON with its fields, like a small event";

#[idempotent(key = "order_id, event_type", scope = "bench.plain")]
async fn plain(tx: &mut PgConnection, order: &Order) -> Result<(), sqlx::Error> {
    effect(tx, order).await
}

#[idempotent(key = "order_id, event_type", scope = "bench.outbox")]
async fn with_outbox(tx: &mut PgConnection, order: &Order, topic: &str) -> Result<(), sqlx::Error> {
    effect(tx, order).await?;
    outbox::send(
        tx,
        Record::to(topic)
            .name("applied")
            .key(&order.order_id)
            .json(order)?,
    )
    .await?;
    Ok(())
}

async fn effect(tx: &mut PgConnection, order: &Order) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3)",
    )
    .bind(&order.order_id)
    .bind(order.event_type)
    .bind(order.amount_cents)
    .execute(&mut *tx)
    .await
    .map(|_| ())
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Shape {
    Plain,
    Outbox,
    OutboxWithRelay,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Plain => "plain",
            Shape::Outbox => "outbox",
            Shape::OutboxWithRelay => "outbox+relay",
        }
    }
}

async fn wal(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// One cell: messages per second and WAL bytes per message.
async fn cell(
    idem: &Idem,
    pool: &PgPool,
    shape: Shape,
    topic: &str,
    brokers: &str,
    secs: u64,
    round: usize,
) -> (f64, f64) {
    for statement in [
        "TRUNCATE order_effects, idem_kafka.kafka_outbox",
        "CHECKPOINT",
    ] {
        sqlx::raw_sql(statement).execute(pool).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let relay = (shape == Shape::OutboxWithRelay).then(|| {
        let relay = Arc::new(
            Relay::builder(brokers)
                .poll(Duration::from_millis(50))
                .build(idem)
                .unwrap(),
        );
        let running = relay.clone();
        let stop = stop.clone();
        let task = tokio::spawn(async move {
            running
                .run(async move {
                    while !stop.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
                .await
        });
        (relay, task)
    });
    let done = Arc::new(AtomicU64::new(0));
    let before = wal(pool).await;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let (idem, done, topic) = (idem.clone(), done.clone(), topic.to_owned());
        workers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                let order = Order {
                    order_id: format!("{}-{round}-{worker}-{n}", shape.name()),
                    event_type: "paid",
                    amount_cents: 1250,
                    memo: MEMO,
                };
                let outcome = match shape {
                    Shape::Plain => plain(&idem, &order).await.map(|_| ()),
                    _ => with_outbox(&idem, &order, &topic).await.map(|_| ()),
                };
                outcome.expect("a new message runs");
                n += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = wal(pool).await;
    stop.store(true, Ordering::Relaxed);
    if let Some((_, task)) = relay {
        task.await.unwrap().unwrap();
    }
    let count = done.load(Ordering::Relaxed) as f64;
    (count / elapsed, (after - before) as f64 / count.max(1.0))
}

fn producer(brokers: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "5")
        .create()
        .unwrap()
}

fn payload() -> Vec<u8> {
    serde_json::to_vec(&Order {
        order_id: "order-000000".to_owned(),
        event_type: "paid",
        amount_cents: 1250,
        memo: MEMO,
    })
    .unwrap()
}

/// The relay draining `records` records written by SQL: records per second.
async fn relay_rate(idem: &Idem, pool: &PgPool, brokers: &str, topic: &str, records: u64) -> f64 {
    sqlx::query(
        "INSERT INTO idem_kafka.kafka_outbox (shard, topic, record_key, payload, header_names, header_values, idem_key)
         SELECT g % 16, $1, convert_to('order-' || g, 'UTF8'), $2, '{traceparent}',
                ARRAY[convert_to('00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', 'UTF8')],
                md5(g::text)::uuid
         FROM generate_series(1, $3) AS g",
    )
    .bind(topic)
    .bind(payload())
    .bind(records as i64)
    .execute(pool)
    .await
    .unwrap();
    let relay = Relay::builder(brokers).batch(1000).build(idem).unwrap();
    let started = Instant::now();
    let mut published = 0;
    while published < records {
        published += relay.run_once().await.unwrap();
    }
    let rate = records as f64 / started.elapsed().as_secs_f64();
    sqlx::query("DELETE FROM idem_kafka.kafka_outbox_relays")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("TRUNCATE idem_kafka.kafka_outbox")
        .execute(pool)
        .await
        .unwrap();
    rate
}

/// A bare producer sending `records` records like the relay's: records per second.
async fn producer_rate(brokers: &str, topic: &str, records: u64) -> f64 {
    let producer = producer(brokers);
    let payload = payload();
    let started = Instant::now();
    let mut pending = Vec::with_capacity(1000);
    for n in 0..records {
        let key = format!("order-{n}");
        let idem_key = uuid::Uuid::new_v4().to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "traceparent",
                value: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            })
            .insert(Header {
                key: "idem-key",
                value: Some(&idem_key),
            });
        let record = FutureRecord::to(topic)
            .key(&key)
            .payload(&payload)
            .headers(headers);
        pending.push(
            producer
                .send_result(record)
                .map_err(|(error, _)| error)
                .unwrap(),
        );
        if pending.len() == 1000 {
            for delivery in pending.drain(..) {
                delivery.await.unwrap().map_err(|(error, _)| error).unwrap();
            }
        }
    }
    for delivery in pending {
        delivery.await.unwrap().map_err(|(error, _)| error).unwrap();
    }
    records as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let secs = env("OUTBOX_BENCH_SECS", 10);
    let rounds = env("OUTBOX_BENCH_ROUNDS", 3) as usize;
    let records = env("OUTBOX_BENCH_RECORDS", 50_000);
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let server: PgConnectOptions = url.parse().expect("DATABASE_URL");
    let mut admin_conn = server.connect().await.unwrap();
    for statement in [
        format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"),
        format!("CREATE DATABASE {DATABASE}"),
    ] {
        sqlx::raw_sql(&statement)
            .execute(&mut admin_conn)
            .await
            .unwrap();
    }
    let pool = PgPoolOptions::new()
        .max_connections(WORKERS as u32 + 4)
        .connect_with(server.clone().database(DATABASE))
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE order_effects (id bigserial PRIMARY KEY, order_id text NOT NULL,
                                     event_type text NOT NULL, amount_cents bigint NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let idem = Idem::new(pool.clone());
    idem.migrate().await.unwrap();
    idem_kafka::migrate(&idem, &idem_kafka::Schema::for_idem(&idem))
        .await
        .unwrap();
    // A broker of its own unless one is named: the bench writes some 10^5 records, and
    // tansu's storage slows down as it grows.
    let (_broker, brokers) = match std::env::var("KAFKA_BROKERS") {
        Ok(brokers) => (None, brokers),
        Err(_) => {
            let broker = LocalBroker::private().unwrap_or_else(|error| panic!("{error}"));
            let brokers = broker.brokers().to_owned();
            (Some(broker), brokers)
        }
    };
    admin::wait_for_broker(&brokers, Duration::from_secs(30))
        .await
        .unwrap();
    let topic = format!(
        "outbox-bench-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    admin::create_topic(&brokers, &topic, 4).await.unwrap();

    println!(
        "== a new message, {WORKERS} workers, {secs} s a cell, {rounds} rounds (the order alternating)"
    );
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>8} {:>8} {:>10} {:>10} {:>10}",
        "round",
        "plain msg/s",
        "outbox msg/s",
        "+relay msg/s",
        "outbox",
        "+relay",
        "plain WAL",
        "outbox WAL",
        "+relay WAL"
    );
    let shapes = [Shape::Plain, Shape::Outbox, Shape::OutboxWithRelay];
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let mut order = shapes.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut got = std::collections::HashMap::new();
        for shape in order {
            got.insert(
                shape.name(),
                cell(&idem, &pool, shape, &topic, &brokers, secs, round).await,
            );
        }
        let (p, o, r) = (got["plain"], got["outbox"], got["outbox+relay"]);
        ratios.push((o.0 / p.0, r.0 / p.0));
        println!(
            "{round:>6} {:>14.0} {:>14.0} {:>14.0} {:>8.3} {:>8.3} {:>10.0} {:>10.0} {:>10.0}",
            p.0,
            o.0,
            r.0,
            o.0 / p.0,
            r.0 / p.0,
            p.1,
            o.1,
            r.1
        );
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let outbox = median(ratios.iter().map(|r| r.0).collect());
    let relay = median(ratios.iter().map(|r| r.1).collect());
    println!(
        "median: a new message with one outgoing record runs at {outbox:.3}x the same without (the outbox row costs {:.1} %); with the relay publishing meanwhile {relay:.3}x ({:.1} %)",
        (1.0 - outbox) * 100.0,
        (1.0 - relay) * 100.0
    );

    println!("== publishing {records} records, 4 partitions, 2 rounds (the order alternating)");
    println!(
        "{:>6} {:>14} {:>14} {:>8}",
        "round", "relay rec/s", "bare rec/s", "ratio"
    );
    for round in 0..2 {
        let (relay, bare) = if round % 2 == 0 {
            let relay = relay_rate(&idem, &pool, &brokers, &topic, records).await;
            (relay, producer_rate(&brokers, &topic, records).await)
        } else {
            let bare = producer_rate(&brokers, &topic, records).await;
            (
                relay_rate(&idem, &pool, &brokers, &topic, records).await,
                bare,
            )
        };
        println!(
            "{round:>6} {relay:>14.0} {bare:>14.0} {:>8.3}",
            relay / bare
        );
    }
    pool.close().await;
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        .execute(&mut admin_conn)
        .await
        .ok();
}
