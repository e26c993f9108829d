//! Two `order_consumer` processes started at the same moment, as two replicas of one
//! deployment are, both come up, five times over, each time on a fresh database.
//!
//! The example creates its business table under a transaction-scoped advisory lock
//! (`CREATE TABLE IF NOT EXISTS` alone lets the second of two concurrent creators fail on
//! `pg_type_typname_nsp_index` or with "type ... already exists"). The test makes the race
//! certain rather than likely: it holds that lock itself while the two processes start,
//! waits until both wait on it (pg_locks), and only then lets them go, together.
//!
//! The example's binary is the one `cargo test --workspace` builds next to this test
//! (`target/debug/examples/order_consumer`); when it is missing or older than its source,
//! the test builds it first.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

use crate::support::Harness;

/// The advisory lock the examples take around their `CREATE TABLE IF NOT EXISTS`.
const TABLES_LOCK: &str = "hashtext('idem examples: business tables')";

/// How long a process may take to reach the lock, and then to come up.
const LIMIT: Duration = Duration::from_secs(90);

#[sqlx::test(migrations = false)]
async fn two_order_consumers_started_together_both_come_up(pool: PgPool) {
    let example = order_consumer_binary();
    let harness = Harness::new(&pool, "together", 1).await;
    for round in 0..5 {
        let database = format!("idem_together_{}_{round}", harness.id);
        sqlx::raw_sql(&format!("CREATE DATABASE {database}"))
            .execute(&pool)
            .await
            .unwrap();
        let options = pool.connect_options().as_ref().clone().database(&database);
        let url = options.to_url_lossy().to_string();

        // The barrier: the test holds the examples' lock until both processes wait on it.
        let mut gate = PgConnection::connect_with(&options).await.unwrap();
        sqlx::raw_sql(&format!("SELECT pg_advisory_lock({TABLES_LOCK})"))
            .execute(&mut gate)
            .await
            .unwrap();
        let group = format!("{}-{round}", harness.group);
        let mut replicas: Vec<Replica> = (0..2)
            .map(|_| Replica::start(&example, &url, &harness.brokers, &harness.topic, &group))
            .collect();

        let started = Instant::now();
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()",
            )
            .fetch_one(&mut gate)
            .await
            .unwrap();
            if waiting == 2 {
                break;
            }
            for replica in &mut replicas {
                replica.assert_running(round, "before reaching the table's lock");
            }
            assert!(
                started.elapsed() < LIMIT,
                "round {round}: {waiting} of 2 processes wait on the tables' lock after {LIMIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        sqlx::raw_sql(&format!("SELECT pg_advisory_unlock({TABLES_LOCK})"))
            .execute(&mut gate)
            .await
            .unwrap();
        gate.close().await.unwrap();

        let started = Instant::now();
        while !replicas
            .iter()
            .all(|replica| replica.logged("consumer started"))
        {
            for replica in &mut replicas {
                replica.assert_running(round, "while starting");
            }
            assert!(
                started.elapsed() < LIMIT,
                "round {round}: not both processes came up within {LIMIT:?}:\n{}",
                replicas
                    .iter()
                    .map(Replica::output)
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for replica in replicas {
            replica.stop();
        }
        sqlx::raw_sql(&format!("DROP DATABASE {database} WITH (FORCE)"))
            .execute(&pool)
            .await
            .unwrap();
    }
    harness.finish().await;
}

/// One `order_consumer` process and what it printed.
struct Replica {
    child: Child,
    output: Arc<Mutex<String>>,
}

impl Replica {
    fn start(example: &Path, url: &str, brokers: &str, topic: &str, group: &str) -> Replica {
        let mut child = Command::new(example)
            .args(["--brokers", brokers, "--topic", topic, "--group", group])
            .env("DATABASE_URL", url)
            .env("RUST_LOG", "info,sqlx=warn,librdkafka=warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("start {}: {error}", example.display()));
        let output = Arc::new(Mutex::new(String::new()));
        let stdout: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [stdout, stderr] {
            let output = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut output = output.lock().unwrap();
                    output.push_str(&line);
                    output.push('\n');
                }
            });
        }
        Replica { child, output }
    }

    fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    fn logged(&self, text: &str) -> bool {
        self.output.lock().unwrap().contains(text)
    }

    /// Panics with the process's output when it has exited.
    fn assert_running(&mut self, round: usize, when: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            // The reader threads may still hold the last lines.
            std::thread::sleep(Duration::from_millis(200));
            panic!(
                "round {round}: an order_consumer exited ({status}) {when}:\n{}",
                self.output()
            );
        }
    }

    /// Asks the process to leave its group (SIGTERM), and kills it if it has not after 10 s.
    fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let asked = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if asked.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `target/<profile>/examples/order_consumer`, next to this test's binary; built first when
/// it is missing or older than `examples/order_consumer.rs`.
fn order_consumer_binary() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let profile_dir = std::env::current_exe()
        .expect("the test's path")
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf();
    let binary = profile_dir.join("examples").join("order_consumer");
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let source = modified(&root.join("examples/order_consumer.rs"));
    if modified(&binary).is_none() || modified(&binary) < source {
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "idem-examples",
                "--example",
                "order_consumer",
            ])
            .arg("--manifest-path")
            .arg(root.join("Cargo.toml"))
            .status()
            .expect("run cargo build");
        assert!(
            status.success(),
            "cargo build --example order_consumer failed"
        );
    }
    assert!(binary.exists(), "no example binary at {}", binary.display());
    binary
}
