//! What the Kafka tests share: a broker, a topic and a group of their own, a database
//! with the tables, consumers to start and kill.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_demo::kafka::broker::{BrokerError, LocalBroker};
use idem_demo::kafka::handlers::OrderEvents;
use idem_demo::kafka::notifications::{NotificationService, PaymentNotifications};
use idem_demo::kafka::producer::{self, Plan, ProduceReport};
use idem_demo::kafka::{self, admin, verify};
use idem_demo::orders::OrderEvent;
use idem_kafka::test_util::KillSwitch;
use idem_kafka::{Consumer, ConsumerBuilder, ConsumerError, Handler, OffsetStore, Snapshot, Stats};
use idem_runtime::Idem;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;
use tokio::sync::{Mutex, MutexGuard};
use tokio::task::JoinHandle;
use tracing::Instrument as _;

/// A broker, a fresh topic and group, and a migrated database.
pub struct Harness {
    pub broker: LocalBroker,
    pub brokers: String,
    pub topic: String,
    pub group: String,
    /// A prefix unique to this test, for order ids.
    pub id: String,
    pub pool: PgPool,
    pub idem: Idem,
    stop: watch::Sender<bool>,
    /// The link between the members and the database, with [`ROUND_TRIP_VARIABLE`].
    _link: Option<SlowLink>,
    /// The log of this test's thread (see [`test_log`]).
    log: Option<tracing::subscriber::DefaultGuard>,
    _one_at_a_time: MutexGuard<'static, ()>,
}

/// The round trip (in milliseconds, e.g. `1` or `0.5`) to add between every harness's
/// members and the test's database (a [`SlowLink`]), unset for none: the suites over a
/// network. Members through a pooler reach it directly.
pub const ROUND_TRIP_VARIABLE: &str = "IDEM_TEST_DATABASE_ROUND_TRIP_MS";

/// The slow link of the suites, in this folder (a module of this one, so that the other
/// binaries that share this file have it too).
#[allow(dead_code)]
#[path = "slow_link.rs"]
pub mod slow_link;

use slow_link::SlowLink;

/// The bound on a test's time, in this folder (a module of this one, as `slow_link`).
#[allow(dead_code)]
#[path = "watchdog.rs"]
pub mod watchdog;

/// How the consumers' handle reaches the test's database.
enum Reach {
    /// As the test's pool does.
    Direct,
    /// Through a transaction pooler at this URL.
    Pooler(String),
    /// Through a proxy at this address.
    Proxy(std::net::SocketAddr),
}

/// The tests that run consumers take turns: on 2 cores, several scenarios at once would
/// only measure each other's load (and time out).
static BROKER_TESTS: Mutex<()> = Mutex::const_new(());

/// A running consumer.
pub struct Member {
    pub name: String,
    pub stats: Arc<Stats>,
    pub kill: KillSwitch,
    pub task: JoinHandle<Result<(), ConsumerError>>,
}

impl Harness {
    /// Finds or starts the broker (failing, with how to install it, if `tansu` is
    /// missing), creates a topic with `partitions` partitions and the tables.
    pub async fn new(test_pool: &PgPool, label: &str, partitions: i32) -> Harness {
        Self::through(test_pool, label, partitions, Reach::Direct).await
    }

    /// [`new`](Self::new), with the consumers' handle reaching the test's database through
    /// a proxy at `proxy` (such as a `SlowLink` to it); `pool` stays a direct connection,
    /// for the checks.
    pub async fn through_proxy(
        test_pool: &PgPool,
        label: &str,
        partitions: i32,
        proxy: std::net::SocketAddr,
    ) -> Harness {
        Self::through(test_pool, label, partitions, Reach::Proxy(proxy)).await
    }

    /// [`new`](Self::new), on a broker of the test's own ([`LocalBroker::private`]: a
    /// fresh `tansu` on its own port and storage), which the test can kill and restart
    /// (`harness.broker.kill()`, [`restart_broker`](Self::restart_broker)).
    pub async fn with_private_broker(test_pool: &PgPool, label: &str, partitions: i32) -> Harness {
        Self::on_broker(
            test_pool,
            label,
            partitions,
            Reach::Direct,
            LocalBroker::private,
        )
        .await
    }

    /// [`new`](Self::new), with the consumers' handle reaching the test's database through
    /// PgBouncer in transaction pooling (`IDEM_PGBOUNCER_TRANSACTION_URL`, which
    /// `scripts/test.sh` exports); `pool` stays a direct connection, for the checks.
    pub async fn through_transaction_pooler(
        test_pool: &PgPool,
        label: &str,
        partitions: i32,
    ) -> Harness {
        let url = std::env::var("IDEM_PGBOUNCER_TRANSACTION_URL").expect(
            "IDEM_PGBOUNCER_TRANSACTION_URL: run the tests through scripts/test.sh, or export what `scripts/services.sh up --print-env pgbouncer` prints",
        );
        Self::through(test_pool, label, partitions, Reach::Pooler(url)).await
    }

    async fn through(test_pool: &PgPool, label: &str, partitions: i32, reach: Reach) -> Harness {
        Self::on_broker(test_pool, label, partitions, reach, LocalBroker::ensure).await
    }

    async fn on_broker(
        test_pool: &PgPool,
        label: &str,
        partitions: i32,
        reach: Reach,
        broker: fn() -> Result<LocalBroker, BrokerError>,
    ) -> Harness {
        let one_at_a_time = BROKER_TESTS.lock().await;
        // From its turn to the end of its thread: a test that hangs fails.
        watchdog::watch_this_test();
        // Unless the test captures its warnings (which logs to its output too).
        let log = (!CAPTURING.get()).then(|| tracing::subscriber::set_default(test_log()));
        // The suites over a network: members reach the database through a slow link.
        let mut link = None;
        let reach = match (reach, std::env::var(ROUND_TRIP_VARIABLE)) {
            (Reach::Direct, Ok(millis)) => {
                let millis: f64 = millis
                    .parse()
                    .unwrap_or_else(|_| panic!("{ROUND_TRIP_VARIABLE}: milliseconds"));
                let options = test_pool.connect_options();
                let target = format!("{}:{}", options.get_host(), options.get_port());
                let started = SlowLink::start(&target, Duration::from_secs_f64(millis / 1000.0))
                    .expect("a slow link to the database");
                let address = started.address();
                link = Some(started);
                Reach::Proxy(address)
            }
            (reach, _) => reach,
        };
        let broker = tokio::task::spawn_blocking(broker)
            .await
            .unwrap()
            .unwrap_or_else(|error| panic!("{error}"));
        let brokers = broker.brokers().to_owned();
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
        let topic = format!("idem-test-{label}-{id}");
        // Short timeouts: an outage shows as errors within a second or two.
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(test_pool.connect_options().as_ref().clone())
            .await
            .unwrap();
        let idem = match reach {
            Reach::Direct => Idem::new(pool.clone()),
            Reach::Proxy(address) => {
                let options = test_pool
                    .connect_options()
                    .as_ref()
                    .clone()
                    .host(&address.ip().to_string())
                    .port(address.port());
                let linked = PgPoolOptions::new()
                    .max_connections(10)
                    .acquire_timeout(Duration::from_secs(2))
                    .connect_with(options)
                    .await
                    .unwrap();
                Idem::new(linked)
            }
            Reach::Pooler(url) => {
                let database = test_pool
                    .connect_options()
                    .get_database()
                    .unwrap_or("postgres")
                    .to_owned();
                let options = url
                    .parse::<sqlx::postgres::PgConnectOptions>()
                    .expect("a PostgreSQL URL")
                    .database(&database);
                let pooled = PgPoolOptions::new()
                    .max_connections(10)
                    .acquire_timeout(Duration::from_secs(2))
                    .connect_with(options)
                    .await
                    .unwrap();
                Idem::builder(pooled)
                    .pooler(idem_runtime::Pooler::Transaction)
                    .build()
                    .unwrap()
            }
        };
        kafka::prepare(&idem).await.unwrap();
        admin::wait_for_broker(&brokers, Duration::from_secs(30))
            .await
            .unwrap_or_else(|error| panic!("the broker at {brokers} does not answer: {error}"));
        admin::create_topic(&brokers, &topic, partitions)
            .await
            .unwrap();
        Harness {
            broker,
            brokers,
            group: topic.clone(),
            topic,
            id,
            pool,
            idem,
            stop: watch::channel(false).0,
            _link: link,
            log,
            _one_at_a_time: one_at_a_time,
        }
    }

    /// Leaves this thread's log to the global subscriber (a test that installs its own).
    pub fn log_to_the_global_subscriber(&mut self) {
        self.log = None;
    }

    /// Starts an order consumer of the group, one message per transaction.
    pub fn consumer(&self, name: &str, offsets: OffsetStore) -> Member {
        self.batch_consumer(name, offsets, 1)
    }

    /// Starts an order consumer of the group, `batch_size` messages per transaction.
    pub fn batch_consumer(&self, name: &str, offsets: OffsetStore, batch_size: usize) -> Member {
        self.member(name, OrderEvents, |builder| {
            builder.offsets(offsets).batch_size(batch_size)
        })
    }

    /// Starts a payment-notification consumer of the group, calling `service`, retrying
    /// at least every second.
    pub fn notifier(&self, name: &str, service: NotificationService) -> Member {
        self.member(name, PaymentNotifications::new(service), |builder| {
            builder.retry_backoff(Duration::from_millis(50), Duration::from_secs(1))
        })
    }

    /// Starts a consumer of the group with `handler`, its settings adjusted by `configure`.
    pub fn member<H: Handler>(
        &self,
        name: &str,
        handler: H,
        configure: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder,
    ) -> Member {
        let builder = Consumer::builder(&self.brokers, &self.group, &self.topic)
            .client_id(format!("{}-{name}", self.group))
            .session_timeout(Duration::from_secs(6));
        let consumer = configure(builder)
            .build(self.idem.clone(), handler)
            .unwrap();
        let stats = consumer.stats();
        let kill = consumer.kill_switch();
        let mut stopped = self.stop.subscribe();
        let run = consumer.run(async move {
            stopped.wait_for(|stop| *stop).await.ok();
        });
        let task = tokio::spawn(run.instrument(tracing::info_span!("member", name)));
        Member {
            name: name.to_owned(),
            stats,
            kill,
            task,
        }
    }

    /// Starts the broker of [`with_private_broker`](Self::with_private_broker) again, on
    /// its port and storage (killing it first if it still runs), and waits until it
    /// answers. Returns how long the start took. The start blocks the test's thread (and
    /// the consumers' tasks on it) for the moment `tansu` takes to listen.
    pub async fn restart_broker(&mut self) -> Duration {
        let started = Instant::now();
        self.broker
            .restart()
            .unwrap_or_else(|error| panic!("the broker starts again: {error}"));
        admin::wait_for_broker(&self.brokers, Duration::from_secs(30))
            .await
            .unwrap_or_else(|error| panic!("the restarted broker does not answer: {error}"));
        started.elapsed()
    }

    /// Publishes `plan` in the background.
    pub fn produce(&self, plan: &Plan) -> JoinHandle<ProduceReport> {
        let (brokers, topic, plan) = (self.brokers.clone(), self.topic.clone(), plan.clone());
        tokio::spawn(async move {
            let producer = producer::create_producer(&brokers).unwrap();
            producer::produce(&producer, &topic, &plan, 500, |_, _| {})
                .await
                .unwrap()
        })
    }

    /// Asks every consumer to stop gracefully and waits for them.
    pub async fn stop(&self, members: Vec<Member>) {
        self.stop.send(true).ok();
        for member in members {
            member.task.await.unwrap().unwrap();
        }
    }

    /// Closes the pool. The topic stays: deleting a topic while other clients of the
    /// broker run can crash them (librdkafka 2.12 against tansu 0.6), and the broker the
    /// tests start is thrown away with its storage anyway.
    pub async fn finish(self) {
        // A pooler keeps its server connections to the test's database: ended here, so
        // that the database can be dropped.
        if let Err(error) = sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .execute(&self.pool)
        .await
        {
            eprintln!("could not end the pooler's connections to the test database: {error}");
        }
        self.idem.pool().close().await;
        self.pool.close().await;
    }
}

/// The members' rebalances (info) and warnings, to the output of the test whose thread
/// runs them (`#[sqlx::test]` runs a test and its members on one thread), each line in
/// the span of the member that logged it: a failed test shows what its group went
/// through.
fn test_log() -> impl tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    let levels = Targets::new()
        .with_default(LevelFilter::WARN)
        .with_target("idem_kafka", LevelFilter::INFO)
        .with_target("librdkafka", LevelFilter::INFO)
        // The members' spans.
        .with_target(module_path!(), LevelFilter::INFO);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_test_writer(),
        )
        .with(levels)
}

thread_local! {
    /// Whether this test's thread keeps its warnings ([`Warnings::capture`]).
    static CAPTURING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Waits until `done()` holds, checking every 100 ms; panics with `what()` after `limit`.
pub async fn wait_until(
    limit: Duration,
    mut done: impl FnMut() -> bool,
    what: impl Fn() -> String,
) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?}: {}",
            what()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The longest a [`wait_while_progressing`] waits in all.
const PROGRESSING_AT_MOST: Duration = Duration::from_secs(600);

/// Waits until `done()` holds, checking every 100 ms, for as long as the consumers make
/// headway: panics with `what()` when `progress()` (a count that grows while they work,
/// such as their deliveries) has not moved for `stall`, or after ten minutes in all. On a
/// slow or busy machine the same work takes longer; what the tests look for is a consumer
/// group that stopped, not one that is slow.
pub async fn wait_while_progressing(
    stall: Duration,
    mut done: impl FnMut() -> bool,
    mut progress: impl FnMut() -> u64,
    what: impl Fn() -> String,
) {
    let started = Instant::now();
    let mut last = progress();
    let mut moved_at = Instant::now();
    while !done() {
        let now = progress();
        if now != last {
            last = now;
            moved_at = Instant::now();
        }
        assert!(
            moved_at.elapsed() < stall,
            "no progress for {stall:?} (after {:.0?} in all, {last} delivered): {}",
            started.elapsed(),
            what()
        );
        assert!(
            started.elapsed() < PROGRESSING_AT_MOST,
            "still not done after {PROGRESSING_AT_MOST:?}, though progressing ({last} delivered): {}",
            what()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deliveries of several consumers added up: the progress of [`wait_while_progressing`].
pub fn delivered(members: &[&Arc<Stats>]) -> u64 {
    total(members).deliveries
}

/// The counters of several consumers added up.
pub fn total(members: &[&Arc<Stats>]) -> Snapshot {
    members
        .iter()
        .fold(Snapshot::default(), |sum, stats| sum.plus(stats.snapshot()))
}

/// [`wait_while_progressing`] for waits whose condition is checked asynchronously (SQL):
/// fed the progress count at each round, it panics when the count has not moved for
/// `stall`, or after ten minutes in all.
pub struct Stillness {
    stall: Duration,
    started: Instant,
    last: u64,
    moved_at: Instant,
}

impl Stillness {
    /// Starts watching `progress` (a count that grows while the consumers work).
    pub fn new(stall: Duration, progress: u64) -> Self {
        let now = Instant::now();
        Stillness {
            stall,
            started: now,
            last: progress,
            moved_at: now,
        }
    }

    /// One round: panics with `what()` when nothing moved for the stall bound.
    pub fn check(&mut self, progress: u64, what: impl FnOnce() -> String) {
        if progress != self.last {
            self.last = progress;
            self.moved_at = Instant::now();
        }
        let stall = self.stall;
        if self.moved_at.elapsed() >= stall {
            panic!(
                "no progress for {stall:?} (after {:.0?} in all, at {}): {}",
                self.started.elapsed(),
                self.last,
                what()
            );
        }
        if self.started.elapsed() >= PROGRESSING_AT_MOST {
            panic!(
                "still not done after {PROGRESSING_AT_MOST:?}, though progressing (at {}): {}",
                self.last,
                what()
            );
        }
    }
}

/// How a [`Supervisor`] starts a member, by name.
type StartMember = dyn Fn(&Harness, &str) -> Member;

/// Members run as a supervisor runs them: one whose `run` returns
/// `ConsumerError::Stalled` is started again, with the same name and settings, and the
/// restart is counted; any other end of a member fails the test.
pub struct Supervisor {
    start: Box<StartMember>,
    pub members: Vec<Member>,
    /// The members started again: name, and why the member had stopped.
    pub restarts: Vec<(String, String)>,
}

impl Supervisor {
    /// Starts the members `names` with `start`.
    pub fn start(
        harness: &Harness,
        names: &[&str],
        start: impl Fn(&Harness, &str) -> Member + 'static,
    ) -> Supervisor {
        Supervisor {
            members: names.iter().map(|name| start(harness, name)).collect(),
            start: Box::new(start),
            restarts: Vec::new(),
        }
    }

    /// Starts again each member that stopped with `ConsumerError::Stalled`; panics when a
    /// member ended otherwise.
    pub async fn check(&mut self, harness: &Harness) {
        for member in &mut self.members {
            if !member.task.is_finished() {
                continue;
            }
            let ended = (&mut member.task).await.expect("the member's task");
            match ended {
                Err(ConsumerError::Stalled(why)) => {
                    eprintln!(
                        "{} stopped with Stalled ({why}); starting it again",
                        member.name
                    );
                    self.restarts.push((member.name.clone(), why));
                    *member = (self.start)(harness, &member.name);
                }
                other => panic!("{} stopped: {other:?}", member.name),
            }
        }
    }

    /// Starts one more member, `name`, supervised as the others.
    pub fn add(&mut self, harness: &Harness, name: &str) {
        let member = (self.start)(harness, name);
        self.members.push(member);
    }

    /// The members now, to stop them.
    pub fn into_members(self) -> Vec<Member> {
        self.members
    }
}

/// The warnings and errors logged on the test's thread, where the consumers' tasks run
/// (`#[sqlx::test]` runs the test on a current-thread runtime), kept as lines.
#[derive(Default)]
pub struct Warnings(std::sync::Mutex<Vec<String>>);

/// What a member logs when it leaves its group to join it again.
pub const REJOIN_LOGGED: &str = "leaving the group and joining it again";

impl Warnings {
    /// Keeps the warnings logged on this thread until the guard is dropped (and logs to
    /// the test's output, as a [`Harness`] does). Before the harness.
    pub fn capture() -> (Arc<Warnings>, tracing::subscriber::DefaultGuard) {
        use tracing_subscriber::layer::SubscriberExt;
        let warnings = Arc::new(Warnings::default());
        let subscriber = test_log().with(Keep(warnings.clone()));
        CAPTURING.set(true);
        let guard = tracing::subscriber::set_default(subscriber);
        (warnings, guard)
    }

    /// How many of the lines contain `text`.
    pub fn count(&self, text: &str) -> usize {
        self.lines()
            .iter()
            .filter(|line| line.contains(text))
            .count()
    }

    /// The members' rejoins (leaving the group and joining it again).
    pub fn rejoins(&self) -> usize {
        self.count(REJOIN_LOGGED)
    }

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last `n` lines, one a line, for a failure's message.
    pub fn last(&self, n: usize) -> String {
        let lines = self.lines();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

struct Keep(Arc<Warnings>);

struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Keep {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() > tracing::Level::WARN {
            return;
        }
        let mut line = Line(format!("{} ", event.metadata().level()));
        event.record(&mut line);
        self.0
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line.0);
    }
}

/// Every fact of `events` applied exactly once (effects and order totals, by SQL), every
/// key `success` (nothing parked or failed) and no dead letter of `group`.
pub async fn assert_every_fact_once(pool: &PgPool, group: &str, events: &[OrderEvent]) {
    let verification = verify::verify(pool, events).await.unwrap();
    assert!(verification.exactly_once(), "{verification}");
    let unfinished: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM idem.idem_keys WHERE status <> 'success') \
                  + (SELECT count(*) FROM idem.idem_timed_keys WHERE status <> 'success')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(unfinished, 0, "every key succeeded, nothing parked");
    let dead = verify::dead_letters(pool, group).await.unwrap();
    assert!(dead.is_empty(), "no dead letters: {dead:?}");
}
