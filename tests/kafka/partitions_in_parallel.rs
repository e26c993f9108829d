//! A member works the partitions it holds in parallel, each in order: with a millisecond
//! of round trip between it and PostgreSQL, one member holding six partitions applies
//! facts (one per transaction) several times as fast as with one delivery at a time;
//! a rebalance while deliveries are in flight on every partition, and a graceful stop,
//! apply every fact exactly once; retries on one partition hold up no other, also once
//! it has more messages than the member queues.
//!
//! Every application takes the next number of its partition's sequence in its own
//! transaction: sorted by it, each partition's facts were applied in offset order, each
//! once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_demo::kafka::producer;
use idem_kafka::{Consumer, ConsumerBuilder, ConsumerError, Fate, Handler, OffsetStore, Position};
use idem_kafka::{Received, Stats};
use idem_runtime::{Idem, idempotent};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;
use sqlx::{PgConnection, PgPool};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::slow_link::SlowLink;
use crate::support::{Harness, Stillness};

const PARTITIONS: i32 = 6;
/// The round trip the link adds between the members and PostgreSQL.
const ROUND_TRIP: Duration = Duration::from_millis(1);
/// How long a wait goes without progress before it fails: past the stall watch's
/// recovery of a member whose partitions the broker gave elsewhere (a stall bound of
/// twice the session, at most 60 s here, then a rejoin).
const PAST_RECOVERY: Duration = Duration::from_secs(150);

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS parallel_counters (
        run text NOT NULL, kafka_partition int NOT NULL, next bigint NOT NULL,
        PRIMARY KEY (run, kafka_partition));
    CREATE TABLE IF NOT EXISTS parallel_applied (
        run text NOT NULL, kafka_partition int NOT NULL, seq bigint NOT NULL,
        kafka_offset bigint NOT NULL, fact text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT clock_timestamp());";

/// A fact as the handler sees it: its id (the payload), where it was read, and the run
/// (consumer group) applying it.
#[derive(Debug, Clone)]
struct Fact {
    run: String,
    fact: String,
    partition: i32,
    offset: i64,
}

/// The fact's row, numbered in its partition's sequence, and the position (offsets in
/// PostgreSQL), in the claim's transaction.
#[idempotent(key = "run, fact", scope = "parallel.apply_fact")]
async fn apply_fact(
    tx: &mut PgConnection,
    fact: &Fact,
    position: Option<&Position>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH n AS (
            INSERT INTO parallel_counters (run, kafka_partition, next) VALUES ($1, $2, 1)
            ON CONFLICT (run, kafka_partition) DO UPDATE SET next = parallel_counters.next + 1
            RETURNING next)
         INSERT INTO parallel_applied (run, kafka_partition, seq, kafka_offset, fact)
         SELECT $1, $2, n.next, $3, $4 FROM n",
    )
    .bind(&fact.run)
    .bind(fact.partition)
    .bind(fact.offset)
    .bind(&fact.fact)
    .execute(&mut *tx)
    .await?;
    if let Some(position) = position {
        position.store(tx).await?;
    }
    Ok(())
}

/// Partition 0 held: its messages are retried while `held` is set.
#[derive(Debug, Default)]
struct Hold {
    held: AtomicBool,
    attempts: AtomicU64,
}

struct Facts {
    run: String,
    hold: Arc<Hold>,
}

impl Facts {
    fn new(run: &str) -> Self {
        Facts {
            run: run.to_owned(),
            hold: Arc::default(),
        }
    }
}

impl Handler for Facts {
    type Message = Fact;

    fn decode(&self, _: &[u8]) -> Result<Fact, String> {
        Err("decoded with its coordinates".to_owned())
    }

    fn decode_received(&self, received: &Received<'_>) -> Result<Fact, String> {
        let payload = received.payload().ok_or("no payload")?;
        Ok(Fact {
            run: self.run.clone(),
            fact: String::from_utf8(payload.to_vec()).map_err(|e| e.to_string())?,
            partition: received.partition(),
            offset: received.offset(),
        })
    }

    async fn handle(&self, idem: &Idem, fact: &Fact, position: Option<&Position>) -> Fate {
        if fact.partition == 0 && self.hold.held.load(Ordering::SeqCst) {
            self.hold.attempts.fetch_add(1, Ordering::SeqCst);
            return Fate::retry("partition 0 is held");
        }
        Fate::of(apply_fact(idem, fact, position).await)
    }

    fn stores_position(&self) -> bool {
        true
    }
}

/// A member of its own group, stopped on its own.
struct Running {
    stats: Arc<Stats>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ConsumerError>>,
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).ok();
        self.task.await.unwrap().unwrap();
    }
}

fn start(
    harness: &Harness,
    group: &str,
    name: &str,
    handler: Facts,
    configure: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder,
) -> Running {
    let builder = Consumer::builder(&harness.brokers, group, &harness.topic)
        .client_id(format!("{group}-{name}"))
        .session_timeout(Duration::from_secs(6));
    let consumer = configure(builder)
        .build(harness.idem.clone(), handler)
        .unwrap();
    let stats = consumer.stats();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async move {
        stopped.await.ok();
    }));
    Running { stats, stop, task }
}

/// Sends `per_partition` facts to every partition; returns how many each got.
async fn produce(harness: &Harness, per_partition: usize) -> BTreeMap<i32, i64> {
    let counts: Vec<(i32, usize)> = (0..PARTITIONS)
        .map(|partition| (partition, per_partition))
        .collect();
    produce_to(harness, &counts).await
}

/// Sends `counts` facts to each partition named; returns how many each got.
async fn produce_to(harness: &Harness, counts: &[(i32, usize)]) -> BTreeMap<i32, i64> {
    let producer = producer::create_producer(&harness.brokers).unwrap();
    let mut pending = Vec::new();
    for &(partition, count) in counts {
        for n in 0..count {
            let fact = format!("{}-{partition}-{n}", harness.id);
            let mut record = FutureRecord::<(), _>::to(&harness.topic)
                .partition(partition)
                .payload(fact.as_bytes());
            let delivery = loop {
                match producer.send_result(record) {
                    Ok(delivery) => break delivery,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err((error, _)) => panic!("producing: {error}"),
                }
            };
            pending.push(delivery);
        }
    }
    let mut sent = BTreeMap::new();
    for delivery in pending {
        let delivered = delivery
            .await
            .expect("a delivery report")
            .map_err(|(error, _)| error)
            .expect("the broker takes the record");
        *sent.entry(delivered.partition).or_insert(0) += 1;
    }
    sent
}

async fn applied(pool: &PgPool, run: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM parallel_applied WHERE run = $1")
        .bind(run)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Waits until `run` applied `total` facts, for as long as they keep coming.
async fn wait_applied(pool: &PgPool, run: &str, total: i64, what: &str) {
    let mut still = Stillness::new(PAST_RECOVERY, 0);
    loop {
        let now = applied(pool, run).await;
        if now >= total {
            return;
        }
        still.check(now as u64, || format!("{what}: {now} of {total} applied"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every fact of `run` applied once, each partition's in offset order, numbered without
/// gaps: `sent`, the facts sent to each partition.
async fn assert_once_in_order(pool: &PgPool, run: &str, sent: &BTreeMap<i32, i64>) {
    let rows: Vec<(i32, i64, i64, String)> = sqlx::query_as(
        "SELECT kafka_partition, seq, kafka_offset, fact FROM parallel_applied
         WHERE run = $1 ORDER BY kafka_partition, seq",
    )
    .bind(run)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut by_partition: BTreeMap<i32, Vec<(i64, i64, String)>> = BTreeMap::new();
    for (partition, seq, offset, fact) in rows {
        by_partition
            .entry(partition)
            .or_default()
            .push((seq, offset, fact));
    }
    let mut facts = std::collections::HashSet::new();
    for (&partition, &count) in sent {
        let rows = by_partition.remove(&partition).unwrap_or_default();
        assert_eq!(
            rows.len() as i64,
            count,
            "{run}: partition {partition}: every fact applied once"
        );
        for (n, window) in rows.windows(2).enumerate() {
            assert!(
                window[1].1 > window[0].1,
                "{run}: partition {partition}: application {} (offset {}) after application {} (offset {}): out of order",
                window[1].0,
                window[1].1,
                window[0].0,
                window[0].1,
            );
            assert_eq!(window[0].0, n as i64 + 1, "{run}: a sequence without gaps");
        }
        for (_, _, fact) in rows {
            assert!(facts.insert(fact.clone()), "{run}: {fact} applied twice");
        }
    }
    assert!(
        by_partition.is_empty(),
        "no other partition: {by_partition:?}"
    );
    let unfinished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idem.idem_keys WHERE status <> 'success'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(unfinished, 0, "every key succeeded");
}

/// Facts a second applied by `run`, between the 5th and the 95th percentile of its
/// applications (the group's forming left out).
async fn rate(pool: &PgPool, run: &str) -> f64 {
    let (count, seconds): (i64, f64) = sqlx::query_as(
        "WITH t AS (SELECT applied_at, percent_rank() OVER (ORDER BY applied_at) AS rank
                    FROM parallel_applied WHERE run = $1)
         SELECT count(*), extract(epoch FROM max(applied_at) - min(applied_at))::float8
         FROM t WHERE rank BETWEEN 0.05 AND 0.95",
    )
    .bind(run)
    .fetch_one(pool)
    .await
    .unwrap();
    count as f64 / seconds.max(0.001)
}

/// The round trip of `SELECT 1` through the link, the median of 50.
async fn measured_round_trip(idem: &Idem) -> Duration {
    let mut conn = idem.pool().acquire().await.unwrap();
    let mut times = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        sqlx::query("SELECT 1").execute(&mut *conn).await.unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

/// The link to the test's database, and a harness whose members reach it through it.
async fn slow_harness(pool: &PgPool, label: &str) -> (SlowLink, Harness) {
    let options = pool.connect_options();
    let target = format!("{}:{}", options.get_host(), options.get_port());
    let link = SlowLink::start(&target, ROUND_TRIP).unwrap();
    let harness = Harness::through_proxy(pool, label, PARTITIONS, link.address()).await;
    sqlx::raw_sql(SCHEMA).execute(&harness.pool).await.unwrap();
    (link, harness)
}

#[sqlx::test(migrations = false)]
async fn six_partitions_over_a_slow_link_are_applied_in_parallel_once_and_in_order(pool: PgPool) {
    const PER_PARTITION: usize = 300;
    let (_link, harness) = slow_harness(&pool, "parallel-rate").await;
    let round_trip = measured_round_trip(&harness.idem).await;
    let sent = produce(&harness, PER_PARTITION).await;
    let total: i64 = sent.values().sum();

    let mut rates = Vec::new();
    for bound in [1, PARTITIONS as usize] {
        let run = format!("{}-bound{bound}", harness.group);
        let member = start(&harness, &run, "m", Facts::new(&run), |builder| {
            builder.offsets(OffsetStore::Kafka).max_in_flight(bound)
        });
        wait_applied(
            &harness.pool,
            &run,
            total,
            &format!("one member, {bound} at once"),
        )
        .await;
        member.stop().await;
        assert_once_in_order(&harness.pool, &run, &sent).await;
        rates.push((bound, rate(&harness.pool, &run).await));
    }
    let (one, parallel) = (rates[0].1, rates[1].1);
    eprintln!(
        "{total} facts on {PARTITIONS} partitions, one per transaction, {round_trip:?} round trip to PostgreSQL: \
         {one:.0} facts/s one at a time, {parallel:.0} facts/s {PARTITIONS} at once ({:.1}x)",
        parallel / one
    );
    assert!(
        parallel >= 2.0 * one,
        "{PARTITIONS} partitions at once apply at least twice the rate of one at a time: {parallel:.0}/s against {one:.0}/s"
    );
    harness.finish().await;
}

#[sqlx::test(migrations = false)]
async fn a_rebalance_and_a_stop_with_deliveries_in_flight_apply_every_fact_once(pool: PgPool) {
    const PER_PARTITION: usize = 400;
    let (_link, harness) = slow_harness(&pool, "parallel-rebalance").await;
    let run = harness.group.clone();
    let total = PER_PARTITION as i64 * PARTITIONS as i64;
    let configure = |builder: ConsumerBuilder| {
        builder
            .offsets(OffsetStore::Postgres)
            .max_in_flight(PARTITIONS as usize)
    };
    let first = start(&harness, &run, "first", Facts::new(&run), configure);
    let sent = produce(&harness, PER_PARTITION).await;
    assert_eq!(sent.values().sum::<i64>(), total);

    // A second member joins while the first works all six partitions: the group
    // rebalances with deliveries in flight.
    wait_applied(
        &harness.pool,
        &run,
        total / 5,
        "a fifth applied by the first member",
    )
    .await;
    let second = start(&harness, &run, "second", Facts::new(&run), configure);
    // The first member stops while both work: its deliveries in flight finish.
    let half = total / 2;
    wait_applied(&harness.pool, &run, half, "half applied").await;
    let first_stats = first.stats.clone();
    first.stop().await;
    wait_applied(
        &harness.pool,
        &run,
        total,
        "the second member applies the rest",
    )
    .await;
    let second_stats = second.stats.clone();
    second.stop().await;

    assert_once_in_order(&harness.pool, &run, &sent).await;
    let (a, b) = (first_stats.snapshot(), second_stats.snapshot());
    eprintln!(
        "rebalance in flight: {total} facts; first member {} applied, {} duplicates; second {} applied, {} duplicates",
        a.executed, a.duplicates, b.executed, b.duplicates
    );
    harness.finish().await;
}

/// A harness of `label` with the tables, and a member of its own group whose partition 0
/// is held from the start (`configure` adjusts its settings): the harness, the run and
/// the hold.
async fn with_partition_0_held(
    pool: &PgPool,
    label: &str,
    configure: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder,
) -> (Harness, String, Arc<Hold>, Running) {
    let harness = Harness::new(pool, label, PARTITIONS).await;
    held_member(harness, configure).await
}

/// [`with_partition_0_held`] on `harness`.
async fn held_member(
    harness: Harness,
    configure: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder,
) -> (Harness, String, Arc<Hold>, Running) {
    sqlx::raw_sql(SCHEMA).execute(&harness.pool).await.unwrap();
    let run = harness.group.clone();
    let facts = Facts::new(&run);
    let hold = facts.hold.clone();
    hold.held.store(true, Ordering::SeqCst);
    let member = start(&harness, &run, "m", facts, configure);
    (harness, run, hold, member)
}

#[sqlx::test(migrations = false)]
async fn retries_on_one_partition_hold_up_no_other(pool: PgPool) {
    const PER_PARTITION: usize = 50;
    // One delivery at a time: partition 0's back-off holds no permit.
    let (harness, run, hold, member) =
        with_partition_0_held(&pool, "parallel-retries", |builder| {
            builder
                .max_in_flight(1)
                .retry_backoff(Duration::from_millis(50), Duration::from_millis(500))
        })
        .await;
    let sent = produce(&harness, PER_PARTITION).await;
    let others: i64 = sent
        .iter()
        .filter(|(partition, _)| **partition != 0)
        .map(|(_, count)| count)
        .sum();

    // Partitions 1 to 5 are applied to their ends while partition 0 is retried.
    let mut still = Stillness::new(PAST_RECOVERY, 0);
    loop {
        let counts: HashMap<i32, i64> = sqlx::query_as(
            "SELECT kafka_partition, count(*) FROM parallel_applied WHERE run = $1 GROUP BY 1",
        )
        .bind(&run)
        .fetch_all(&harness.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        assert_eq!(counts.get(&0), None, "partition 0 is held");
        let applied: i64 = counts.values().sum();
        if applied >= others {
            break;
        }
        still.check(applied as u64, || {
            format!("partitions 1 to 5 applied while 0 is retried: {counts:?}")
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempts = hold.attempts.load(Ordering::SeqCst);
    assert!(attempts >= 1, "partition 0 was tried");
    assert!(member.stats.snapshot().retries >= 1);

    hold.held.store(false, Ordering::SeqCst);
    let total: i64 = sent.values().sum();
    wait_applied(&harness.pool, &run, total, "partition 0 once released").await;
    member.stop().await;
    assert_once_in_order(&harness.pool, &run, &sent).await;
    eprintln!(
        "partition 0 retried {attempts} times while partitions 1 to 5 applied {others} facts"
    );
    harness.finish().await;
}

/// A partition held in back-off with more messages than the member queues (10,000) holds
/// up no other either: the member stops reading at its bound, and a second later pauses
/// the held partition and reads the others' messages again.
///
/// On a broker of its own, and with its 12,000 messages sent before the member joins:
/// the shared broker's storage grows with every test, and under the load of its writes
/// it can leave a member's heartbeats unanswered for longer than a short session, which
/// is not what this test is about. For the same reason the member keeps the default
/// session (30 s), and the waits outlast the stall watch's recovery (its bound, 60 s,
/// and a rejoin).
#[sqlx::test(migrations = false)]
async fn a_held_partition_past_the_member_s_bound_holds_up_no_other(pool: PgPool) {
    const HELD: usize = 12_000;
    const OTHERS: usize = 40;
    let harness = Harness::with_private_broker(&pool, "parallel-bound", PARTITIONS).await;
    let mut sent = produce_to(&harness, &[(0, HELD)]).await;
    let (harness, run, hold, member) = held_member(harness, |builder| {
        builder
            .session_timeout(Duration::from_secs(30))
            .retry_backoff(Duration::from_millis(50), Duration::from_millis(500))
    })
    .await;
    // The member reads partition 0's messages up to its bound before the others arrive:
    // it holds back until it pauses partition 0.
    let mut still = Stillness::new(PAST_RECOVERY, 0);
    while member.stats.snapshot().deliveries < 10_000 {
        let received = member.stats.snapshot().deliveries;
        still.check(received, || {
            format!("partition 0 read up to the bound: {received}")
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let others: Vec<(i32, usize)> = (1..PARTITIONS)
        .map(|partition| (partition, OTHERS))
        .collect();
    sent.extend(produce_to(&harness, &others).await);
    let others = (OTHERS as i64) * i64::from(PARTITIONS - 1);
    wait_applied(
        &harness.pool,
        &run,
        others,
        "partitions 1 to 5 while 0 is held past the bound",
    )
    .await;
    assert_eq!(
        applied(&harness.pool, &run).await,
        others,
        "partition 0 is held"
    );

    hold.held.store(false, Ordering::SeqCst);
    let total: i64 = sent.values().sum();
    wait_applied(&harness.pool, &run, total, "partition 0 once released").await;
    member.stop().await;
    assert_once_in_order(&harness.pool, &run, &sent).await;
    harness.finish().await;
}
