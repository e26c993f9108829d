//! The end-to-end scenario of the Kafka tests, on the per-message and the batch path.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_demo::kafka::handlers::{self, OrderEvents};
use idem_demo::kafka::producer::{MalformedKind, Plan, PlanConfig, RecordKind};
use idem_demo::kafka::verify;
use idem_kafka::{OffsetStore, Stats};
use idem_runtime::Status;
use sqlx::PgPool;

use crate::support::{Harness, Stillness, Supervisor, delivered, total};

const EVENTS: usize = 10_000;
const DUPLICATE_RATE: f64 = 0.3;
const MALFORMED: usize = 12;
const CONSUMERS: usize = 3;
const PARTITIONS: i32 = 6;
/// The members' stall bound: partitions that nobody consumes are handed out again within
/// seconds (the default is 30 s).
const STALL_BOUND: Duration = Duration::from_secs(12);
/// A wait fails when the members have not moved for this long: several of the stall
/// watch's rejoins.
const NO_PROGRESS: Duration = Duration::from_secs(90);

/// Publishes 10,000 facts with 30% duplicate sends and 12 malformed messages to 6
/// partitions, consumes them with three consumers of one group (`batch_size` messages per
/// transaction), kills the busiest mid-stream and starts a new member in its place, and
/// checks every guarantee by SQL. The members run under a supervisor that starts again a
/// member that gave up on a stalled group.
pub async fn every_fact_applied_once_despite_a_killed_consumer(
    pool: PgPool,
    offsets: OffsetStore,
    batch_size: usize,
) {
    let harness = Harness::new(&pool, &format!("{offsets}-b{batch_size}"), PARTITIONS).await;
    scenario(harness, offsets, batch_size).await;
}

/// The scenario with the consumers behind PgBouncer in transaction pooling.
pub async fn through_transaction_pooling(pool: PgPool, offsets: OffsetStore, batch_size: usize) {
    let label = format!("pooled-{offsets}-b{batch_size}");
    let harness = Harness::through_transaction_pooler(&pool, &label, PARTITIONS).await;
    scenario(harness, offsets, batch_size).await;
}

async fn scenario(harness: Harness, offsets: OffsetStore, batch_size: usize) {
    let started = Instant::now();
    let plan = Plan::new(&PlanConfig {
        events: EVENTS,
        duplicate_rate: DUPLICATE_RATE,
        malformed: MALFORMED,
        seed: 11,
        order_prefix: format!("order-{}", harness.id),
        scatter_duplicates: false,
    });
    let records = plan.all().count();
    let duplicates = plan.count(|kind| kind == RecordKind::Duplicate);
    assert!(
        duplicates * 5 >= records,
        "at least 20% of the deliveries are duplicates"
    );

    // Every member's counters, by name: a member started again keeps its own.
    let stats: Arc<Mutex<BTreeMap<String, Arc<Stats>>>> = Arc::default();
    let names: Vec<String> = (0..CONSUMERS).map(|n| format!("c{n}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut supervisor = Supervisor::start(&harness, &names, {
        let stats = stats.clone();
        move |harness, name| {
            let counters = lock(&stats).entry(name.to_owned()).or_default().clone();
            harness.member(name, OrderEvents, |builder| {
                builder
                    .offsets(offsets)
                    .batch_size(batch_size)
                    .stall_bound(STALL_BOUND)
                    .stats(counters)
            })
        }
    });
    let all_stats = || -> Vec<Arc<Stats>> { lock(&stats).values().cloned().collect() };
    let producing = harness.produce(&plan);

    // Mid-stream, kill the busiest consumer: it commits nothing more, and the messages it
    // processed since its last commit go to the others again.
    let mut still = Stillness::new(NO_PROGRESS, 0);
    loop {
        supervisor.check(&harness).await;
        let counted = total(&every(&all_stats()));
        if counted.deliveries >= records as u64 / 3 {
            break;
        }
        still.check(counted.deliveries, || {
            format!("a third of the records consumed: {counted:?}")
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let busiest = (0..supervisor.members.len())
        .max_by_key(|&n| supervisor.members[n].stats.snapshot().deliveries)
        .unwrap();
    let victim = supervisor.members.remove(busiest);
    let killed_after = victim.stats.snapshot();
    victim.kill.kill();
    victim.task.abort();
    assert!(victim.task.await.unwrap_err().is_cancelled());
    assert!(
        killed_after.deliveries > 0,
        "the killed consumer was consuming"
    );
    // The killed member's process comes back, as its orchestrator restarts it: it joins
    // the group, and the group rebalances. The broker the tests run on (tansu 0.6) does
    // not always rebalance a group that a member left, and may leave partitions with
    // nobody consuming them: the members' stall watch (a short stall bound here) then
    // has them leave the group and join it again, and a member that gives up is started
    // again by the supervisor, as in production.
    supervisor.add(&harness, "c-restarted");

    let produced = producing.await.unwrap();
    assert_eq!(produced.records, records);
    assert_eq!(produced.malformed.len(), MALFORMED);
    // The group stands still while it notices the kill (the session timeout) and rebalances.
    let mut still = Stillness::new(NO_PROGRESS, delivered(&every(&all_stats())));
    loop {
        supervisor.check(&harness).await;
        let members = all_stats();
        if idem_kafka::caught_up(
            members.iter().map(Arc::as_ref),
            &harness.topic,
            &produced.end_offsets,
        ) {
            break;
        }
        still.check(delivered(&every(&members)), || {
            format!(
                "every partition consumed to its end {:?}; per member, deliveries, retries and positions {:?}; members started again {:?}",
                produced.end_offsets,
                lock(&stats)
                    .iter()
                    .map(|(name, stats)| {
                        let counted = stats.snapshot();
                        (name.clone(), counted.deliveries, counted.retries, stats.positions())
                    })
                    .collect::<Vec<_>>(),
                supervisor.restarts,
            )
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    harness.stop(supervisor.into_members()).await;
    let all_stats = all_stats();
    let counted = total(&every(&all_stats));

    // Every fact exactly once: effect rows, order totals.
    let verification = verify::verify(&harness.pool, &plan.events).await.unwrap();
    assert!(verification.exactly_once(), "{verification}");
    assert_eq!(verification.facts, EVENTS as i64);

    // The status table: one success per fact, one parked key per refused event.
    // The key and fingerprint of the generated key function (the batch positions' keys)
    // are the ones the handlers recorded: every fact's key is done with its own payload.
    let keys: Vec<_> = plan
        .events
        .iter()
        .map(|event| handlers::apply_order_event_key(event).unwrap())
        .collect();
    let mut conn = harness.pool.acquire().await.unwrap();
    let done = harness
        .idem
        .done_handler_keys(&mut conn, &keys)
        .await
        .unwrap();
    drop(conn);
    assert_eq!(done.iter().filter(|done| **done).count(), EVENTS);
    // The refused events' keys are parked.
    for malformed in produced
        .malformed
        .iter()
        .filter(|m| m.kind == MalformedKind::Parked)
    {
        let event: idem_demo::orders::OrderEvent =
            serde_json::from_slice(&malformed.payload).unwrap();
        let key = handlers::apply_order_event_key(&event).unwrap();
        let record = harness.idem.record(key.scope(), key.key()).await.unwrap();
        assert_eq!(record.map(|r| r.status), Some(Status::Parked));
    }

    // The dead letters: exactly the injected messages, with their bytes and coordinates.
    let dead: BTreeSet<(i32, i64, String, Vec<u8>)> =
        verify::dead_letters(&harness.pool, &harness.group)
            .await
            .unwrap()
            .into_iter()
            .map(|dead| {
                (
                    dead.kafka_partition,
                    dead.kafka_offset,
                    dead.reason,
                    dead.payload.unwrap_or_default(),
                )
            })
            .collect();
    let injected: BTreeSet<(i32, i64, String, Vec<u8>)> = produced
        .malformed
        .iter()
        .map(|m| {
            (
                m.partition,
                m.offset,
                m.kind.reason().as_str().to_owned(),
                m.payload.clone(),
            )
        })
        .collect();
    assert_eq!(dead, injected);

    // Every record was received at least once.
    assert!(counted.deliveries >= records as u64, "{counted:?}");
    eprintln!(
        "offsets in {offsets}, batch size {batch_size}: {records} records ({duplicates} duplicate sends, \
         {MALFORMED} malformed), {} deliveries ({} redelivered after the kill), {} applied, \
         {} duplicates skipped, {} dead-lettered, {} retries, {} batches; killed consumer had \
         {} deliveries; {:.1} s",
        counted.deliveries,
        counted.deliveries - records as u64,
        counted.executed,
        counted.duplicates,
        counted.dead_letters,
        counted.retries,
        counted.batches,
        killed_after.deliveries,
        started.elapsed().as_secs_f64()
    );
    harness.finish().await;
}

/// The counters of every member, for the waits.
fn every(stats: &[Arc<Stats>]) -> Vec<&Arc<Stats>> {
    stats.iter().collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
