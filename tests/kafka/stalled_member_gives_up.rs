//! A member that the group never gives the partitions that wait: it sees them stand still
//! (its headway shows them stalled, held by no member here), rejoins the group, and when
//! that does not help it stops with `ConsumerError::Stalled`, for its supervisor to start
//! it again, instead of waiting for ever in silence.
//!
//! The partition is held by a member that never consumes it: a plain rdkafka client that
//! joins the group first, leads it (its client id sorts first, so the range assignor
//! gives it the only partition, at every rebalance) and pauses what it is given.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idem_demo::kafka::handlers::OrderEvents;
use idem_demo::kafka::producer::{Plan, PlanConfig};
use idem_kafka::{ConsumerError, OffsetStore};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use sqlx::PgPool;

use crate::support::{Harness, wait_until};

const STALL_BOUND: Duration = Duration::from_secs(3);

#[sqlx::test(migrations = false)]
async fn a_member_never_given_the_waiting_partition_stops_with_an_error(pool: PgPool) {
    stalled(pool, OffsetStore::Kafka).await;
}

#[sqlx::test(migrations = false)]
async fn the_same_with_offsets_in_postgres(pool: PgPool) {
    stalled(pool, OffsetStore::Postgres).await;
}

async fn stalled(pool: PgPool, offsets: OffsetStore) {
    let harness = Harness::new(&pool, &format!("stalled-{offsets}"), 1).await;
    let plan = Plan::new(&PlanConfig {
        events: 60,
        duplicate_rate: 0.0,
        malformed: 0,
        seed: 9,
        order_prefix: format!("order-{}", harness.id),
        scatter_duplicates: false,
    });
    harness.produce(&plan).await.unwrap();

    let holder = Holder::start(&harness.brokers, &harness.group, &harness.topic);
    wait_until(
        Duration::from_secs(60),
        || holder.holds.load(Ordering::SeqCst),
        || "the holder was given the partition".to_owned(),
    )
    .await;

    let started = Instant::now();
    let member = harness.member("c0", OrderEvents, |builder| {
        builder.offsets(offsets).stall_bound(STALL_BOUND)
    });
    let stats = member.stats.clone();
    let ended = tokio::time::timeout(Duration::from_secs(120), member.task)
        .await
        .expect("the member stopped by itself")
        .unwrap();
    let took = started.elapsed();
    holder.stop();
    let Err(ConsumerError::Stalled(why)) = ended else {
        panic!("the member stops with ConsumerError::Stalled: {ended:?}");
    };
    assert!(why.contains("[0]"), "the error names the partition: {why}");
    let seen = stats.headway();
    assert!(
        seen.iter()
            .any(|p| p.partition == 0 && p.stalled && !p.held && p.lag == 60),
        "the member's last look shows the partition stalled, with all its records behind, held by no member here: {seen:?}"
    );
    let snapshot = stats.snapshot();
    assert_eq!(snapshot.deliveries, 0, "it was never given a message");
    // A stall bound to see the stall, one to the first rejoin's next look, two more to
    // give up: well within a minute, however slow the machine.
    eprintln!("{offsets}: stopped after {took:.1?}: {why}");
    harness.finish().await;
}

/// A member of the group that pauses every partition it is given.
struct Holder {
    holds: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct Pausing(Arc<AtomicBool>);

impl rdkafka::ClientContext for Pausing {}

impl ConsumerContext for Pausing {
    fn post_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(partitions) => {
                base.pause(partitions).ok();
                self.0.store(partitions.count() > 0, Ordering::SeqCst);
            }
            Rebalance::Revoke(_) => self.0.store(false, Ordering::SeqCst),
            Rebalance::Error(_) => {}
        }
    }
}

impl Holder {
    fn start(brokers: &str, group: &str, topic: &str) -> Holder {
        let holds = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let consumer: BaseConsumer<Pausing> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            // Sorts before the members' ids (`<group>-<name>`): it leads, and is given the
            // partition.
            .set("client.id", "a-holder")
            .set("enable.auto.commit", "false")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "1500")
            .create_with_context(Pausing(holds.clone()))
            .unwrap();
        consumer.subscribe(&[topic]).unwrap();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::SeqCst) {
                    // Whatever was fetched before the pause is dropped: nothing is committed.
                    let _ = consumer.poll(Duration::from_millis(100));
                }
                consumer.unsubscribe();
            }
        });
        Holder {
            holds,
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().ok();
        }
    }
}
