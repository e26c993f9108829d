//! The failover under load: order events stream into a topic while consumer groups apply
//! them to a PostgreSQL primary through the clients' endpoint; the primary dies, its
//! standby is promoted, the endpoint moves, and consumption goes on. Then every group's
//! database is checked by SQL on the new primary: how many facts were applied not at all,
//! once, more than once; whether any attempt was charged or any message dead-lettered.
//!
//! One cluster and one failover serve seven consumer groups at once, each with two members
//! and a database of its own on the cluster: orders one message per transaction and in
//! batches of 100, each with offsets in Kafka and in PostgreSQL; payment notifications in
//! lease mode, whose effect (the notification service's own table) lives outside the
//! cluster, in a database of the server at `DATABASE_URL`; and the two hops of an outbox
//! chain with its relay ([`chain`]), sharing a database.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_demo::kafka::broker::LocalBroker;
use idem_demo::kafka::handlers::OrderEvents;
use idem_demo::kafka::notifications::{
    self, NotificationService, PaymentNotifications, ServiceSettings,
};
use idem_demo::kafka::producer::{self, Plan, PlanConfig, PlannedRecord};
use idem_demo::kafka::{self, admin, verify};
use idem_demo::orders::EventType;
use idem_kafka::outbox::Relay;
use idem_kafka::{Consumer, ConsumerBuilder, ConsumerError, Handler, OffsetStore, Stats};
use idem_runtime::Idem;
use rdkafka::producer::FutureProducer;
use sqlx::PgPool;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

use crate::chain;
use crate::cluster::{Cluster, Replication};

/// Business facts published (with 10% duplicate sends besides).
const EVENTS: usize = 1_500;
/// Partitions of the topic: three per member of a group.
const PARTITIONS: i32 = 6;
/// Records published per second: the stream runs before, during and after the failover.
const RECORDS_PER_SECOND: usize = 150;
/// Records published at once, before the stream: the groups form on them.
const WARM_UP: usize = 100;
/// Records published, and delivered to every group, before the standby is cut off.
const BEFORE_THE_LAG: usize = 500;
/// How long the standby lags (its link paused) before the primary dies: what the primary
/// commits in this window and no later is lost in asynchronous replication.
const LAG_WINDOW: Duration = Duration::from_secs(2);
/// No progress for this long fails a wait (the notifications wait out a 10 s lease).
const STALL: Duration = Duration::from_secs(60);

/// The failover scenarios take turns: on 2 cores, two at once would measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// One consumer group: its members, their shared counters, its database.
struct Group {
    label: String,
    name: String,
    offsets: OffsetStore,
    database: String,
    /// Through the endpoint: the new primary after the failover.
    pool: PgPool,
    stats: Arc<Stats>,
    members: Vec<JoinHandle<Result<(), ConsumerError>>>,
    /// Members started again after they stopped with `ConsumerError::Stalled`.
    restarts: Arc<AtomicUsize>,
}

/// What one group's database holds at the end.
struct Outcome {
    label: String,
    facts: i64,
    lost: i64,
    doubled: i64,
    applied: i64,
    unexpected: i64,
    /// Keys whose row counts more than one run of the body.
    charged: i64,
    /// Keys in any state but `success`.
    not_success: i64,
    dead_letters: usize,
    /// Facts applied during the lag window (the group's executed count).
    applied_in_window: u64,
}

/// Runs the scenario on a cluster replicating as `replication`.
pub async fn fail_over_under_load(replication: Replication) {
    // The consumers' warnings (a delivery retried, and why) go to the test's output,
    // which a failed test shows.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_test_writer()
        .try_init();
    let _turn = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let broker = tokio::task::spawn_blocking(LocalBroker::ensure)
        .await
        .unwrap()
        .unwrap_or_else(|error| panic!("{error}"));
    let brokers = broker.brokers().to_owned();
    admin::wait_for_broker(&brokers, Duration::from_secs(30))
        .await
        .unwrap_or_else(|error| panic!("the broker at {brokers} does not answer: {error}"));
    let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
    let service = ServiceDatabase::create(&format!("idem_failover_notify_{id}")).await;
    let service_pool = service.pool.clone();
    let topic = format!("idem-failover-{replication}-{id}");
    admin::create_topic(&brokers, &topic, PARTITIONS)
        .await
        .unwrap();

    let mut cluster = Cluster::start(replication).await;
    let stop = watch::channel(false).0;
    let mut groups = Vec::new();
    for (label, offsets, batch) in [
        ("kafka-b1", OffsetStore::Kafka, 1),
        ("kafka-b100", OffsetStore::Kafka, 100),
        ("postgres-b1", OffsetStore::Postgres, 1),
        ("postgres-b100", OffsetStore::Postgres, 100),
    ] {
        let mut group = Group::new(&cluster, &topic, label, offsets).await;
        for member in 0..2 {
            let idem = Idem::new(cluster.client_pool(&group.database, 5));
            group.start(
                &brokers,
                &topic,
                &stop,
                member,
                idem,
                OrderEvents,
                move |b| b.batch_size(batch),
            );
        }
        groups.push(group);
    }
    let mut notifier = Group::new(&cluster, &topic, "notify-lease", OffsetStore::Kafka).await;
    let settings = ServiceSettings {
        latency: Duration::from_millis(2),
        crash_after: None,
    };
    let service_options = service_pool.connect_options().as_ref().clone();
    for member in 0..2 {
        // Each member has its own client of the service, as separate processes would.
        let service = NotificationService::connect(service_options.clone(), settings)
            .await
            .unwrap();
        let idem = Idem::new(cluster.client_pool(&notifier.database, 5));
        notifier.start(
            &brokers,
            &topic,
            &stop,
            member,
            idem,
            PaymentNotifications::new(service),
            |b| b,
        );
    }
    // The outbox chain: hop 1 on the order topic, a relay, hop 2 on the second topic.
    let topic_b = format!("{topic}-b");
    admin::create_topic(&brokers, &topic_b, PARTITIONS)
        .await
        .unwrap();
    let mut hop1 = Group::new(&cluster, &topic, "chain-hop1", OffsetStore::Postgres).await;
    sqlx::raw_sql(chain::CREATE_TABLES)
        .execute(&hop1.pool)
        .await
        .unwrap();
    let mut hop2 = hop1.sharing(&topic_b, "chain-hop2");
    for member in 0..2 {
        let events = chain::Events {
            topic_b: topic_b.clone(),
        };
        let idem = Idem::new(cluster.client_pool(&hop1.database, 5));
        hop1.start(&brokers, &topic, &stop, member, idem, events, |b| b);
        let idem = Idem::new(cluster.client_pool(&hop2.database, 5));
        hop2.start(
            &brokers,
            &topic_b,
            &stop,
            member,
            idem,
            chain::Records,
            |b| b,
        );
    }
    let relaying = tokio::spawn(relay(
        brokers.clone(),
        Idem::new(cluster.client_pool(&hop1.database, 3)),
        stop.subscribe(),
    ));
    // Everything created so far (databases, tables) is on the standby before the lag.
    cluster.wait_standby_caught_up().await;

    let plan = Plan::new(&PlanConfig {
        events: EVENTS,
        duplicate_rate: 0.1,
        malformed: 0,
        seed: 29,
        order_prefix: format!("order-{id}"),
        scatter_duplicates: false,
    });
    let records = plan.all().count();
    let all: Vec<PlannedRecord> = plan.all().cloned().collect();
    let (warm_up, stream) = all.split_at(WARM_UP);

    // A first part at once: the groups form (each member joins, the group rebalances) and
    // start consuming before the stream begins, however long that takes on a busy machine.
    let producer = producer::create_producer(&brokers).unwrap();
    let mut produced = producer::produce(&producer, &topic, &part(warm_up), WARM_UP, |_, _| {})
        .await
        .unwrap();
    let everyone: Vec<&Group> = groups.iter().chain([&notifier, &hop1]).collect();
    wait_while_progressing(
        || {
            let consuming = everyone
                .iter()
                .all(|group| group.stats.snapshot().deliveries >= WARM_UP as u64 / 2);
            async move { consuming }
        },
        || processed(&everyone),
        || format!("every group formed and consuming: {}", progress(&everyone)),
    )
    .await;

    // Then the stream, at a steady rate, before, during and after the failover.
    let sent = Arc::new(AtomicUsize::new(WARM_UP));
    // The stream in three parts, however slowly the groups formed: the first before the
    // lag; the second (about the lag window's worth) once the standby lags, so that every
    // group has records to apply in that window; the last once the endpoint moved.
    let phase = watch::channel(0u8).0;
    let holds = vec![(stream.len() * 2 / 5, 1), (stream.len() * 3 / 5, 2)];
    let producing = tokio::spawn(produce_paced(
        producer,
        topic.clone(),
        stream.to_vec(),
        (holds, phase.subscribe()),
        sent.clone(),
    ));
    wait_while_progressing(
        || {
            let streaming = sent.load(Ordering::SeqCst) >= BEFORE_THE_LAG
                && everyone
                    .iter()
                    .all(|group| group.stats.snapshot().deliveries >= BEFORE_THE_LAG as u64);
            async move { streaming }
        },
        || processed(&everyone),
        || format!("every group consuming the stream: {}", progress(&everyone)),
    )
    .await;

    // The standby stops hearing from the primary, which goes on committing; then it dies.
    let before_lag: Vec<u64> = everyone
        .iter()
        .map(|group| group.stats.snapshot().executed)
        .collect();
    cluster.pause_replication();
    phase.send_replace(1);
    tokio::time::sleep(LAG_WINDOW).await;
    let sent_before = sent.load(Ordering::SeqCst);
    let at_kill: Vec<u64> = everyone
        .iter()
        .map(|group| group.stats.snapshot().executed)
        .collect();
    let outage = cluster.fail_over().await;
    phase.send_replace(2);
    assert!(
        sent_before < records,
        "the stream was still running when the primary died ({sent_before} of {records} sent): \
         part of it is published after the failover"
    );

    let streamed = producing.await.unwrap();
    produced.records += streamed.records;
    for (partition, end) in streamed.end_offsets {
        let entry = produced.end_offsets.entry(partition).or_insert(0);
        *entry = (*entry).max(end);
    }
    assert_eq!(produced.records, records);
    let (topic, ends) = (&topic, &produced.end_offsets);
    wait_while_progressing(
        || {
            let everyone = &everyone;
            async move {
                for group in everyone {
                    if !group.caught_up(topic, ends).await {
                        return false;
                    }
                }
                true
            }
        },
        || processed(&everyone),
        || {
            format!(
                "every group consumed to the end {ends:?}: {}",
                progress(&everyone)
            )
        },
    )
    .await;
    // Hop 2 is done when the outbox is drained and it consumed the second topic to its end.
    let (hop1_ref, hop2_ref, topic_b_ref) = (&hop1, &hop2, &topic_b);
    let brokers_ref = &brokers;
    wait_while_progressing(
        || async move {
            if chain::unsent(&hop1_ref.pool).await != Some(0) {
                return false;
            }
            let ends = high_watermarks(brokers_ref, topic_b_ref).await;
            hop2_ref.caught_up(topic_b_ref, &ends).await
        },
        || processed(&[hop1_ref, hop2_ref]),
        || {
            format!(
                "the outbox drained and the second hop consumed to the end: {}",
                progress(&[hop1_ref, hop2_ref])
            )
        },
    )
    .await;
    drop(everyone);
    stop.send(true).ok();
    for group in groups
        .iter_mut()
        .chain([&mut notifier, &mut hop1, &mut hop2])
    {
        for member in group.members.drain(..) {
            member.await.unwrap().unwrap();
        }
    }
    let relay_restarts = relaying.await.unwrap();

    // The order groups: every fact applied once, nothing charged, nothing set aside.
    let mut outcomes = Vec::new();
    for (n, group) in groups.iter().enumerate() {
        outcomes.push(group.outcome(&plan, at_kill[n] - before_lag[n]).await);
    }
    // The notifications: what the service delivered, by its own record.
    let paid: BTreeMap<uuid::Uuid, (String, i64)> = plan
        .events
        .iter()
        .filter(|event| event.event_type == EventType::Paid)
        .map(|event| {
            let key = notifications::notify_payment_key(event).unwrap().key();
            (key.as_uuid(), (event.order_id.clone(), event.amount_cents))
        })
        .collect();
    let delivered: BTreeMap<uuid::Uuid, (String, i64, i32)> =
        sqlx::query_as::<_, (uuid::Uuid, String, i64, i32)>(
            "SELECT idempotency_key, order_id, amount_cents, calls FROM notifications_sent",
        )
        .fetch_all(&service_pool)
        .await
        .unwrap()
        .into_iter()
        .map(|(key, order, amount, calls)| (key, (order, amount, calls)))
        .collect();
    let notified_lost = paid
        .keys()
        .filter(|key| !delivered.contains_key(key))
        .count();
    let notified_unexpected = delivered
        .iter()
        .filter(|(key, (order, amount, _))| paid.get(key) != Some(&(order.clone(), *amount)))
        .count();
    let repeated_calls: i64 = delivered
        .values()
        .map(|(_, _, calls)| i64::from(*calls - 1))
        .sum();
    let notify_keys = keys(&notifier.pool).await;
    let notify_dead = verify::dead_letters(&notifier.pool, &notifier.name)
        .await
        .unwrap()
        .len();
    let notify_window = at_kill[groups.len()] - before_lag[groups.len()];
    // The chain: both hops, by SQL; the status table and dead letters of both handlers.
    let chained = chain::outcome(&hop1.pool, &plan.events).await;
    let chain_keys = keys(&hop1.pool).await;
    let mut chain_dead = 0;
    for hop in [&hop1, &hop2] {
        chain_dead += verify::dead_letters(&hop.pool, &hop.name)
            .await
            .unwrap()
            .len();
    }
    let chain_window = at_kill[groups.len() + 1] - before_lag[groups.len() + 1];

    for outcome in &outcomes {
        eprintln!(
            "failover {replication} {:<13}: {} facts, {} lost, {} doubled, {} applied once, \
             {} unexpected; {} keys charged an attempt, {} not success, {} dead letters; \
             {} facts applied in the {:?} lag window",
            outcome.label,
            outcome.facts,
            outcome.lost,
            outcome.doubled,
            outcome.applied,
            outcome.unexpected,
            outcome.charged,
            outcome.not_success,
            outcome.dead_letters,
            outcome.applied_in_window,
            LAG_WINDOW
        );
    }
    eprintln!(
        "failover {replication} notify-lease : {} paid facts, {notified_lost} lost, \
         {repeated_calls} repeated calls (absorbed by the service), {} delivered, \
         {notified_unexpected} unexpected; status table: {} keys, \
         {} charged a second attempt, {} failed or parked, {} left processing; \
         {notify_dead} dead letters; {notify_window} notified in the lag window",
        paid.len(),
        delivered.len(),
        notify_keys.total,
        notify_keys.charged,
        notify_keys.failed,
        notify_keys.processing,
    );
    eprintln!(
        "failover {replication} outbox-chain : hop 1 {} lost, {} doubled; hop 2 {} facts \
         missing a record, {} records doubled, {} rows without their hop-1 fact; {} outbox \
         records unsent or parked; {} keys charged an attempt, {} failed or parked, {} left \
         processing; {chain_dead} dead letters; relay restarted {relay_restarts} times; \
         {chain_window} facts applied in the lag window",
        chained.lost_first,
        chained.doubled_first,
        chained.lost_second,
        chained.doubled_second,
        chained.orphans,
        chained.unsent,
        chain_keys.charged,
        chain_keys.failed,
        chain_keys.processing,
    );
    eprintln!(
        "failover {replication}: {records} records ({sent_before} sent before the primary died), \
         clients without a server for {:.2} s, members started again after Stalled: {}; \
         {:.1} s in all",
        outage.as_secs_f64(),
        groups
            .iter()
            .chain([&notifier, &hop1, &hop2])
            .map(|group| format!("{} {}", group.label, group.restarts.load(Ordering::SeqCst)))
            .collect::<Vec<_>>()
            .join(", "),
        started.elapsed().as_secs_f64()
    );

    for outcome in &outcomes {
        let label = &outcome.label;
        assert_eq!(
            outcome.doubled, 0,
            "{replication} {label}: no fact applied twice"
        );
        assert_eq!(
            outcome.unexpected, 0,
            "{replication} {label}: nothing else applied"
        );
        assert_eq!(
            outcome.dead_letters, 0,
            "{replication} {label}: no dead letters"
        );
        assert_eq!(
            outcome.not_success, 0,
            "{replication} {label}: every key succeeded"
        );
        assert_eq!(
            outcome.charged, 0,
            "{replication} {label}: no attempt charged to any message"
        );
        let lossless =
            replication == Replication::Synchronous || outcome.label.starts_with("postgres");
        if lossless {
            assert_eq!(outcome.lost, 0, "{replication} {label}: no fact lost");
        }
        if replication == Replication::Asynchronous {
            assert!(
                outcome.applied_in_window > 0,
                "{replication} {label}: the group applied facts while the standby lagged"
            );
        }
    }
    assert_eq!(notified_lost, 0, "{replication}: every paid fact notified");
    assert_eq!(
        notified_unexpected, 0,
        "{replication}: nothing else notified"
    );
    assert_eq!(
        notify_dead, 0,
        "{replication}: no notification dead-lettered"
    );
    assert_eq!(
        notify_keys.failed, 0,
        "{replication}: no notification key failed or parked"
    );
    // Asynchronous: a lease claimed before the lag and marked `success` in it comes back
    // as the lease alone (`processing`), for a message the consumer has gone past; the
    // notification went out (the service has it), and a later delivery would find the
    // lease expired and call again, which the service absorbs.
    if replication == Replication::Synchronous {
        assert_eq!(
            notify_keys.processing, 0,
            "{replication}: no notification key left processing"
        );
    }

    // The chain: exactly once on both hops, in either replication mode (its offsets are in
    // PostgreSQL, so a lost fact is consumed again, and sent again under the same keys).
    assert_eq!(
        chained.lost_first, 0,
        "{replication} chain: no fact lost at hop 1"
    );
    assert_eq!(
        chained.doubled_first, 0,
        "{replication} chain: none doubled at hop 1"
    );
    assert_eq!(
        chained.lost_second, 0,
        "{replication} chain: no record lost at hop 2"
    );
    assert_eq!(
        chained.doubled_second, 0,
        "{replication} chain: none doubled at hop 2"
    );
    assert_eq!(
        chained.orphans, 0,
        "{replication} chain: no hop-2 row without its fact"
    );
    assert_eq!(chained.unsent, 0, "{replication} chain: the outbox drained");
    assert_eq!(
        chain_keys.charged, 0,
        "{replication} chain: no attempt charged"
    );
    assert_eq!(
        chain_keys.failed + chain_keys.processing,
        0,
        "{replication} chain: every key succeeded"
    );
    assert_eq!(chain_dead, 0, "{replication} chain: no dead letters");

    for group in groups.into_iter().chain([notifier, hop1, hop2]) {
        group.pool.close().await;
    }
    drop(cluster);
    service.drop_database().await;
    drop(broker);
}

/// The notification service's database, outside the cluster: a fresh one on the server at
/// `DATABASE_URL`, dropped at the end of a test that passed.
struct ServiceDatabase {
    server: PgPool,
    name: String,
    pool: PgPool,
}

impl ServiceDatabase {
    async fn create(name: &str) -> ServiceDatabase {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let options: sqlx::postgres::PgConnectOptions = url.parse().expect("a PostgreSQL URL");
        let server = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .unwrap_or_else(|error| panic!("PostgreSQL at DATABASE_URL ({url}): {error}"));
        sqlx::raw_sql(&format!("CREATE DATABASE \"{name}\""))
            .execute(&server)
            .await
            .unwrap();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options.database(name))
            .await
            .unwrap();
        ServiceDatabase {
            server,
            name: name.to_owned(),
            pool,
        }
    }

    async fn drop_database(self) {
        self.pool.close().await;
        sqlx::raw_sql(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ))
        .execute(&self.server)
        .await
        .unwrap();
        self.server.close().await;
    }
}

impl Group {
    /// Creates the group's database on the primary, with the demo's tables, idem's status
    /// table and idem-kafka's tables.
    async fn new(cluster: &Cluster, topic: &str, label: &str, offsets: OffsetStore) -> Group {
        let database = label.replace('-', "_");
        let pool = cluster.database(&database, 4).await;
        kafka::prepare(&Idem::new(pool.clone())).await.unwrap();
        Group {
            label: label.to_owned(),
            name: format!("{topic}-{label}"),
            offsets,
            database,
            pool,
            stats: Arc::new(Stats::default()),
            members: Vec::new(),
            restarts: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A group on `topic` sharing this group's database, offsets in PostgreSQL.
    fn sharing(&self, topic: &str, label: &str) -> Group {
        Group {
            label: label.to_owned(),
            name: format!("{topic}-{label}"),
            offsets: OffsetStore::Postgres,
            database: self.database.clone(),
            pool: self.pool.clone(),
            stats: Arc::new(Stats::default()),
            members: Vec::new(),
            restarts: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Starts member `n` with `handler` on `idem`, settings adjusted by `configure`. A
    /// member that stops with `ConsumerError::Stalled` (the group's rebalance did not hand
    /// it the partitions that wait) is started again, as its orchestrator would restart
    /// the process, and counted; any other error ends the task with it.
    #[allow(clippy::too_many_arguments)]
    fn start<H: Handler + Clone>(
        &mut self,
        brokers: &str,
        topic: &str,
        stop: &watch::Sender<bool>,
        n: usize,
        idem: Idem,
        handler: H,
        configure: impl Fn(ConsumerBuilder) -> ConsumerBuilder + Send + 'static,
    ) {
        let (brokers, topic, name) = (brokers.to_owned(), topic.to_owned(), self.name.clone());
        let (offsets, stats, restarts) = (self.offsets, self.stats.clone(), self.restarts.clone());
        let stop = stop.subscribe();
        self.members.push(tokio::spawn(async move {
            loop {
                let builder = Consumer::builder(&brokers, &name, &topic)
                    .client_id(format!("{name}-{n}"))
                    .offsets(offsets)
                    .session_timeout(Duration::from_secs(6))
                    .retry_backoff(Duration::from_millis(50), Duration::from_secs(1))
                    .stats(stats.clone());
                let consumer = configure(builder)
                    .build(idem.clone(), handler.clone())
                    .unwrap();
                let mut stopped = stop.clone();
                match consumer
                    .run(async move {
                        stopped.wait_for(|stop| *stop).await.ok();
                    })
                    .await
                {
                    Err(ConsumerError::Stalled(why)) if !*stop.borrow() => {
                        eprintln!("{name}-{n} stopped with Stalled ({why}); starting it again");
                        restarts.fetch_add(1, Ordering::SeqCst);
                    }
                    ended => return ended,
                }
            }
        }));
    }

    /// Whether the group processed every partition to its end and, with offsets in
    /// PostgreSQL, whether the positions stored on the (new) primary reached it: the
    /// members' counters keep the furthest position they saw, which a primary that lost
    /// commits has not.
    async fn caught_up(&self, topic: &str, end_offsets: &HashMap<i32, i64>) -> bool {
        if !self.stats.caught_up(topic, end_offsets) {
            return false;
        }
        if self.offsets != OffsetStore::Postgres {
            return true;
        }
        let Ok(stored) = sqlx::query_as::<_, (i32, i64)>(
            "SELECT kafka_partition, next_offset FROM idem_kafka.kafka_offsets
             WHERE consumer_group = $1 AND topic = $2",
        )
        .bind(&self.name)
        .bind(topic)
        .fetch_all(&self.pool)
        .await
        else {
            return false;
        };
        let stored: HashMap<i32, i64> = stored.into_iter().collect();
        end_offsets.iter().all(|(partition, &end)| {
            end <= 0 || stored.get(partition).is_some_and(|&next| next >= end)
        })
    }

    async fn outcome(&self, plan: &Plan, applied_in_window: u64) -> Outcome {
        let verification = verify::verify(&self.pool, &plan.events).await.unwrap();
        let keys = keys(&self.pool).await;
        let dead_letters = verify::dead_letters(&self.pool, &self.name)
            .await
            .unwrap()
            .len();
        Outcome {
            label: self.label.clone(),
            facts: verification.facts,
            lost: verification.missing,
            doubled: verification.applied_twice,
            applied: verification.applied_facts,
            unexpected: verification.unexpected,
            charged: keys.charged,
            not_success: keys.failed + keys.processing,
            dead_letters,
            applied_in_window,
        }
    }
}

/// What idem's status table says of a group's keys.
struct Keys {
    /// All keys.
    total: i64,
    /// Keys whose body ran more than once (an attempt charged).
    charged: i64,
    /// Keys `failed` or `parked`.
    failed: i64,
    /// Keys still `processing`: a lease whose success mark was lost.
    processing: i64,
}

/// Reads idem's status table (in the default schema `idem`).
async fn keys(pool: &PgPool) -> Keys {
    let (total, charged, failed, processing) = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE attempts > 1),
                count(*) FILTER (WHERE status IN ('failed', 'parked')),
                count(*) FILTER (WHERE status = 'processing')
         FROM (SELECT attempts, status FROM idem.idem_keys
               UNION ALL SELECT attempts, status FROM idem.idem_timed_keys) AS k",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    Keys {
        total,
        charged,
        failed,
        processing,
    }
}

/// Publishes `records` at [`RECORDS_PER_SECOND`], a chunk at a time, counting in `sent`;
/// each `(at, phase)` of `holds` holds record `at` and those after it until `phase` is
/// reached.
async fn produce_paced(
    producer: FutureProducer,
    topic: String,
    records: Vec<PlannedRecord>,
    (mut holds, mut phase): (Vec<(usize, u8)>, watch::Receiver<u8>),
    sent: Arc<AtomicUsize>,
) -> producer::ProduceReport {
    const CHUNK: usize = 20;
    let mut started = tokio::time::Instant::now();
    let mut report = producer::ProduceReport::default();
    holds.reverse();
    for (n, chunk) in records.chunks(CHUNK).enumerate() {
        while let Some(&(at, until)) = holds.last()
            && n * CHUNK >= at
        {
            // Held until the phase; the pace starts over from there.
            holds.pop();
            if *phase.borrow() < until {
                phase.wait_for(|now| *now >= until).await.ok();
                started = tokio::time::Instant::now() - pace(n * CHUNK);
            }
        }
        tokio::time::sleep_until(started + pace(n * CHUNK)).await;
        let done = producer::produce(&producer, &topic, &part(chunk), CHUNK, |_, _| {})
            .await
            .unwrap();
        report.records += done.records;
        for (partition, end) in done.end_offsets {
            let entry = report.end_offsets.entry(partition).or_insert(0);
            *entry = (*entry).max(end);
        }
        sent.fetch_add(done.records, Ordering::SeqCst);
    }
    report
}

/// Runs an outbox relay on `idem` until `stop`; one that stops with an error is started
/// again, as an orchestrator restarts a process that exited. Returns how many times.
async fn relay(brokers: String, idem: Idem, mut stop: watch::Receiver<bool>) -> u32 {
    let mut restarts = 0;
    loop {
        let relay = Relay::builder(&brokers)
            .poll(Duration::from_millis(100))
            .build(&idem)
            .unwrap();
        let mut stopped = stop.clone();
        let ran = relay
            .run(async move {
                stopped.wait_for(|stop| *stop).await.ok();
            })
            .await;
        match ran {
            Ok(()) => return restarts,
            Err(error) => {
                eprintln!("the outbox relay stopped: {error}; starting it again");
                restarts += 1;
                if *stop.borrow_and_update() {
                    return restarts;
                }
            }
        }
    }
}

/// The offset after the last record of each partition of `topic`.
async fn high_watermarks(brokers: &str, topic: &str) -> HashMap<i32, i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .unwrap();
        (0..PARTITIONS)
            .map(|partition| {
                let (_, high) = client
                    .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                    .unwrap();
                (partition, high)
            })
            .collect()
    })
    .await
    .unwrap()
}

/// When record `n` of the stream is due, from its start.
fn pace(n: usize) -> Duration {
    Duration::from_secs_f64(n as f64 / RECORDS_PER_SECOND as f64)
}

/// A plan of `records` alone, to publish them.
fn part(records: &[PlannedRecord]) -> Plan {
    Plan {
        events: Vec::new(),
        records: records.to_vec(),
        tail: Vec::new(),
    }
}

/// Messages done with by every group (executed, duplicates, skipped, dead-lettered): what
/// grows while the consumers work. Retries do not count: a group stuck retrying is not
/// progressing.
fn processed(groups: &[&Group]) -> u64 {
    groups
        .iter()
        .map(|group| {
            let s = group.stats.snapshot();
            s.executed + s.duplicates + s.skipped + s.dead_letters
        })
        .sum()
}

/// Each group's counters, for a failed wait.
fn progress(groups: &[&Group]) -> String {
    groups
        .iter()
        .map(|group| format!("{}: {:?}", group.label, group.stats.snapshot()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Waits until `done()` holds, checking every 100 ms, for as long as `progress()` moves:
/// panics with `what()` when it has not moved for [`STALL`] (a group that stopped, not a
/// slow one).
async fn wait_while_progressing<F: Future<Output = bool>>(
    mut done: impl FnMut() -> F,
    mut progress: impl FnMut() -> u64,
    what: impl Fn() -> String,
) {
    let started = Instant::now();
    let mut last = progress();
    let mut moved_at = Instant::now();
    let mut reported = Instant::now();
    while !done().await {
        if std::env::var_os("IDEM_FAILOVER_PROGRESS").is_some()
            && reported.elapsed() >= Duration::from_secs(5)
        {
            eprintln!("after {:.0?}: {}", started.elapsed(), what());
            reported = Instant::now();
        }
        let now = progress();
        if now != last {
            last = now;
            moved_at = Instant::now();
        }
        assert!(
            moved_at.elapsed() < STALL,
            "no progress for {STALL:?} (after {:.0?} in all, {last} processed): {}",
            started.elapsed(),
            what()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
