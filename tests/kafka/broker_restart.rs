//! The broker is killed (SIGKILL) and started again on the same storage while two members
//! consume; more records are produced once it is back. Every fact is applied exactly once
//! and every partition is consumed again: with offsets in Kafka and in PostgreSQL, one
//! message per transaction and batches, static members (`group.instance.id`) and dynamic
//! ones, with the default 30 s session, which a 5 s outage does not end (no rebalance when
//! the broker is back).
//!
//! And an outage longer than the session (10 s, 6 s sessions, dynamic members): the
//! broker has ended every session when it comes back, the members join the group again,
//! and every fact is applied exactly once. A member that stops with
//! `ConsumerError::Stalled` is started again by the test, as its supervisor would.
//!
//! Not tested: static members with an outage longer than the session. tansu 0.6 can leave
//! such a group waiting for a leader that is no longer a member, and it never completes a
//! rebalance.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_demo::kafka::handlers::OrderEvents;
use idem_demo::kafka::producer::{Plan, PlanConfig, ProduceReport};
use idem_demo::kafka::verify;
use idem_kafka::{OffsetStore, Stats};
use sqlx::PgPool;

use crate::support::{Harness, Stillness, Supervisor, Warnings, wait_while_progressing};

const PARTITIONS: i32 = 6;
/// Facts in each half (with 20% duplicates on top).
const EVENTS: usize = 600;
/// The consumer's default session.
const DEFAULT_SESSION: Duration = Duration::from_secs(30);
/// A wait fails when the members have not moved for this long.
const NO_PROGRESS: Duration = Duration::from_secs(90);
const MEMBERS: [&str; 2] = ["c0", "c1"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Membership {
    /// `group.instance.id` set: static members.
    Static,
    Dynamic,
}

#[derive(Debug, Clone, Copy)]
struct Scenario {
    offsets: OffsetStore,
    batch_size: usize,
    membership: Membership,
    session: Duration,
    /// `None`: the consumer's default (twice the session).
    stall_bound: Option<Duration>,
    outage: Duration,
}

impl Scenario {
    /// The default session, a 5 s outage.
    fn short(offsets: OffsetStore, batch_size: usize, membership: Membership) -> Self {
        Scenario {
            offsets,
            batch_size,
            membership,
            session: DEFAULT_SESSION,
            stall_bound: None,
            outage: Duration::from_secs(5),
        }
    }
}

#[sqlx::test(migrations = false)]
async fn static_members_offsets_in_kafka_one_per_transaction(pool: PgPool) {
    restarted(
        pool,
        Scenario::short(OffsetStore::Kafka, 1, Membership::Static),
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn static_members_offsets_in_kafka_batches(pool: PgPool) {
    restarted(
        pool,
        Scenario::short(OffsetStore::Kafka, 50, Membership::Static),
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn static_members_offsets_in_postgres_one_per_transaction(pool: PgPool) {
    restarted(
        pool,
        Scenario::short(OffsetStore::Postgres, 1, Membership::Static),
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn static_members_offsets_in_postgres_batches(pool: PgPool) {
    restarted(
        pool,
        Scenario::short(OffsetStore::Postgres, 50, Membership::Static),
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn dynamic_members_offsets_in_kafka_one_per_transaction(pool: PgPool) {
    restarted(
        pool,
        Scenario::short(OffsetStore::Kafka, 1, Membership::Dynamic),
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn dynamic_members_offsets_in_kafka_batches(pool: PgPool) {
    restarted(
        pool,
        Scenario::short(OffsetStore::Kafka, 50, Membership::Dynamic),
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn dynamic_members_offsets_in_postgres_one_per_transaction(pool: PgPool) {
    restarted(
        pool,
        Scenario::short(OffsetStore::Postgres, 1, Membership::Dynamic),
    )
    .await;
}

#[sqlx::test(migrations = false)]
async fn dynamic_members_offsets_in_postgres_batches(pool: PgPool) {
    restarted(
        pool,
        Scenario::short(OffsetStore::Postgres, 50, Membership::Dynamic),
    )
    .await;
}

/// The broker down for longer than the members' sessions: every session has ended when it
/// is back, and the members join the group again.
#[sqlx::test(migrations = false)]
async fn an_outage_longer_than_the_session_dynamic_members_join_again(pool: PgPool) {
    restarted(
        pool,
        Scenario {
            offsets: OffsetStore::Kafka,
            batch_size: 1,
            membership: Membership::Dynamic,
            session: Duration::from_secs(6),
            stall_bound: Some(Duration::from_secs(12)),
            outage: Duration::from_secs(10),
        },
    )
    .await;
}

async fn restarted(pool: PgPool, scenario: Scenario) {
    let Scenario {
        offsets,
        batch_size,
        membership,
        session,
        stall_bound,
        outage,
    } = scenario;
    let (warnings, _capturing) = Warnings::capture();
    let label = format!(
        "restart-{offsets}-b{batch_size}-{}-s{}",
        match membership {
            Membership::Static => "static",
            Membership::Dynamic => "dynamic",
        },
        session.as_secs()
    );
    let mut harness = Harness::with_private_broker(&pool, &label, PARTITIONS).await;
    let plan = |part: &str, seed: u64| {
        Plan::new(&PlanConfig {
            events: EVENTS,
            duplicate_rate: 0.2,
            malformed: 0,
            seed,
            order_prefix: format!("order-{}-{part}", harness.id),
            scatter_duplicates: false,
        })
    };
    let (first, later) = (plan("a", 21), plan("b", 22));

    // Each member's counters, kept across its restarts.
    let stats: HashMap<String, Arc<Stats>> = MEMBERS
        .iter()
        .map(|name| (name.to_string(), Arc::new(Stats::default())))
        .collect();
    let mut supervisor = Supervisor::start(&harness, &MEMBERS, {
        let stats = stats.clone();
        let group = harness.group.clone();
        move |harness, name| {
            let stats = stats[name].clone();
            let instance = format!("{group}-{name}");
            harness.member(name, OrderEvents, move |builder| {
                let builder = builder
                    .offsets(offsets)
                    .batch_size(batch_size)
                    .session_timeout(session)
                    .stats(stats);
                let builder = match stall_bound {
                    Some(bound) => builder.stall_bound(bound),
                    None => builder,
                };
                match membership {
                    Membership::Static => builder.set("group.instance.id", instance),
                    Membership::Dynamic => builder,
                }
            })
        }
    });
    let all: Vec<&Arc<Stats>> = stats.values().collect();
    let delivered = || all.iter().map(|s| s.snapshot().deliveries).sum::<u64>();
    let held = |name: &str| -> Vec<i32> {
        stats[name]
            .headway()
            .iter()
            .filter(|p| p.held)
            .map(|p| p.partition)
            .collect()
    };

    // The group formed: each member holds partitions, all of them together.
    wait_while_progressing(
        NO_PROGRESS,
        || {
            let (c0, c1) = (held("c0"), held("c1"));
            !c0.is_empty() && !c1.is_empty() && c0.len() + c1.len() == PARTITIONS as usize
        },
        || 0,
        || {
            format!(
                "both members hold partitions: c0 {:?}, c1 {:?}",
                held("c0"),
                held("c1")
            )
        },
    )
    .await;
    let before = harness.produce(&first).await.unwrap();
    wait_while_progressing(
        NO_PROGRESS,
        || delivered() >= before.records as u64 / 3,
        delivered,
        || format!("a third of the first half delivered: {}", delivered()),
    )
    .await;

    // The broker crashes while the members consume, and comes back on its storage.
    let at_kill = delivered();
    harness.broker.kill().unwrap();
    tokio::time::sleep(outage).await;
    let start_took = harness.restart_broker().await;
    let back = Instant::now();
    let at_restart = delivered();

    let mut producing = Some(harness.produce(&later));
    let mut after: Option<ProduceReport> = None;
    let events: Vec<_> = first.events.iter().chain(&later.events).cloned().collect();
    let mut first_delivery: Option<Duration> = None;
    // Deliveries only: members started again and again without consuming are no progress.
    let mut still = Stillness::new(NO_PROGRESS, delivered());
    let recovered = loop {
        supervisor.check(&harness).await;
        if first_delivery.is_none() && delivered() > at_restart {
            first_delivery = Some(back.elapsed());
        }
        if producing.as_ref().is_some_and(|task| task.is_finished()) {
            after = Some(producing.take().unwrap().await.unwrap());
        }
        let verification = verify::verify(&pool, &events).await.unwrap();
        if let Some(after) = &after
            && verification.exactly_once()
            && idem_kafka::caught_up(
                all.iter().map(|s| s.as_ref()),
                &harness.topic,
                &after.end_offsets,
            )
        {
            break back.elapsed();
        }
        still.check(delivered(), || {
            format!(
                "every fact applied exactly once after the restart: {verification}; produced after it: {}; restarts {:?}; headway c0 {:?}, c1 {:?}; warnings:\n{}",
                after.is_some(),
                supervisor.restarts,
                stats["c0"].headway(),
                stats["c1"].headway(),
                warnings.last(30)
            )
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let after = after.expect("produced after the restart");
    // Every partition received records after the restart, and was consumed to its end.
    for partition in 0..PARTITIONS {
        let (was, is) = (
            before.end_offsets.get(&partition).copied().unwrap_or(0),
            after.end_offsets.get(&partition).copied().unwrap_or(0),
        );
        assert!(
            is > was,
            "partition {partition} has records produced after the restart: {was} then {is}"
        );
    }
    let restarts = supervisor.restarts.clone();
    harness.stop(supervisor.into_members()).await;

    crate::support::assert_every_fact_once(&pool, &harness.group, &events).await;
    let total = delivered();
    eprintln!(
        "broker restart [{label}]: killed at {at_kill} of {} deliveries, down {outage:?} (start took {start_took:.1?}); \
         first delivery {:.1?} after it was back, every fact applied exactly once {recovered:.1?} after; \
         rejoins {}, restarts {} {restarts:?}; {total} deliveries for {} records",
        before.records,
        first_delivery.unwrap_or_default(),
        warnings.rejoins(),
        restarts.len(),
        before.records + after.records,
    );
    harness.finish().await;
}
