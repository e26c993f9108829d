//! Through a real Kafka-API broker, with duplicate sends on other partitions and three
//! notification consumers of one group, one of which crashes mid-effect (the notification
//! went out, its key is not marked), every paid order event is notified exactly once on
//! the external side: a duplicate handled elsewhere while the lease lives is retried as in
//! progress, the crashed effect is repeated only after its lease expired, and the service
//! absorbs the repeat on the idempotency key.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{Harness, delivered, total, wait_until, wait_while_progressing};
use idem_demo::kafka::notifications::{
    self, Crash, LEASE, NotificationService, PaymentNotifications, ServiceSettings,
};
use idem_demo::kafka::producer::{Plan, PlanConfig};
use idem_demo::kafka::verify;
use idem_demo::orders::{EventType, OrderEvent};
use idem_kafka::{Fate, Handler, Stats};
use idem_runtime::Status;
use sqlx::PgPool;
use uuid::Uuid;

const EVENTS: usize = 1_500;
const CONSUMERS: usize = 3;
const PARTITIONS: i32 = 6;
/// The crashing consumer's notification that never returns.
const CRASH_AFTER: u64 = 20;

#[sqlx::test(migrations = false)]
async fn every_paid_event_is_notified_once_despite_duplicates_and_a_crash_mid_effect(pool: PgPool) {
    let started = Instant::now();
    let harness = Harness::new(&pool, "notify", PARTITIONS).await;
    let plan = Plan::new(&PlanConfig {
        events: EVENTS,
        duplicate_rate: 0.5,
        malformed: 0,
        seed: 13,
        order_prefix: format!("order-{}", harness.id),
        scatter_duplicates: true,
    });
    let records = plan.all().count();
    let paid: Vec<_> = plan
        .events
        .iter()
        .filter(|event| event.event_type == EventType::Paid)
        .collect();

    // Each consumer has its own client of the service, as separate processes would; the
    // first one hangs right after its 20th notification went out, holding the lease.
    let options = harness.pool.connect_options().as_ref().clone();
    let settings = ServiceSettings {
        latency: Duration::from_millis(5),
        crash_after: None,
    };
    let crashing = NotificationService::connect(
        options.clone(),
        ServiceSettings {
            crash_after: Some((CRASH_AFTER, Crash::Hang)),
            ..settings
        },
    )
    .await
    .unwrap();
    // The crashing member works one delivery at a time, so that its crash leaves one effect
    // in flight: a member working its partitions in parallel leaves each of the effects it
    // has in flight unmarked, each repeated once its lease expired.
    let mut members = vec![harness.member(
        "n0",
        PaymentNotifications::new(crashing.clone()),
        |builder| {
            builder
                .retry_backoff(Duration::from_millis(50), Duration::from_secs(1))
                .max_in_flight(1)
        },
    )];
    for n in 1..CONSUMERS {
        let service = NotificationService::connect(options.clone(), settings)
            .await
            .unwrap();
        members.push(harness.notifier(&format!("n{n}"), service));
    }
    let mut all_stats: Vec<Arc<Stats>> =
        members.iter().map(|member| member.stats.clone()).collect();
    let producing = harness.produce(&plan);

    wait_until(
        Duration::from_secs(90),
        || crashing.crashed(),
        || {
            format!(
                "the first consumer crashed mid-effect: {:?}",
                members[0].stats.snapshot()
            )
        },
    )
    .await;
    let crashed_at = Instant::now();
    // A duplicate of the crashed fact handled elsewhere while the lease lives is held off:
    // the consumer's handler answers a retry for a key in progress, which the consumer
    // backs off from without committing past it.
    let crashed_key = crashing.crashed_key().expect("the crash names its key");
    let crashed_event = paid
        .iter()
        .find(|event| notifications::notify_payment_key(event).unwrap().key() == crashed_key)
        .expect("the crashed key is a paid fact's");
    let elsewhere = PaymentNotifications::new(
        NotificationService::connect(options.clone(), settings)
            .await
            .unwrap(),
    );
    let fate = elsewhere.handle(&harness.idem, crashed_event, None).await;
    assert!(
        matches!(
            fate,
            Fate::Retry {
                in_progress: true,
                ..
            }
        ),
        "a duplicate during the lease is retried as in progress: {fate:?}"
    );
    assert!(
        crashed_at.elapsed() < LEASE,
        "the duplicate was handled while the lease lived"
    );
    let victim = members.remove(0);
    victim.kill.kill();
    victim.task.abort();
    assert!(victim.task.await.unwrap_err().is_cancelled());
    // Its process comes back with a client of its own, as its orchestrator restarts it:
    // joining, it makes the group rebalance (tansu 0.6 does not always rebalance a group
    // that a member left).
    let service = NotificationService::connect(options.clone(), settings)
        .await
        .unwrap();
    let restarted = harness.notifier("n0-restarted", service);
    all_stats.push(restarted.stats.clone());
    members.push(restarted);

    let produced = producing.await.unwrap();
    assert_eq!(produced.records, records);
    wait_while_progressing(
        Duration::from_secs(60),
        || {
            idem_kafka::caught_up(
                all_stats.iter().map(Arc::as_ref),
                &harness.topic,
                &produced.end_offsets,
            )
        },
        || delivered(&all_stats.iter().collect::<Vec<_>>()),
        || {
            format!(
                "every partition handled to its end {:?}: {:?}",
                produced.end_offsets,
                total(&all_stats.iter().collect::<Vec<_>>())
            )
        },
    )
    .await;
    let caught_up_after_crash = crashed_at.elapsed();
    harness.stop(members).await;
    let counted = total(&all_stats.iter().collect::<Vec<_>>());

    // The external side: one notification per paid fact, under the fact's key, with its
    // amount; one key called twice (the crashed effect, repeated after the lease expired
    // by another worker with another token), every other key once.
    let rows: Vec<(Uuid, String, i64, i32, Uuid, Uuid, f64)> = sqlx::query_as(
        "SELECT idempotency_key, order_id, amount_cents, calls, first_token, last_token,
                extract(epoch FROM last_call_at - first_call_at)::float8
         FROM notifications_sent",
    )
    .fetch_all(&harness.pool)
    .await
    .unwrap();
    let sent: BTreeMap<Uuid, (String, i64)> = rows
        .iter()
        .map(|(key, order, amount, ..)| (*key, (order.clone(), *amount)))
        .collect();
    let expected: BTreeMap<Uuid, (String, i64)> = paid
        .iter()
        .map(|event| {
            let key = notifications::notify_payment_key(event).unwrap().key();
            (key.as_uuid(), (event.order_id.clone(), event.amount_cents))
        })
        .collect();
    assert_eq!(rows.len(), paid.len(), "one row per paid fact");
    assert_eq!(sent, expected, "every paid fact, and nothing else");
    let repeated: Vec<_> = rows.iter().filter(|row| row.3 != 1).collect();
    assert_eq!(
        repeated.len(),
        1,
        "only the crashed effect repeated: {repeated:?}"
    );
    let (_, _, _, calls, first_token, last_token, gap) = repeated[0];
    assert_eq!(*calls, 2);
    assert_ne!(
        first_token, last_token,
        "the repeat came from another claim"
    );
    assert!(
        *gap >= LEASE.as_secs_f64() - 0.5,
        "the effect was repeated only after the lease expired: {gap:.2} s after the first call"
    );
    let summary = notifications::summary(&harness.pool).await.unwrap();
    assert_eq!(summary.delivered, paid.len() as i64);
    assert_eq!(summary.calls, paid.len() as i64 + 1);

    // The status table: every paid fact's key succeeded; the crashed one on its second
    // claim (the expired lease counted as an attempt).
    let mut attempts = BTreeMap::new();
    for event in &paid {
        let key = notifications::notify_payment_key(event).unwrap();
        let record = harness
            .idem
            .record(key.scope(), key.key())
            .await
            .unwrap()
            .expect("every paid fact has a key");
        assert_eq!(record.status, Status::Success, "{record:?}");
        *attempts.entry(record.attempts).or_insert(0) += 1;
    }
    assert_eq!(
        attempts.keys().max(),
        Some(&2),
        "the crashed key succeeded on its second claim: {attempts:?}"
    );

    // The consumers: every paid fact ran to success exactly once (deliveries that met a
    // lease, if any, were retried); the other events were skipped.
    assert_eq!(counted.executed, paid.len() as u64, "{counted:?}");
    assert!(counted.deliveries >= records as u64, "{counted:?}");
    assert_eq!(counted.dead_letters, 0, "{counted:?}");
    let not_paid = plan
        .all()
        .filter(|record| {
            let event: OrderEvent = serde_json::from_slice(&record.payload).unwrap();
            event.event_type != EventType::Paid
        })
        .count();
    assert!(counted.skipped >= not_paid as u64, "{counted:?}");
    assert!(
        verify::dead_letters(&harness.pool, &harness.group)
            .await
            .unwrap()
            .is_empty()
    );
    eprintln!(
        "notifications: {records} records ({} paid facts, {} duplicate sends on other partitions), \
         {} deliveries, {} notified, {} duplicates, {} skipped, {} retries ({} in progress); \
         service: {} delivered, {} calls, {} key repeated {gap:.1} s after its first call; \
         caught up {:.1} s after the crash; {:.1} s in all",
        paid.len(),
        produced.duplicates,
        counted.deliveries,
        counted.executed,
        counted.duplicates,
        counted.skipped,
        counted.retries,
        counted.in_progress,
        summary.delivered,
        summary.calls,
        summary.repeated_keys,
        caught_up_after_crash.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    harness.finish().await;
}
