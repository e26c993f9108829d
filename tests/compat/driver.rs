//! The delivery loop every scenario application shares (crate `driver`), built against
//! whichever release of idem-runtime the application is: the current one or the previous
//! one. It uses only the public API both have (`Idem::builder`, `Idem::migrate`,
//! `Outcome`, `Error::disposition`); the handlers themselves live in the application's
//! crate `scenario`, since that crate's name and module paths are what idem records.
//!
//! ```text
//! scenario-<variant> [--database-url URL] [--label LABEL] migrate
//! scenario-<variant> [--database-url URL] [--label LABEL] deliver --from A --to B
//!     [--workers N] [--shuffle SEED] [--migrate] [--wait] [--repeat]
//! ```
//!
//! `deliver` hands facts `A..B` (in the order a seed shuffles them, with `--shuffle`) to
//! `N` concurrent tasks, each fact to every handler of the application in turn, and
//! redelivers a delivery whose error's disposition is `Retry` (at most [`MAX_DELIVERIES`]
//! times). `--migrate` migrates first. `--wait` prints `{"ready":true}` once connected (and
//! migrated), then waits for a line on stdin before delivering: the test starts several
//! processes at once that way. `--repeat` delivers the facts again and again until stdin
//! is closed (printing `{"pass":N}` after each pass), so that the process is delivering
//! for as long as the test needs. The last line on stdout is the summary:
//! `{"summary":{"<handler>":{"executed":..,"duplicate":..,"halt":..,...}},"passes":N}`.
//!
//! The business effect of a handler is a row of `scenario_effects`, which the test
//! creates: written through the handler's connection, it commits with the key's
//! `success`, so counting rows per fact counts the bodies that took effect.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idem_runtime::{Disposition, Idem, Outcome};
use sqlx::PgConnection;
use tokio::sync::watch;
use uuid::Uuid;

/// The most deliveries of one fact to one handler: the first and the redeliveries of
/// errors whose disposition is `Retry`.
pub const MAX_DELIVERIES: u32 = 10;

/// What a handler's wrapper returns for one fact.
pub type Delivering<'a> = Pin<Box<dyn Future<Output = Delivery> + Send + 'a>>;

/// A handler of the application, as the driver calls it.
pub struct Handler {
    /// The name counted in the summary and written to `scenario_effects.handler`.
    pub name: &'static str,
    /// Builds the fact's message and delivers it to the handler.
    pub deliver: for<'a> fn(&'a Idem, i64) -> Delivering<'a>,
}

/// How one delivery ended.
#[derive(Debug)]
pub enum Delivery {
    /// `Outcome::Executed`.
    Executed,
    /// `Outcome::Duplicate`.
    Duplicate,
    /// An error, with its disposition and its text (the error and its sources).
    Failed(Refusal, String),
}

/// The disposition of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `Disposition::Retry`.
    Retry,
    /// `Disposition::DeadLetter`.
    DeadLetter,
    /// `Disposition::Halt`.
    Halt,
    /// A disposition this driver does not know.
    Other,
}

impl Delivery {
    /// How a handler's call ended.
    pub fn of<T, E>(result: Result<Outcome<T>, idem_runtime::Error<E>>) -> Delivery
    where
        idem_runtime::Error<E>: std::error::Error,
    {
        match result {
            Ok(Outcome::Executed(_)) => Delivery::Executed,
            Ok(Outcome::Duplicate(_)) => Delivery::Duplicate,
            Err(error) => {
                let refusal = match error.disposition() {
                    Disposition::Retry => Refusal::Retry,
                    Disposition::DeadLetter => Refusal::DeadLetter,
                    Disposition::Halt => Refusal::Halt,
                    #[allow(unreachable_patterns)]
                    _ => Refusal::Other,
                };
                Delivery::Failed(refusal, error_text(&error))
            }
        }
    }
}

/// The error's text and its sources' (those its own text does not already include).
fn error_text(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The message of the deployed build, and of every variant that keeps it: the fact's
/// number and the fields its key is made of (`order_ref`, a UUID's text, and `order_no`).
pub struct OrderEvent {
    pub fact: i64,
    pub order_ref: String,
    pub order_no: i32,
}

impl OrderEvent {
    /// The message of fact `fact`.
    pub fn of(fact: i64) -> OrderEvent {
        OrderEvent {
            fact,
            order_ref: order_ref(fact).to_string(),
            order_no: order_no(fact),
        }
    }
}

/// The `order_ref` of a fact: a UUID of its own (its text where the message holds a
/// `String`).
pub fn order_ref(fact: i64) -> Uuid {
    Uuid::from_u64_pair(0x0de7_0000_0000_0000, fact as u64)
}

/// The `order_no` of a fact.
pub fn order_no(fact: i64) -> i32 {
    i32::try_from(fact).expect("a fact number fits an i32")
}

/// The `event_id` of a fact: derived from the fact alone, so that a key over it and a key
/// over `order_ref, order_no` are one key per fact each.
pub fn event_id(fact: i64) -> Uuid {
    Uuid::from_u64_pair(0xe7e4_0000_0000_0000, fact as u64)
}

/// The business effect: one row of `scenario_effects`, through the handler's connection.
pub async fn record_effect(
    tx: &mut PgConnection,
    handler: &str,
    fact: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO scenario_effects (handler, fact, build) VALUES ($1, $2, $3)")
        .bind(handler)
        .bind(fact)
        .bind(label())
        .execute(tx)
        .await?;
    Ok(())
}

static LABEL: OnceLock<String> = OnceLock::new();

/// The process's `--label` (its program name without one): recorded with its effects.
fn label() -> &'static str {
    LABEL.get().map(String::as_str).unwrap_or("")
}

/// The application's entry point: parses the command line and runs it; exits with 2
/// on a usage or set-up error (on stderr).
pub fn main(handlers: &'static [Handler]) {
    let command = match Command::parse(std::env::args().collect()) {
        Ok(command) => command,
        Err(message) => fail(&message),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|error| fail(&format!("tokio runtime: {error}")));
    if let Err(message) = runtime.block_on(command.run(handlers)) {
        fail(&message);
    }
}

fn fail(message: &str) -> ! {
    eprintln!("{}: {message}", label());
    std::process::exit(2)
}

#[derive(Default)]
struct Deliver {
    from: i64,
    to: i64,
    workers: usize,
    shuffle: Option<u64>,
    migrate: bool,
    wait: bool,
    repeat: bool,
}

struct Command {
    database_url: String,
    deliver: Option<Deliver>,
}

impl Command {
    fn parse(args: Vec<String>) -> Result<Command, String> {
        let program = args.first().cloned().unwrap_or_default();
        let mut label = std::path::Path::new(&program)
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut database_url = std::env::var("DATABASE_URL").ok();
        let mut deliver = None::<Deliver>;
        let mut verb = None;
        let mut args = args.into_iter().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
            match arg.as_str() {
                "--database-url" => database_url = Some(value("--database-url")?),
                "--label" => label = value("--label")?,
                "migrate" | "deliver" if verb.is_none() => {
                    verb = Some(arg.clone());
                    if arg == "deliver" {
                        deliver = Some(Deliver {
                            workers: 1,
                            ..Deliver::default()
                        });
                    }
                }
                option => {
                    let Some(deliver) = deliver.as_mut() else {
                        return Err(format!("unknown argument {option:?}"));
                    };
                    match option {
                        "--from" => deliver.from = number(option, &value(option)?)?,
                        "--to" => deliver.to = number(option, &value(option)?)?,
                        "--workers" => deliver.workers = number(option, &value(option)?)?,
                        "--shuffle" => deliver.shuffle = Some(number(option, &value(option)?)?),
                        "--migrate" => deliver.migrate = true,
                        "--wait" => deliver.wait = true,
                        "--repeat" => deliver.repeat = true,
                        _ => return Err(format!("unknown argument of deliver {option:?}")),
                    }
                }
            }
        }
        let _ = LABEL.set(label);
        if verb.is_none() {
            return Err("usage: [--database-url URL] [--label LABEL] migrate | deliver --from A --to B [--workers N] [--shuffle SEED] [--migrate] [--wait] [--repeat]".to_owned());
        }
        if deliver.as_ref().is_some_and(|deliver| deliver.workers == 0) {
            return Err("--workers must be at least 1".to_owned());
        }
        Ok(Command {
            database_url: database_url.ok_or("--database-url or DATABASE_URL is needed")?,
            deliver,
        })
    }

    async fn run(self, handlers: &'static [Handler]) -> Result<(), String> {
        let workers = self.deliver.as_ref().map_or(1, |deliver| deliver.workers);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(u32::try_from(workers).unwrap_or(u32::MAX).saturating_add(1))
            .connect(&self.database_url)
            .await
            .map_err(|error| format!("connect: {error}"))?;
        let idem = Idem::builder(pool)
            .build()
            .map_err(|error| format!("idem: {error}"))?;
        let Some(deliver) = self.deliver else {
            return migrate(&idem).await;
        };
        if deliver.migrate {
            migrate(&idem).await?;
        }
        let stdin = Stdin::start(deliver.wait || deliver.repeat);
        if deliver.wait {
            println!("{{\"ready\":true}}");
            stdin.go().await;
        }
        let mut facts: Vec<i64> = (deliver.from..deliver.to).collect();
        if let Some(seed) = deliver.shuffle {
            shuffle(&mut facts, seed);
        }
        let facts = Arc::new(facts);
        let counts = Arc::new(Mutex::new(Counts::new(handlers)));
        let mut passes = 0u64;
        loop {
            pass(&idem, handlers, &facts, deliver.workers, &counts).await;
            passes += 1;
            if !deliver.repeat || stdin.closed() {
                break;
            }
            println!("{{\"pass\":{passes}}}");
        }
        let counts = counts.lock().expect("counts").summary();
        println!("{{\"summary\":{counts},\"passes\":{passes}}}");
        Ok(())
    }
}

fn number<T: std::str::FromStr>(name: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{name} takes a number, not {text:?}"))
}

async fn migrate(idem: &Idem) -> Result<(), String> {
    idem.migrate()
        .await
        .map_err(|error| format!("migrate: {}", error_text(&error)))
}

/// Delivers every fact once to every handler, with `workers` concurrent tasks.
async fn pass(
    idem: &Idem,
    handlers: &'static [Handler],
    facts: &Arc<Vec<i64>>,
    workers: usize,
    counts: &Arc<Mutex<Counts>>,
) {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (idem, facts, next, counts) =
                (idem.clone(), facts.clone(), next.clone(), counts.clone());
            tokio::spawn(async move {
                while let Some(&fact) = facts.get(next.fetch_add(1, Ordering::Relaxed)) {
                    for (index, handler) in handlers.iter().enumerate() {
                        let ended = deliver(&idem, handler, fact).await;
                        counts.lock().expect("counts").add(index, ended);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a delivery task panicked");
    }
}

/// One fact to one handler, redelivered while the error's disposition is `Retry`.
async fn deliver(idem: &Idem, handler: &Handler, fact: i64) -> Ended {
    let mut deliveries = 0;
    loop {
        deliveries += 1;
        match (handler.deliver)(idem, fact).await {
            Delivery::Executed => return Ended::Executed,
            Delivery::Duplicate => return Ended::Duplicate,
            Delivery::Failed(Refusal::Retry, text) => {
                if deliveries >= MAX_DELIVERIES {
                    return Ended::RetryExhausted(text);
                }
                // Back off a little: what is retried is a lock wait or a rolled-back race.
                tokio::time::sleep(Duration::from_millis(u64::from(deliveries) * 10)).await;
            }
            Delivery::Failed(Refusal::Halt, text) => return Ended::Halt(text),
            Delivery::Failed(Refusal::DeadLetter, text) => return Ended::DeadLetter(text),
            Delivery::Failed(Refusal::Other, text) => return Ended::Other(text),
        }
    }
}

enum Ended {
    Executed,
    Duplicate,
    Halt(String),
    DeadLetter(String),
    RetryExhausted(String),
    Other(String),
}

/// The counts of one handler's deliveries, and the first error text of each kind.
#[derive(Default)]
struct HandlerCounts {
    executed: u64,
    duplicate: u64,
    halt: u64,
    dead_letter: u64,
    retry_exhausted: u64,
    other: u64,
    first: BTreeMap<&'static str, String>,
}

struct Counts(Vec<(&'static str, HandlerCounts)>);

impl Counts {
    fn new(handlers: &[Handler]) -> Counts {
        Counts(
            handlers
                .iter()
                .map(|handler| (handler.name, HandlerCounts::default()))
                .collect(),
        )
    }

    fn add(&mut self, handler: usize, ended: Ended) {
        let (name, counts) = &mut self.0[handler];
        let (kind, text) = match ended {
            Ended::Executed => {
                counts.executed += 1;
                return;
            }
            Ended::Duplicate => {
                counts.duplicate += 1;
                return;
            }
            Ended::Halt(text) => {
                counts.halt += 1;
                ("first_halt", text)
            }
            Ended::DeadLetter(text) => {
                counts.dead_letter += 1;
                ("first_dead_letter", text)
            }
            Ended::RetryExhausted(text) => {
                counts.retry_exhausted += 1;
                ("first_retry_exhausted", text)
            }
            Ended::Other(text) => {
                counts.other += 1;
                ("first_other", text)
            }
        };
        counts.first.entry(kind).or_insert_with(|| {
            // Also on stderr at once: a process that the test gives up waiting for says why.
            eprintln!("{}: {name}: {kind}: {text}", label());
            text
        });
    }

    /// The summary's JSON object: one member per handler.
    fn summary(&self) -> serde_json::Value {
        let mut summary = serde_json::Map::new();
        for (name, counts) in &self.0 {
            let mut handler = serde_json::json!({
                "executed": counts.executed,
                "duplicate": counts.duplicate,
                "halt": counts.halt,
                "dead_letter": counts.dead_letter,
                "retry_exhausted": counts.retry_exhausted,
                "other": counts.other,
            });
            for (kind, text) in &counts.first {
                handler[*kind] = serde_json::Value::from(text.as_str());
            }
            summary.insert((*name).to_owned(), handler);
        }
        serde_json::Value::Object(summary)
    }
}

/// The order a seed gives the facts: Fisher-Yates over splitmix64.
fn shuffle(facts: &mut [i64], seed: u64) {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for index in (1..facts.len()).rev() {
        let other = (next() % (index as u64 + 1)) as usize;
        facts.swap(index, other);
    }
}

/// The test's signals on stdin: a line says "go", the end of the input says "stop".
struct Stdin {
    go: watch::Receiver<bool>,
    closed: Arc<AtomicBool>,
}

impl Stdin {
    fn start(read: bool) -> Stdin {
        let (go_sender, go) = watch::channel(false);
        let closed = Arc::new(AtomicBool::new(false));
        if read {
            let closed = closed.clone();
            std::thread::spawn(move || {
                let mut lines = std::io::stdin().lines();
                while let Some(Ok(_)) = lines.next() {
                    let _ = go_sender.send(true);
                }
                closed.store(true, Ordering::SeqCst);
                let _ = go_sender.send(true);
            });
        }
        Stdin { go, closed }
    }

    /// Waits for the first line (or the end of the input).
    async fn go(&self) {
        let mut go = self.go.clone();
        let _ = go.wait_for(|go| *go).await;
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}
