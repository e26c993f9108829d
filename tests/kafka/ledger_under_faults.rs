//! The ledger under faults through Kafka: payments (with duplicate sends under other
//! record keys, bad inputs and hostile text) consumed by a group whose members are killed
//! mid-stream (their partitions go to the others) and started again, one more joining
//! midway, while backends of the consumers' database are killed at random. Each time a member is
//! killed, and at the end: **no committed offset passes an uncommitted effect**: every
//! record below the group's committed offset of its partition has its effect in
//! PostgreSQL, or is in the dead-letter table. At the end every payment is applied
//! exactly once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_demo::kafka::producer::create_producer;
use idem_demo::kafka::verify;
use idem_kafka::{Fate, Handler, OffsetStore, Position, Stats};
use idem_runtime::{Idem, idempotent};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

use crate::support::{Harness, Member, wait_while_progressing};

const PAYMENTS: usize = 2_000;
const PARTITIONS: i32 = 4;
const KILLS: usize = 4;

/// A payment as the producer sends it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payment {
    payment_id: Option<String>,
    account: String,
    amount_cents: i64,
    memo: String,
}

/// A ledger entry and the account's balance, in the claim's transaction.
#[idempotent(
    key = "payment_id",
    fingerprint = "account, amount_cents, memo",
    scope = "kafka_faults.apply_payment",
    max_attempts = 3
)]
async fn apply_payment(tx: &mut PgConnection, payment: &Payment) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH entry AS (
            INSERT INTO faults_ledger (payment_id, account, amount_cents, memo) VALUES ($1, $2, $3, $4))
         INSERT INTO faults_accounts (account, balance) VALUES ($2, $3)
         ON CONFLICT (account) DO UPDATE SET balance = faults_accounts.balance + EXCLUDED.balance",
    )
    .bind(payment.payment_id.as_deref())
    .bind(&payment.account)
    .bind(payment.amount_cents)
    .bind(&payment.memo)
    .execute(&mut *tx)
    .await
    .map(drop)
}

struct Payments;

impl Handler for Payments {
    type Message = Payment;

    fn decode(&self, payload: &[u8]) -> Result<Payment, String> {
        idem_kafka::decode_json(payload)
    }

    async fn handle(&self, idem: &Idem, payment: &Payment, _: Option<&Position>) -> Fate {
        Fate::of(apply_payment(idem, payment).await)
    }
}

const HOSTILE: &[&str] = &[
    "'; DROP TABLE faults_ledger; --",
    "%s %n {} $1",
    "emoji 💸 and 支付",
    "line\nbreak\ttab",
    "\u{202e}reversed",
    "back\\slash \"quote\"",
];

/// Deliveries counted by the members' statistics.
fn total(stats: &[Arc<Stats>]) -> u64 {
    stats.iter().map(|s| s.snapshot().deliveries).sum()
}

/// What was sent at one partition and offset.
#[derive(Debug, Clone)]
struct Sent {
    /// The payment id, for a record that carries one.
    payment_id: Option<String>,
}

/// The group's committed offset of each partition (none yet: 0).
fn committed_offsets(brokers: &str, group: &str, topic: &str) -> HashMap<i32, i64> {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("an offset reader");
    let mut partitions = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        partitions.add_partition(topic, partition);
    }
    let committed = reader
        .committed_offsets(partitions, Duration::from_secs(10))
        .expect("the group's committed offsets");
    committed
        .elements()
        .iter()
        .map(|element| {
            let offset = match element.offset() {
                Offset::Offset(offset) => offset,
                _ => 0,
            };
            (element.partition(), offset)
        })
        .collect()
}

/// Checks that every record below the committed offsets has its effect or is a dead
/// letter; returns how many records that covered.
async fn check_committed_offsets(
    harness: &Harness,
    checks: &PgPool,
    sent: &HashMap<(i32, i64), Sent>,
    moment: &str,
) -> usize {
    let (brokers, group, topic) = (
        harness.brokers.clone(),
        harness.group.clone(),
        harness.topic.clone(),
    );
    let committed =
        tokio::task::spawn_blocking(move || committed_offsets(&brokers, &group, &topic))
            .await
            .unwrap();
    let applied: HashSet<String> = sqlx::query_scalar("SELECT payment_id FROM faults_ledger")
        .fetch_all(checks)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let dead: HashSet<(i32, i64)> = verify::dead_letters(checks, &harness.group)
        .await
        .unwrap()
        .into_iter()
        .map(|dead| (dead.kafka_partition, dead.kafka_offset))
        .collect();
    let mut covered = 0;
    for (&(partition, offset), record) in sent {
        if offset >= committed.get(&partition).copied().unwrap_or(0) {
            continue;
        }
        covered += 1;
        let done = dead.contains(&(partition, offset))
            || record
                .payment_id
                .as_ref()
                .is_some_and(|id| applied.contains(id));
        assert!(
            done,
            "{moment}: the committed offset {:?} of partition {partition} passes offset {offset} \
             ({record:?}), whose effect is not committed",
            committed.get(&partition)
        );
    }
    covered
}

#[sqlx::test(migrations = false)]
async fn committed_offsets_never_pass_an_uncommitted_effect_under_faults(pool: PgPool) {
    let started = Instant::now();
    let harness = Harness::new(&pool, "ledger-faults", PARTITIONS).await;
    sqlx::raw_sql(
        "CREATE TABLE faults_ledger (payment_id text NOT NULL, account text NOT NULL,
                                     amount_cents bigint NOT NULL, memo text NOT NULL);
         CREATE TABLE faults_accounts (account text PRIMARY KEY, balance bigint NOT NULL)",
    )
    .execute(&harness.pool)
    .await
    .unwrap();
    let checks = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(
            harness
                .pool
                .connect_options()
                .as_ref()
                .clone()
                .application_name("faults-checks"),
        )
        .await
        .unwrap();

    // The payments, their duplicate sends (under another record key) and
    // the bad inputs, all sent before the consumers start.
    let producer = create_producer(&harness.brokers).unwrap();
    let mut payments = Vec::new();
    let mut records: Vec<(String, Vec<u8>, Option<String>)> = Vec::new();
    for n in 0..PAYMENTS {
        let payment = Payment {
            payment_id: Some(format!(
                "{}-pay-{n}:{}",
                harness.id,
                HOSTILE[n % HOSTILE.len()]
            )),
            account: format!("acct-{}", n % 17),
            amount_cents: (n as i64 * 7919) % 100_000 + 1,
            memo: HOSTILE[(n / 3) % HOSTILE.len()].to_owned(),
        };
        let payload = serde_json::to_vec(&payment).unwrap();
        records.push((format!("k{n}"), payload.clone(), payment.payment_id.clone()));
        if n % 3 == 0 {
            records.push((format!("dup{n}"), payload, payment.payment_id.clone()));
        }
        payments.push(payment);
    }
    let mut bad = 0;
    for n in 0..10 {
        records.push((
            format!("bad{n}"),
            b"{\"payment_id\": \xc3\x28".to_vec(),
            None,
        ));
        let missing = serde_json::json!({"account": "acct-1", "amount_cents": 5, "memo": "no id"});
        records.push((
            format!("missing{n}"),
            serde_json::to_vec(&missing).unwrap(),
            None,
        ));
        bad += 2;
    }
    // Interleave the bad inputs with the payments.
    let stride = records.len() / bad;
    for n in 0..bad {
        let last = records.len() - 1 - n;
        records.swap(n * stride, last);
    }
    let mut sent: HashMap<(i32, i64), Sent> = HashMap::new();
    for (key, payload, payment_id) in &records {
        let delivery = producer
            .send(
                FutureRecord::to(&harness.topic)
                    .key(key.as_str())
                    .payload(payload.as_slice()),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(error, _)| error)
            .expect("the broker takes the record");
        sent.insert(
            (delivery.partition, delivery.offset),
            Sent {
                payment_id: payment_id.clone(),
            },
        );
    }
    let mut end_offsets: HashMap<i32, i64> = HashMap::new();
    for &(partition, offset) in sent.keys() {
        let end = end_offsets.entry(partition).or_insert(0);
        *end = (*end).max(offset + 1);
    }

    // Two members; a third joins later. (Not with static membership: tansu 0.6 gave
    // members with a `group.instance.id` no partitions. A killed member's consumer is
    // dropped, which leaves the group: the others get its partitions at once.)
    let start = |name: &str| -> Member {
        harness.member(name, Payments, |builder| {
            builder
                .offsets(OffsetStore::Kafka)
                .commit_interval(Duration::from_millis(200))
                .retry_backoff(Duration::from_millis(20), Duration::from_millis(500))
        })
    };
    let mut members: Vec<Member> = vec![start("m0"), start("m1")];
    let mut all_stats: Vec<Arc<Stats>> = members.iter().map(|m| m.stats.clone()).collect();

    // Backends of the consumers' database killed at random while they consume.
    let backends_killed = Arc::new(AtomicU64::new(0));
    let killer = tokio::spawn({
        let (checks, backends_killed) = (checks.clone(), Arc::clone(&backends_killed));
        async move {
            for round in 0u64.. {
                tokio::time::sleep(Duration::from_millis(60 + (round * 37) % 120)).await;
                let terminated: Result<Option<bool>, _> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND application_name <> 'faults-checks'
                       AND state IN ('active', 'idle in transaction')
                     ORDER BY random() LIMIT 1",
                )
                .fetch_optional(&checks)
                .await;
                if let Ok(Some(true)) = terminated {
                    backends_killed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });

    let records_count = sent.len() as u64;
    let mut covered_at_kills = Vec::new();
    for kill in 0..KILLS {
        let due = records_count * (kill as u64 + 1) / (KILLS as u64 + 2);
        wait_while_progressing(
            Duration::from_secs(60),
            || total(&all_stats) >= due,
            || total(&all_stats),
            || {
                let finished: Vec<bool> = members.iter().map(|m| m.task.is_finished()).collect();
                format!("{due} deliveries before kill {kill} (members finished: {finished:?})")
            },
        )
        .await;
        if kill == 1 {
            // A new member joins: the partitions are rebalanced.
            let joined = start("m2");
            all_stats.push(joined.stats.clone());
            members.push(joined);
        }
        let victim = members.remove(kill % members.len());
        let name = victim.name.clone();
        victim.kill.kill();
        victim.task.abort();
        assert!(victim.task.await.unwrap_err().is_cancelled());
        covered_at_kills.push(
            check_committed_offsets(&harness, &checks, &sent, &format!("after killing {name}"))
                .await,
        );
        // Started again under the same name: the partitions are rebalanced once more.
        let restarted = start(&name);
        all_stats.push(restarted.stats.clone());
        members.push(restarted);
    }

    wait_while_progressing(
        Duration::from_secs(60),
        || {
            idem_kafka::caught_up(
                all_stats.iter().map(Arc::as_ref),
                &harness.topic,
                &end_offsets,
            )
        },
        || total(&all_stats),
        || format!("every partition consumed to {end_offsets:?}"),
    )
    .await;
    killer.abort();
    let _ = killer.await;
    let backends_killed = backends_killed.load(Ordering::Relaxed);
    harness.stop(members).await;
    let covered_at_end = check_committed_offsets(&harness, &checks, &sent, "at the end").await;
    assert_eq!(
        covered_at_end,
        sent.len(),
        "every record committed at the end"
    );

    // Exactly once: one entry per payment, with its amount; balances add up.
    let entries: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT payment_id, count(*), sum(amount_cents)::bigint FROM faults_ledger GROUP BY payment_id",
    )
    .fetch_all(&checks)
    .await
    .unwrap();
    let by_id: HashMap<&str, (i64, i64)> = entries
        .iter()
        .map(|(id, count, sum)| (id.as_str(), (*count, *sum)))
        .collect();
    let lost = payments
        .iter()
        .filter(|p| !by_id.contains_key(p.payment_id.as_deref().unwrap()))
        .count();
    let doubled = entries.iter().filter(|(_, count, _)| *count > 1).count();
    for payment in &payments {
        if let Some((_, sum)) = by_id.get(payment.payment_id.as_deref().unwrap()) {
            assert_eq!(*sum, payment.amount_cents, "{payment:?}");
        }
    }
    let balance: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(balance), 0)::bigint FROM faults_accounts")
            .fetch_one(&checks)
            .await
            .unwrap();
    let expected: i64 = payments.iter().map(|p| p.amount_cents).sum();
    // A record redelivered after a kill may be dead-lettered again: count positions.
    let dead: HashSet<(i32, i64)> = verify::dead_letters(&checks, &harness.group)
        .await
        .unwrap()
        .into_iter()
        .map(|dead| (dead.kafka_partition, dead.kafka_offset))
        .collect();
    let deliveries = total(&all_stats);
    println!(
        "kafka ledger under faults: {} records ({PAYMENTS} payments, {} duplicate sends, {bad} bad), \
         {deliveries} deliveries, {KILLS} members killed and restarted (records covered by the \
         committed offsets then: {covered_at_kills:?}), one member joined, {backends_killed} \
         backends killed; {} entries, lost {lost}, doubled {doubled}, dead-lettered {}; {:.1} s",
        sent.len(),
        sent.len() - PAYMENTS - bad,
        entries.len(),
        dead.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((lost, doubled), (0, 0));
    assert_eq!(entries.len(), PAYMENTS);
    assert_eq!(
        balance, expected,
        "balances are the sums of the distinct payments"
    );
    assert_eq!(
        dead.len(),
        bad,
        "every bad input dead-lettered, nothing else: {dead:?}"
    );
    checks.close().await;
    harness.finish().await;
}
