//! A member that dies without leaving its group (SIGKILL) keeps its partitions on tansu
//! 0.6, which never ends its session. The survivor sees them stand still with records
//! behind them, held by no member here (`Stats::headway`), leaves the group and joins it
//! again, and the group's next rebalance gives them to it: every fact is applied exactly
//! once, with offsets in Kafka and in PostgreSQL.
//!
//! The member that dies is a process of its own, killed with SIGKILL: nothing of it sends
//! a LeaveGroup (in the test's process, dropping a consumer closes it, and librdkafka sends
//! a LeaveGroup for a dynamic member). The process is this test binary run again with
//! `member_process` as its only test and the member's settings in its environment; it runs
//! the same handler as the survivor, on the same database, and prints what it holds and
//! how much it received. The example `order_consumer` would not do: it writes to a table
//! of its own (`idem_demo::kafka::verify` could not check its effects with the survivor's)
//! and has no flag for the session timeout.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_demo::kafka::handlers::OrderEvents;
use idem_demo::kafka::producer::{Plan, PlanConfig};
use idem_demo::kafka::verify;
use idem_kafka::{Consumer, OffsetStore, PartitionHeadway, Stats};
use idem_runtime::Idem;
use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions, PgPool};

use crate::support::{
    Harness, Stillness, Supervisor, Warnings, wait_until, wait_while_progressing,
};

const PARTITIONS: i32 = 6;
/// Facts in each half (with 20% duplicates on top).
const EVENTS: usize = 600;
const SESSION: Duration = Duration::from_secs(6);
const STALL_BOUND: Duration = Duration::from_secs(12);
/// A wait fails when the members have not moved for this long.
const NO_PROGRESS: Duration = Duration::from_secs(90);
/// How long after the kill the survivor must report the dead member's partitions stalled:
/// the stall bound, a look, and room for a busy machine.
const REPORTED_WITHIN: Duration = Duration::from_secs(60);

/// The environment variable that makes [`member_process`] a member.
const MEMBER_PROCESS: &str = "IDEM_TEST_MEMBER_PROCESS";
/// The member process's report lines start with this.
const REPORT: &str = "member-process:";

#[sqlx::test(migrations = false)]
async fn a_member_killed_without_leaving_has_its_partitions_taken_over(pool: PgPool) {
    dead_member(pool, OffsetStore::Kafka).await;
}

#[sqlx::test(migrations = false)]
async fn the_same_with_offsets_in_postgres(pool: PgPool) {
    dead_member(pool, OffsetStore::Postgres).await;
}

async fn dead_member(pool: PgPool, offsets: OffsetStore) {
    let (warnings, _capturing) = Warnings::capture();
    let harness = Harness::new(&pool, &format!("dead-member-{offsets}"), PARTITIONS).await;
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
    let (first, later) = (plan("a", 31), plan("b", 32));

    let url = pool.connect_options().to_url_lossy().to_string();
    let doomed = MemberProcess::start(&harness, offsets, &url);
    let stats = Arc::new(Stats::default());
    let mut supervisor = Supervisor::start(&harness, &["survivor"], {
        let stats = stats.clone();
        move |harness, name| {
            let stats = stats.clone();
            harness.member(name, OrderEvents, move |builder| {
                builder
                    .offsets(offsets)
                    .session_timeout(SESSION)
                    .stall_bound(STALL_BOUND)
                    .stats(stats)
            })
        }
    });
    let held_here = || -> Vec<i32> {
        stats
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
            doomed.assert_running("while the group forms");
            let (there, here) = (doomed.report().held, held_here());
            !there.is_empty() && !here.is_empty() && there.len() + here.len() == PARTITIONS as usize
        },
        || 0,
        || {
            format!(
                "both members hold partitions: the process {:?}, the survivor {:?}",
                doomed.report().held,
                held_here()
            )
        },
    )
    .await;
    let before = harness.produce(&first).await.unwrap();
    // Killed while it consumes.
    wait_while_progressing(
        NO_PROGRESS,
        || {
            doomed.assert_running("before the kill");
            doomed.report().delivered >= 50
        },
        || doomed.report().delivered,
        || format!("the process consumes: {:?}", doomed.report()),
    )
    .await;
    let last = doomed.kill();
    let killed = Instant::now();
    assert!(
        !last.held.is_empty(),
        "the process held partitions: {last:?}"
    );
    let after = harness.produce(&later).await.unwrap();

    // The survivor sees the dead member's partitions stand still, held by no member here:
    // those whose position stopped first (the others may be handed out by the rejoin that
    // look sets off before they count as stalled), and no other partition.
    let stalled =
        || -> Vec<PartitionHeadway> { stats.headway().into_iter().filter(|p| p.stalled).collect() };
    wait_until(
        REPORTED_WITHIN,
        || !stalled().is_empty(),
        || {
            format!(
                "the survivor reports partitions of {:?} stalled: {:?}; warnings:\n{}",
                last.held,
                stats.headway(),
                warnings.last(20)
            )
        },
    )
    .await;
    let seen = stalled();
    assert!(
        seen.iter()
            .all(|p| last.held.contains(&p.partition) && !p.held && p.lag > 0),
        "the partitions reported stalled are the dead member's {:?}, with lag, not held by the survivor: {seen:?}",
        last.held
    );
    let reported = killed.elapsed();

    // Then it rejoins, is given them, and every fact is applied exactly once.
    let events: Vec<_> = first.events.iter().chain(&later.events).cloned().collect();
    // Deliveries only: a member started again and again without consuming is no progress.
    let progress = || stats.snapshot().deliveries;
    let mut still = Stillness::new(NO_PROGRESS, progress());
    let recovered = loop {
        supervisor.check(&harness).await;
        let verification = verify::verify(&pool, &events).await.unwrap();
        if verification.exactly_once() && stats.caught_up(&harness.topic, &after.end_offsets) {
            break killed.elapsed();
        }
        still.check(progress(), || {
            format!(
                "every fact applied exactly once after the kill: {verification}; restarts {:?}; headway {:?}; warnings:\n{}",
                supervisor.restarts,
                stats.headway(),
                warnings.last(30)
            )
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let rejoins = warnings.rejoins();
    assert!(
        rejoins >= 1,
        "the survivor left the group and joined it again: {}",
        warnings.last(20)
    );
    let restarts = supervisor.restarts.clone();
    harness.stop(supervisor.into_members()).await;

    crate::support::assert_every_fact_once(&pool, &harness.group, &events).await;
    eprintln!(
        "dead member [offsets {offsets}]: killed holding {:?} after {} deliveries; {:?} reported stalled and not held {reported:.1?} after the kill, \
         every fact applied exactly once {recovered:.1?} after it; rejoins {rejoins}, restarts {} {restarts:?}; \
         the survivor {} deliveries for {} records",
        last.held,
        last.delivered,
        seen.iter().map(|p| p.partition).collect::<Vec<_>>(),
        restarts.len(),
        stats.snapshot().deliveries,
        before.records + after.records,
    );
    harness.finish().await;
}

/// What the member process last printed.
#[derive(Debug, Clone, Default)]
struct Report {
    held: Vec<i32>,
    delivered: u64,
}

/// The member that dies: this test binary run again as [`member_process`].
struct MemberProcess {
    child: Mutex<Child>,
    /// Kept open: the process ends by itself when it closes (this test's process died).
    _stdin: ChildStdin,
    report: Arc<Mutex<Report>>,
    output: Arc<Mutex<String>>,
}

impl MemberProcess {
    fn start(harness: &Harness, offsets: OffsetStore, database_url: &str) -> MemberProcess {
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = Command::new(exe)
            .args([
                "dead_member::member_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(MEMBER_PROCESS, "1")
            .env("IDEM_TEST_MEMBER_BROKERS", &harness.brokers)
            .env("IDEM_TEST_MEMBER_GROUP", &harness.group)
            .env("IDEM_TEST_MEMBER_TOPIC", &harness.topic)
            .env("IDEM_TEST_MEMBER_OFFSETS", offsets.to_string())
            .env("IDEM_TEST_MEMBER_DATABASE_URL", database_url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the member process");
        let report = Arc::new(Mutex::new(Report::default()));
        let output = Arc::new(Mutex::new(String::new()));
        let stdout: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [stdout, stderr] {
            let (report, output) = (report.clone(), output.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    match line.strip_prefix(REPORT).and_then(parse_report) {
                        Some(parsed) => *report.lock().unwrap() = parsed,
                        None => {
                            let mut output = output.lock().unwrap();
                            output.push_str(&line);
                            output.push('\n');
                        }
                    }
                }
            });
        }
        MemberProcess {
            _stdin: child.stdin.take().unwrap(),
            child: Mutex::new(child),
            report,
            output,
        }
    }

    fn report(&self) -> Report {
        self.report.lock().unwrap().clone()
    }

    /// Panics with the process's output when it has exited.
    fn assert_running(&self, when: &str) {
        if let Some(status) = self.child.lock().unwrap().try_wait().unwrap() {
            // The reader threads may still hold the last lines.
            std::thread::sleep(Duration::from_millis(200));
            panic!(
                "the member process exited ({status}) {when}:\n{}",
                self.output.lock().unwrap()
            );
        }
    }

    /// SIGKILL; returns what it last reported.
    fn kill(&self) -> Report {
        self.assert_running("before the kill");
        let last = self.report();
        let mut child = self.child.lock().unwrap();
        child.kill().expect("SIGKILL");
        child.wait().expect("the process ends");
        last
    }
}

impl Drop for MemberProcess {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if matches!(child.try_wait(), Ok(None)) {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

/// ` held=0,1,2 delivered=42`
fn parse_report(text: &str) -> Option<Report> {
    let mut report = Report::default();
    for part in text.split_whitespace() {
        match part.split_once('=')? {
            ("held", list) => {
                report.held = list
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| p.parse().ok())
                    .collect::<Option<_>>()?;
            }
            ("delivered", count) => report.delivered = count.parse().ok()?,
            _ => return None,
        }
    }
    Some(report)
}

/// Not a test of its own: the member process of the tests above, which start it with
/// [`MEMBER_PROCESS`] set and kill it. Without it, returns at once.
#[test]
fn member_process() {
    if std::env::var_os(MEMBER_PROCESS).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let offsets: OffsetStore = var("IDEM_TEST_MEMBER_OFFSETS").parse().unwrap();
    let group = var("IDEM_TEST_MEMBER_GROUP");
    // The test's process died: its end of stdin closes.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(2))
                .connect(&var("IDEM_TEST_MEMBER_DATABASE_URL"))
                .await
                .unwrap();
            let consumer = Consumer::builder(
                var("IDEM_TEST_MEMBER_BROKERS"),
                &group,
                var("IDEM_TEST_MEMBER_TOPIC"),
            )
            .client_id(format!("{group}-process"))
            .offsets(offsets)
            .session_timeout(SESSION)
            .stall_bound(STALL_BOUND)
            .build(Idem::new(pool), OrderEvents)
            .unwrap();
            let stats = consumer.stats();
            tokio::spawn(async move {
                loop {
                    let held: Vec<String> = stats
                        .headway()
                        .iter()
                        .filter(|p| p.held)
                        .map(|p| p.partition.to_string())
                        .collect();
                    println!(
                        "{REPORT} held={} delivered={}",
                        held.join(","),
                        stats.snapshot().deliveries
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
            consumer.run(std::future::pending()).await.unwrap();
        });
}
