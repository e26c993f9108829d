//! What the scenarios share: a database of their own, the scenario applications as
//! processes (run to their end, or started and told when to go and when to stop), their
//! summaries, and the effect rows counted per fact.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::builds::{self, Release};

/// The longest a scenario application may take to start, or to finish what it was told.
const PROCESS_TIMEOUT: Duration = Duration::from_secs(300);

/// A scenario application: one variant, built with one release.
#[derive(Debug, Clone)]
pub struct App {
    release: Release,
    variant: &'static str,
    binary: PathBuf,
}

/// The variant built with the current release (every variant of the current release
/// builds on the first call).
pub fn current(variant: &'static str) -> App {
    App::new(Release::Current, variant)
}

/// The variant built with the previous release (`tests/compat/previous-release`).
pub fn previous(variant: &'static str) -> App {
    App::new(Release::Previous, variant)
}

impl App {
    fn new(release: Release, variant: &'static str) -> App {
        App {
            release,
            variant,
            binary: builds::binary(release, variant),
        }
    }

    /// `<release>/<variant>`: its label in effect rows and in failures.
    pub fn name(&self) -> String {
        let release = match self.release {
            Release::Current => "current",
            Release::Previous => "previous",
        };
        format!("{release}/{}", self.variant)
    }

    /// Runs `migrate`; panics unless it succeeds.
    pub fn migrate(&self, database: &Database) {
        let output = self
            .command(database, &self.name())
            .arg("migrate")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| panic!("run {}: {error}", self.name()));
        assert!(
            output.status.success(),
            "{} migrate: {}\n{}",
            self.name(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Runs `deliver` to its end; returns its summary.
    pub fn deliver(&self, database: &Database, deliver: &Deliver) -> Summary {
        let running = self.start(database, deliver);
        running.finish()
    }

    /// Starts `deliver`: with [`Deliver::wait`], it waits for [`Running::go`]; with
    /// [`Deliver::repeat`], it delivers until [`Running::stop`].
    pub fn start(&self, database: &Database, deliver: &Deliver) -> Running {
        let label = match &deliver.label {
            Some(label) => format!("{}#{label}", self.name()),
            None => self.name(),
        };
        let mut command = self.command(database, &label);
        command.args([
            "deliver",
            "--from",
            &deliver.facts.start.to_string(),
            "--to",
            &deliver.facts.end.to_string(),
            "--workers",
            &deliver.workers.to_string(),
        ]);
        if let Some(seed) = deliver.shuffle {
            command.args(["--shuffle", &seed.to_string()]);
        }
        for (flag, set) in [
            ("--migrate", deliver.migrate),
            ("--wait", deliver.wait),
            ("--repeat", deliver.repeat),
        ] {
            if set {
                command.arg(flag);
            }
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("start {label}: {error}"));
        let (sender, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        let out = sender.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if out.send(Line::Out(line)).is_err() {
                    return;
                }
            }
            let _ = out.send(Line::End);
        });
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if sender.send(Line::Err(line)).is_err() {
                    return;
                }
            }
        });
        Running {
            label,
            stdin: child.stdin.take(),
            child,
            lines,
            stderr: String::new(),
        }
    }

    fn command(&self, database: &Database, label: &str) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .args(["--database-url", &database.url, "--label", label])
            .env("RUST_BACKTRACE", "1");
        command
    }
}

/// What a `deliver` is told.
#[derive(Debug, Clone)]
pub struct Deliver {
    facts: Range<i64>,
    workers: usize,
    shuffle: Option<u64>,
    migrate: bool,
    wait: bool,
    repeat: bool,
    label: Option<String>,
}

impl Deliver {
    /// Facts `facts`, in order, by 4 concurrent tasks.
    pub fn facts(facts: Range<i64>) -> Deliver {
        Deliver {
            facts,
            workers: 4,
            shuffle: None,
            migrate: false,
            wait: false,
            repeat: false,
            label: None,
        }
    }

    /// In the order `seed` shuffles them.
    pub fn shuffled(mut self, seed: u64) -> Deliver {
        self.shuffle = Some(seed);
        self
    }

    /// Migrates first, as a service does when it starts.
    pub fn migrating(mut self) -> Deliver {
        self.migrate = true;
        self
    }

    /// Waits for [`Running::go`] once connected (and migrated).
    pub fn waiting(mut self) -> Deliver {
        self.wait = true;
        self
    }

    /// Delivers the facts again and again until [`Running::stop`].
    pub fn repeating(mut self) -> Deliver {
        self.repeat = true;
        self
    }

    /// A label of the process, added to the application's in its effect rows.
    pub fn labelled(mut self, label: impl Into<String>) -> Deliver {
        self.label = Some(label.into());
        self
    }
}

enum Line {
    Out(String),
    Err(String),
    End,
}

/// A `deliver` process. Killed when dropped before it ended.
pub struct Running {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Line>,
    stderr: String,
}

impl Running {
    /// Waits until the process says it is ready (connected and migrated: [`Deliver::wait`]).
    pub fn ready(&mut self) {
        let line = self.next_line("its ready line");
        assert_eq!(
            line, r#"{"ready":true}"#,
            "{}: not its ready line; stderr:\n{}",
            self.label, self.stderr
        );
    }

    /// Lets a [`Deliver::wait`] process deliver.
    pub fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin is open until stop");
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|error| panic!("{}: tell it to go: {error}", self.label));
    }

    /// Tells a [`Deliver::repeat`] process to end after its current pass.
    pub fn stop(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process's end (stopping it first); returns its summary. Panics if it
    /// failed, or did not end within the timeout.
    pub fn finish(mut self) -> Summary {
        self.stop();
        let mut summary = None;
        loop {
            let line = self.next_line("its summary");
            if line.is_empty() {
                break;
            }
            if line.starts_with(r#"{"summary":"#) {
                let parsed: Summary = serde_json::from_str(&line)
                    .unwrap_or_else(|error| panic!("{}: summary {line}: {error}", self.label));
                summary = Some(parsed);
            }
        }
        let status = self.child.wait().expect("wait for the process");
        // The rest of stderr, which ends with the process.
        while let Ok(Line::Err(line)) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.stderr.push_str(&line);
            self.stderr.push('\n');
        }
        assert!(
            status.success(),
            "{}: {status}; stderr:\n{}",
            self.label,
            self.stderr
        );
        let mut summary = summary
            .unwrap_or_else(|| panic!("{}: no summary; stderr:\n{}", self.label, self.stderr));
        summary.label = self.label.clone();
        summary
    }

    /// The next line on stdout, or "" at its end; stderr's lines are kept for failures.
    fn next_line(&mut self, what: &str) -> String {
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(Line::Out(line)) => return line,
                Ok(Line::Err(line)) => {
                    self.stderr.push_str(&line);
                    self.stderr.push('\n');
                }
                Ok(Line::End) => return String::new(),
                Err(_) => panic!(
                    "{}: waited {PROCESS_TIMEOUT:?} for {what}; stderr:\n{}",
                    self.label, self.stderr
                ),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The summary a `deliver` prints last: per handler, how its deliveries ended.
#[derive(Debug, Deserialize)]
pub struct Summary {
    summary: BTreeMap<String, Counts>,
    #[serde(skip)]
    label: String,
}

impl Summary {
    /// How the deliveries to `handler` ended.
    pub fn handler(&self, handler: &str) -> &Counts {
        self.summary
            .get(handler)
            .unwrap_or_else(|| panic!("{}: no handler {handler} in {self:?}", self.label))
    }

    /// Panics unless every handler's deliveries ended in `Executed` or `Duplicate`
    /// (errors whose disposition is `Retry` redelivered until they did).
    pub fn assert_no_failed_delivery(&self) {
        for (handler, counts) in &self.summary {
            assert!(
                counts.failed() == 0 && counts.halt == 0,
                "{}: deliveries to {handler} failed: {counts:#?}",
                self.label
            );
        }
    }
}

/// How one handler's deliveries ended, with the first error text of each kind (shown in
/// failures, through `Debug`).
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
pub struct Counts {
    pub executed: u64,
    pub duplicate: u64,
    pub halt: u64,
    pub dead_letter: u64,
    pub retry_exhausted: u64,
    pub other: u64,
    pub first_halt: Option<String>,
    pub first_dead_letter: Option<String>,
    pub first_retry_exhausted: Option<String>,
    pub first_other: Option<String>,
}

/// The counts that matter to a scenario: executed, duplicates, refused with `Halt`, and
/// failed otherwise (dead-lettered, retried in vain, another disposition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub executed: u64,
    pub duplicate: u64,
    pub halt: u64,
    pub failed: u64,
}

impl Tally {
    /// `n` deliveries, each executed.
    pub fn executed(n: u64) -> Tally {
        Tally {
            executed: n,
            duplicate: 0,
            halt: 0,
            failed: 0,
        }
    }

    /// `n` deliveries, each a duplicate.
    pub fn duplicates(n: u64) -> Tally {
        Tally {
            duplicate: n,
            ..Tally::executed(0)
        }
    }

    /// `n` deliveries, each refused with `Disposition::Halt`.
    pub fn halted(n: u64) -> Tally {
        Tally {
            halt: n,
            ..Tally::executed(0)
        }
    }
}

impl Counts {
    /// Deliveries that failed otherwise than by `Halt`.
    pub fn failed(&self) -> u64 {
        self.dead_letter + self.retry_exhausted + self.other
    }

    /// The counts that matter to a scenario.
    pub fn tally(&self) -> Tally {
        Tally {
            executed: self.executed,
            duplicate: self.duplicate,
            halt: self.halt,
            failed: self.failed(),
        }
    }

    /// The first `Halt` error's text; panics if there was none.
    pub fn halt_text(&self) -> &str {
        self.first_halt
            .as_deref()
            .unwrap_or_else(|| panic!("no delivery was refused with Halt: {self:#?}"))
    }
}

/// Panics unless `summary`'s deliveries to `handler` ended as `expected`, with the
/// summary's texts in the message.
#[track_caller]
pub fn assert_tally(summary: &Summary, handler: &str, expected: Tally) {
    let counts = summary.handler(handler);
    assert_eq!(
        counts.tally(),
        expected,
        "{}: deliveries to {handler}: {counts:#?}",
        summary.label
    );
}

/// A database of the scenario's own on `DATABASE_URL`'s server, with the business table
/// `scenario_effects`; dropped with the value.
pub struct Database {
    /// Its URL, which the applications connect to.
    pub url: String,
    name: String,
    server: String,
    runtime: tokio::runtime::Runtime,
    pool: sqlx::PgPool,
}

impl Database {
    /// Creates `idem_compat_<scenario>_<pid>_<n>` and its `scenario_effects` table.
    pub fn create(scenario: &str) -> Database {
        static CREATED: AtomicUsize = AtomicUsize::new(0);
        let server = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let name = format!(
            "idem_compat_{scenario}_{}_{}",
            std::process::id(),
            CREATED.fetch_add(1, Ordering::Relaxed)
        );
        let url = with_database(&server, &name);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let pool = runtime.block_on(async {
            let create = format!("CREATE DATABASE \"{name}\"");
            admin(&server, &create)
                .await
                .unwrap_or_else(|error| panic!("{create} on DATABASE_URL ({server}): {error}"));
            let pool = sqlx::PgPool::connect(&url)
                .await
                .unwrap_or_else(|error| panic!("connect to {name}: {error}"));
            sqlx::query(
                "CREATE TABLE scenario_effects (
                    id bigserial PRIMARY KEY,
                    handler text NOT NULL,
                    fact bigint NOT NULL,
                    build text NOT NULL,
                    at timestamptz NOT NULL DEFAULT clock_timestamp()
                )",
            )
            .execute(&pool)
            .await
            .expect("create scenario_effects");
            pool
        });
        Database {
            url,
            name,
            server,
            runtime,
            pool,
        }
    }

    /// The effect rows of `handler`: per fact, the builds that wrote them.
    pub fn effects(&self, handler: &str) -> BTreeMap<i64, Vec<String>> {
        let rows: Vec<(i64, String)> = self
            .runtime
            .block_on(
                sqlx::query_as(
                    "SELECT fact, build FROM scenario_effects WHERE handler = $1 ORDER BY fact, id",
                )
                .bind(handler)
                .fetch_all(&self.pool),
            )
            .expect("read scenario_effects");
        let mut effects: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for (fact, build) in rows {
            effects.entry(fact).or_default().push(build);
        }
        effects
    }

    /// Panics unless `handler` has exactly one effect row for each of `facts`, and none
    /// for another fact: names the facts applied twice (and by which builds) or never.
    #[track_caller]
    pub fn assert_one_effect_per_fact(&self, handler: &str, facts: Range<i64>) {
        let effects = self.effects(handler);
        let twice: Vec<_> = effects
            .iter()
            .filter(|(_, builds)| builds.len() > 1)
            .take(10)
            .collect();
        let never: Vec<_> = facts
            .clone()
            .filter(|fact| !effects.contains_key(fact))
            .take(10)
            .collect();
        let outside: Vec<_> = effects
            .keys()
            .filter(|fact| !facts.contains(fact))
            .take(10)
            .collect();
        let twice_count = effects.values().filter(|builds| builds.len() > 1).count();
        assert!(
            twice.is_empty() && never.is_empty() && outside.is_empty(),
            "{handler}: {twice_count} facts applied more than once (the first: {twice:?}), \
             facts never applied: {never:?}, facts applied outside {facts:?}: {outside:?}"
        );
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        self.runtime.block_on(async {
            self.pool.close().await;
            let drop = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
            if let Err(error) = admin(&server, &drop).await {
                eprintln!("{drop}: {error}");
            }
        });
    }
}

/// Runs `statement` on the server's own database (of `DATABASE_URL`).
async fn admin(server: &str, statement: &str) -> Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut connection = sqlx::PgConnection::connect(server).await?;
    sqlx::query(statement).execute(&mut connection).await?;
    connection.close().await
}

/// `url` with its database replaced by `database` (its query kept).
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |index| index + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |index| authority_start + index);
    let mut with = format!("{}/{database}", &base[..path_start]);
    if let Some(query) = query {
        with.push('?');
        with.push_str(query);
    }
    with
}

#[test]
fn a_database_url_gets_another_database() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgres://u:p@h/db?sslmode=require", "x"),
        "postgres://u:p@h/x?sslmode=require"
    );
    assert_eq!(
        with_database("postgres://h:5433", "x"),
        "postgres://h:5433/x"
    );
}
